/* A persistent onnxruntime session for imegen.ort.riscv.RiscvSession (runs under qemu-riscv64).
 *
 * argv: ORT_LIBRARY MODEL CUSTOM_OPS_LIBRARY|- INTRA_OP_THREADS
 * Binary protocol on stdin/stdout, little-endian (stdout is reserved for it: fd 1 is redirected
 * to stderr, where ORT logs go):
 *   string  = u32 length, bytes
 *   tensor  = string name, u32 ONNX element type, u32 rank, i64 dims[rank], u64 nbytes, data
 *   startup reply: u8 0, u32 n_inputs, string[n], u32 n_outputs, string[n] | u8 1, string error
 *   request 'R': u32 n_feeds, tensor[n], u32 n_wanted, string[n] (0: all outputs),
 *                u32 n_shared, (string output, string input)[n]
 *     reply: u8 0, u32 n, tensor[n] | u8 1, string error
 *     With shared pairs the run goes through an IoBinding, as onnxruntime-genai runs a model: each pair's output
 *     is bound to that input's own buffer (genai's past_present_share_buffer KV cache: ORT's GroupQueryAttention
 *     then sees present == past), the other outputs to CPU memory; the reply holds the bound buffers' contents.
 *   request 'S': reply u8 0, string (the custom-op library's imegen_ort_stats(), "" without)
 * EOF on stdin ends the process. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "onnxruntime_c_api.h"

static const OrtApi *ort;
static FILE *in, *out;

_Noreturn static void die(const char *what) {
    fprintf(stderr, "ort_runner: %s\n", what);
    exit(3);
}

/* An ORT call that cannot fail on a valid session (names, tensor metadata). */
static void must(OrtStatus *st) {
    if (st) die(ort->GetErrorMessage(st));
}

static void get(void *p, size_t n) {
    if (n && fread(p, 1, n, in) != n) exit(0); /* EOF: the client closed the session */
}
static void put(const void *p, size_t n) {
    if (n && fwrite(p, 1, n, out) != n) die("write failed");
}
static uint32_t get_u32(void) { uint32_t v; get(&v, 4); return v; }
static void put_u32(uint32_t v) { put(&v, 4); }
static void put_u8(uint8_t v) { put(&v, 1); }
static char *get_string(void) {
    uint32_t n = get_u32();
    char *s = malloc(n + 1);
    if (!s) die("out of memory");
    get(s, n);
    s[n] = 0;
    return s;
}
static void put_string(const char *s) {
    put_u32((uint32_t)strlen(s));
    put(s, strlen(s));
}

/* Reply with ORT's error and report whether there was one. */
static int failed(OrtStatus *st) {
    if (!st) return 0;
    put_u8(1);
    put_string(ort->GetErrorMessage(st));
    fflush(out);
    ort->ReleaseStatus(st);
    return 1;
}
#define CHECK(call) do { if (failed(call)) goto done; } while (0)

static size_t element_size(uint32_t t) {
    switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return 1;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return 2;
    default: return 0;
    }
}

static void put_tensor(const char *name, OrtValue *v) {
    OrtTensorTypeAndShapeInfo *info;
    ONNXTensorElementDataType t;
    size_t rank, count;
    void *data;
    must(ort->GetTensorTypeAndShape(v, &info));
    must(ort->GetTensorElementType(info, &t));
    must(ort->GetDimensionsCount(info, &rank));
    must(ort->GetTensorShapeElementCount(info, &count));
    must(ort->GetTensorMutableData(v, &data));
    int64_t *dims = calloc(rank + 1, sizeof(int64_t));
    must(ort->GetDimensions(info, dims, rank));
    ort->ReleaseTensorTypeAndShapeInfo(info);
    uint64_t nbytes = (uint64_t)count * element_size(t);
    put_string(name);
    put_u32(t);
    put_u32((uint32_t)rank);
    put(dims, rank * sizeof(int64_t));
    put(&nbytes, 8);
    put(data, nbytes);
    free(dims);
}

static OrtStatus *refuse(const char *what, const char *name) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s: %s", what, name);
    return ort->CreateStatus(ORT_INVALID_ARGUMENT, msg);
}

static int index_of(char **names, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return (int)i;
    return -1;
}

