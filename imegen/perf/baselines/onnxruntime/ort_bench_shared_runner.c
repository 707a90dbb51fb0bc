/* Counted Runs with outputs written into inputs' buffers, as onnxruntime-genai runs its KV cache with
 * past_present_share_buffer (imegen.perf.baselines.onnxruntime.shared_runs; runs under qemu-riscv64).
 *
 * genai hands Run the very OrtValue it feeds as past_key_values.N.key as the pre-allocated present.N.key
 * output, so ORT writes the present into the past's own max-length buffer (its GroupQueryAttention then sees
 * present == past and writes only the new tokens). This runner does the same: everything else is
 * ort_bench_runner.c's (argv, markers, warm-up Run, the probe run, the output file); its FEEDS_FILE has, after
 * ort_bench_runner.c's content, u32 n_shared, (string output, string input)[n_shared]. An output shared with an
 * input is pre-allocated as that input's OrtValue for every Run (ORT fails the Run if it cannot write it there). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_markers.h"
#include "onnxruntime_c_api.h"

static const OrtApi *ort;

_Noreturn static void die(const char *what) {
    fprintf(stderr, "ort_bench_shared_runner: %s\n", what);
    exit(3);
}

static void must(OrtStatus *st) {
    if (st) die(ort->GetErrorMessage(st));
}

static void get(FILE *f, void *p, size_t n) {
    if (n && fread(p, 1, n, f) != n) die("feeds file truncated");
}
static uint32_t get_u32(FILE *f) { uint32_t v; get(f, &v, 4); return v; }
static char *get_string(FILE *f) {
    uint32_t n = get_u32(f);
    char *s = malloc(n + 1);
    if (!s) die("out of memory");
    get(f, s, n);
    s[n] = 0;
    return s;
}
static void put(FILE *f, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, f) != n) die("write failed");
}

static size_t element_size(ONNXTensorElementDataType t) {
    switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return 1;
    default: die("unsupported output element type");
    }
}

static void put_tensor(FILE *f, const char *name, OrtValue *v) {
    OrtTensorTypeAndShapeInfo *info;
    ONNXTensorElementDataType t;
    size_t rank, count;
    void *data;
    int64_t dims[16];
    must(ort->GetTensorTypeAndShape(v, &info));
    must(ort->GetTensorElementType(info, &t));
    must(ort->GetDimensionsCount(info, &rank));
    if (rank > 16) die("rank > 16");
    must(ort->GetTensorShapeElementCount(info, &count));
    must(ort->GetDimensions(info, dims, rank));
    ort->ReleaseTensorTypeAndShapeInfo(info);
    must(ort->GetTensorMutableData(v, &data));
    uint32_t n = (uint32_t)strlen(name), type = (uint32_t)t, r = (uint32_t)rank;
    uint64_t nbytes = (uint64_t)count * element_size(t);
    put(f, &n, 4), put(f, name, n), put(f, &type, 4), put(f, &r, 4);
    put(f, dims, rank * sizeof(int64_t)), put(f, &nbytes, 8), put(f, data, nbytes);
}

static void print_exec_maps(void) {
    FILE *m = fopen("/proc/self/maps", "r");
    char line[4096];
    if (!m) die("cannot read /proc/self/maps");
    while (fgets(line, sizeof line, m)) {
        unsigned long lo, hi, off;
        char perms[8], path[4000] = "";
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %3999[^\n]", &lo, &hi, perms, &off, path) >= 4)
            printf("map %lx %lx %s %lx %s\n", lo, hi, perms, off, path[0] ? path : "-");
    }
    fclose(m);
    fflush(stdout);
}

static int index_of(char **names, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return (int)i;
    return -1;
}

/* shared[i]: the feed output i is written into, or NULL. */
static OrtValue **read_sharing(FILE *f, char **names, OrtValue **feeds, uint32_t n_feeds, char **wanted,
                               uint32_t n_out) {
    OrtValue **shared = calloc(n_out + 1, sizeof(OrtValue *));
    const uint32_t n = get_u32(f);
    for (uint32_t i = 0; i < n; i++) {
        char *output = get_string(f), *input = get_string(f);
        const int o = index_of(wanted, n_out, output), k = index_of(names, n_feeds, input);
        if (o < 0 || k < 0) die("a shared output is not wanted or its input not fed");
        shared[o] = feeds[k];
        free(output), free(input);
    }
    return shared;
}