struct sharing {
    uint32_t n;
    char **outputs, **inputs; /* outputs[i] is written into inputs[i]'s buffer */
};

/* One Run through an IoBinding: the feeds bound as inputs, each wanted output bound to its shared input's
 * OrtValue or else to CPU memory; outs[i] receives wanted[i]. A shared output ORT did not write in place fails. */
static OrtStatus *run_bound(OrtSession *session, OrtMemoryInfo *mem, OrtAllocator *alloc, char **names,
                            OrtValue **feeds, uint32_t n_feeds, char **wanted, size_t n, const struct sharing *sh,
                            OrtValue **outs) {
    OrtIoBinding *b = NULL;
    OrtValue **values = NULL;
    size_t count = 0;
    OrtStatus *st = ort->CreateIoBinding(session, &b);
    for (uint32_t i = 0; !st && i < sh->n; i++) {
        if (index_of(names, n_feeds, sh->inputs[i]) < 0) st = refuse("shared input is not fed", sh->inputs[i]);
        else if (index_of(wanted, n, sh->outputs[i]) < 0) st = refuse("shared output is not run", sh->outputs[i]);
    }
    for (uint32_t i = 0; !st && i < n_feeds; i++) st = ort->BindInput(b, names[i], feeds[i]);
    for (size_t i = 0; !st && i < n; i++) {
        const int s = index_of(sh->outputs, sh->n, wanted[i]);
        st = s < 0 ? ort->BindOutputToDevice(b, wanted[i], mem)
                   : ort->BindOutput(b, wanted[i], feeds[index_of(names, n_feeds, sh->inputs[s])]);
    }
    if (!st) st = ort->RunWithBinding(session, NULL, b);
    if (!st) st = ort->GetBoundOutputValues(b, alloc, &values, &count);
    if (!st && count != n) st = refuse("the binding returned another number of outputs than bound", "");
    for (size_t i = 0; i < count; i++)
        if (i < n) outs[i] = values[i];
        else ort->ReleaseValue(values[i]);
    for (uint32_t i = 0; !st && i < sh->n; i++) {
        void *out_data, *in_data;
        must(ort->GetTensorMutableData(outs[index_of(wanted, n, sh->outputs[i])], &out_data));
        must(ort->GetTensorMutableData(feeds[index_of(names, n_feeds, sh->inputs[i])], &in_data));
        if (out_data != in_data) st = refuse("onnxruntime did not write the shared output in place", sh->outputs[i]);
    }
    if (values) must(ort->AllocatorFree(alloc, values));
    if (b) ort->ReleaseIoBinding(b);
    return st;
}

static void serve_run(OrtSession *session, OrtMemoryInfo *mem, OrtAllocator *alloc, size_t n_out, char **out_names) {
    uint32_t n_feeds = get_u32();
    char **names = calloc(n_feeds + 1, sizeof(char *));
    void **buffers = calloc(n_feeds + 1, sizeof(void *));
    OrtValue **feeds = calloc(n_feeds + 1, sizeof(OrtValue *));
    int bad = 0;
    for (uint32_t i = 0; i < n_feeds; i++) {
        names[i] = get_string();
        uint32_t t = get_u32(), rank = get_u32();
        int64_t dims[16] = {0};
        if (rank > 16) die("rank > 16");
        get(dims, rank * sizeof(int64_t));
        uint64_t nbytes;
        get(&nbytes, 8);
        buffers[i] = malloc(nbytes + 1);
        get(buffers[i], nbytes);
        if (!bad && failed(ort->CreateTensorWithDataAsOrtValue(mem, buffers[i], nbytes, dims, rank,
                                                               (ONNXTensorElementDataType)t, &feeds[i])))
            bad = 1;
    }
    uint32_t n_wanted = get_u32();
    char **wanted = n_wanted ? calloc(n_wanted, sizeof(char *)) : out_names;
    for (uint32_t i = 0; i < n_wanted; i++) wanted[i] = get_string();
    struct sharing sh = {get_u32(), NULL, NULL};
    sh.outputs = calloc(sh.n + 1, sizeof(char *)), sh.inputs = calloc(sh.n + 1, sizeof(char *));
    for (uint32_t i = 0; i < sh.n; i++) sh.outputs[i] = get_string(), sh.inputs[i] = get_string();
    size_t n = n_wanted ? n_wanted : n_out;
    OrtValue **outs = calloc(n + 1, sizeof(OrtValue *));
    OrtStatus *st = NULL;
    if (!bad)
        st = sh.n ? run_bound(session, mem, alloc, names, feeds, n_feeds, wanted, n, &sh, outs)
                  : ort->Run(session, NULL, (const char *const *)names, (const OrtValue *const *)feeds, n_feeds,
                             (const char *const *)wanted, n, outs);
    if (!bad && !failed(st)) {
        put_u8(0);
        put_u32((uint32_t)n);
        for (size_t i = 0; i < n; i++) put_tensor(wanted[i], outs[i]);
        fflush(out);
    }
    for (size_t i = 0; i < n; i++)
        if (outs[i]) ort->ReleaseValue(outs[i]);
    for (uint32_t i = 0; i < sh.n; i++) free(sh.outputs[i]), free(sh.inputs[i]);
    free(sh.outputs), free(sh.inputs);
    for (uint32_t i = 0; i < n_feeds; i++) {
        if (feeds[i]) ort->ReleaseValue(feeds[i]);
        free(buffers[i]);
        free(names[i]);
    }
    for (uint32_t i = 0; i < n_wanted; i++) free(wanted[i]);
    if (n_wanted) free(wanted);
    free(names), free(buffers), free(feeds), free(outs);
}

int main(int argc, char **argv) {
    if (argc != 5) die("usage: ort_runner ORT_LIBRARY MODEL CUSTOM_OPS|- THREADS");
    int proto = dup(1);
    if (proto < 0 || dup2(2, 1) < 0) die("cannot set up the protocol descriptor");
    in = stdin;
    out = fdopen(proto, "wb");
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!lib) die(dlerror());
    const OrtApiBase *(*get_base)(void) = (const OrtApiBase *(*)(void))dlsym(lib, "OrtGetApiBase");
    if (!get_base || !(ort = get_base()->GetApi(ORT_API_VERSION))) die("no OrtGetApiBase / API version");

    OrtEnv *env = NULL;
    OrtSessionOptions *opts = NULL;
    OrtSession *session = NULL;
    OrtMemoryInfo *mem = NULL;
    OrtAllocator *alloc = NULL;
    const char *(*stats)(void) = NULL;
    size_t n_in = 0, n_out = 0;
    char **out_names = NULL;
    CHECK(ort->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "imegen", &env));
    CHECK(ort->CreateSessionOptions(&opts));
    CHECK(ort->SetIntraOpNumThreads(opts, atoi(argv[4])));
    if (strcmp(argv[3], "-") != 0) {
        CHECK(ort->RegisterCustomOpsLibrary_V2(opts, argv[3]));
        void *custom = dlopen(argv[3], RTLD_NOW | RTLD_NOLOAD);
        if (custom) stats = (const char *(*)(void))dlsym(custom, "imegen_ort_stats");
    }
    CHECK(ort->CreateSession(env, argv[2], opts, &session));
    CHECK(ort->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &mem));
    CHECK(ort->GetAllocatorWithDefaultOptions(&alloc));
    CHECK(ort->SessionGetInputCount(session, &n_in));
    CHECK(ort->SessionGetOutputCount(session, &n_out));
    out_names = calloc(n_out + 1, sizeof(char *));
    put_u8(0);
    put_u32((uint32_t)n_in);
    for (size_t i = 0; i < n_in; i++) {
        char *name;
        must(ort->SessionGetInputName(session, i, alloc, &name));
        put_string(name);
        must(ort->AllocatorFree(alloc, name));
    }
    put_u32((uint32_t)n_out);
    for (size_t i = 0; i < n_out; i++) {
        char *name;
        must(ort->SessionGetOutputName(session, i, alloc, &name));
        out_names[i] = strdup(name);
        put_string(name);
        must(ort->AllocatorFree(alloc, name));
    }
    fflush(out);
    for (;;) {
        uint8_t request;
        get(&request, 1);
        if (request == 'R') {
            serve_run(session, mem, alloc, n_out, out_names);
        } else if (request == 'S') {
            put_u8(0);
            put_string(stats ? stats() : "");
            fflush(out);
        } else {
            die("unknown request");
        }
    }
done:
    return 0;
}