int main(int argc, char **argv) {
    if (argc != 8) die("usage: ort_bench_shared_runner ORT_LIBRARY MODEL CUSTOM_OPS|- THREADS RUNS FEEDS OUTPUT");
    const int custom = strcmp(argv[3], "-") != 0, runs = atoi(argv[5]);
    if (custom && !dlopen(argv[3], RTLD_NOW | RTLD_LOCAL)) die(dlerror());
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!lib) die(dlerror());
    const OrtApiBase *(*get_base)(void) = (const OrtApiBase *(*)(void))dlsym(lib, "OrtGetApiBase");
    if (!get_base || !(ort = get_base()->GetApi(ORT_API_VERSION))) die("no OrtGetApiBase / API version");

    OrtEnv *env;
    OrtSessionOptions *opts;
    OrtSession *session;
    OrtMemoryInfo *mem;
    must(ort->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "imegen-bench", &env));
    must(ort->CreateSessionOptions(&opts));
    must(ort->SetIntraOpNumThreads(opts, atoi(argv[4])));
    must(ort->AddSessionConfigEntry(opts, "session.intra_op.allow_spinning", "0"));
    if (custom) must(ort->RegisterCustomOpsLibrary_V2(opts, argv[3]));
    must(ort->CreateSession(env, argv[2], opts, &session));
    must(ort->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &mem));

    FILE *f = fopen(argv[6], "rb");
    if (!f) die("cannot open the feeds file");
    uint32_t n_feeds = get_u32(f);
    char **names = calloc(n_feeds + 1, sizeof(char *));
    OrtValue **feeds = calloc(n_feeds + 1, sizeof(OrtValue *));
    for (uint32_t i = 0; i < n_feeds; i++) {
        names[i] = get_string(f);
        uint32_t t = get_u32(f), rank = get_u32(f);
        int64_t dims[16] = {0};
        uint64_t nbytes;
        if (rank > 16) die("rank > 16");
        get(f, dims, rank * sizeof(int64_t));
        get(f, &nbytes, 8);
        void *buf = malloc(nbytes + 1);
        if (!buf) die("out of memory");
        get(f, buf, nbytes);
        must(ort->CreateTensorWithDataAsOrtValue(mem, buf, nbytes, dims, rank, (ONNXTensorElementDataType)t, &feeds[i]));
    }
    uint32_t n_out = get_u32(f);
    char **wanted = calloc(n_out + 1, sizeof(char *));
    for (uint32_t i = 0; i < n_out; i++) wanted[i] = get_string(f);
    OrtValue **shared = read_sharing(f, names, feeds, n_feeds, wanted, n_out);
    fclose(f);
    OrtValue **outs = calloc(n_out + 1, sizeof(OrtValue *));

    print_exec_maps();
    if (runs < 0) return 0; /* the probe run: mappings only */
    for (int r = -1; r < runs; r++) { /* r = -1: the uncounted warm-up Run */
        for (uint32_t i = 0; i < n_out; i++)
            if (shared[i]) outs[i] = shared[i]; /* pre-allocated: ORT writes into the input's buffer */
        if (r >= 0) imegen_bench_begin();
        OrtStatus *st = ort->Run(session, NULL, (const char *const *)names, (const OrtValue *const *)feeds, n_feeds,
                                 (const char *const *)wanted, n_out, outs);
        if (r >= 0) imegen_bench_end();
        must(st);
        if (r + 1 < runs)
            for (uint32_t i = 0; i < n_out; i++)
                if (!shared[i]) ort->ReleaseValue(outs[i]), outs[i] = NULL;
    }
    FILE *o = fopen(argv[7], "wb");
    if (!o) die("cannot write the output file");
    put(o, &n_out, 4);
    for (uint32_t i = 0; i < n_out; i++) put_tensor(o, wanted[i], outs[i]);
    if (fclose(o) != 0) die("cannot write the output file");
    return 0;
}
