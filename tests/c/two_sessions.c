/* Two ORT sessions in one process, each registering imegen's custom-op library with a different
 * IMEGEN_IME_HARTS, then a Run of the first (tests/test_serving.py). The library reads the harts once per
 * process: the first session must keep running on what it was packed for, never crash.
 * Usage: two_sessions LIBONNXRUNTIME MODEL CUSTOM_OPS_LIBRARY HARTS_A HARTS_B K N; prints Y[0..N). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "onnxruntime_c_api.h"

static const OrtApi *ort;

static void check(OrtStatus *status, const char *what) {
    if (status) {
        fprintf(stderr, "%s: %s\n", what, ort->GetErrorMessage(status));
        exit(1);
    }
}

static OrtSession *session(OrtEnv *env, const char *model, const char *library, const char *harts) {
    OrtSessionOptions *options;
    OrtSession *s;
    setenv("IMEGEN_IME_HARTS", harts, 1);
    check(ort->CreateSessionOptions(&options), "session options");
    check(ort->SetIntraOpNumThreads(options, 2), "threads");
    check(ort->RegisterCustomOpsLibrary_V2(options, library), "register");
    check(ort->CreateSession(env, model, options, &s), "session");
    ort->ReleaseSessionOptions(options);
    return s;
}

int main(int argc, char **argv) {
    if (argc != 8) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) return fprintf(stderr, "%s\n", dlerror()), 1;
    const OrtApiBase *(*base)(void) = (const OrtApiBase *(*)(void))dlsym(lib, "OrtGetApiBase");
    ort = base()->GetApi(ORT_API_VERSION);
    OrtEnv *env;
    check(ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "two_sessions", &env), "env");
    OrtSession *first = session(env, argv[2], argv[3], argv[4]);
    OrtSession *second = session(env, argv[2], argv[3], argv[5]);
    const int64_t K = atoll(argv[6]), N = atoll(argv[7]);
    float *A = malloc((size_t)K * sizeof *A);
    for (int64_t k = 0; k < K; k++) A[k] = (float)((k * 37) % 17) / 17.0f - 0.5f;
    OrtMemoryInfo *memory;
    check(ort->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &memory), "memory info");
    const int64_t dims[2] = {1, K};
    OrtValue *in = NULL, *out = NULL;
    check(ort->CreateTensorWithDataAsOrtValue(memory, A, (size_t)K * sizeof *A, dims, 2,
                                              ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &in), "input");
    const char *in_name = "A", *out_name = "Y";
    check(ort->Run(first, NULL, &in_name, (const OrtValue *const *)&in, 1, &out_name, 1, &out), "run");
    float *Y;
    check(ort->GetTensorMutableData(out, (void **)&Y), "output");
    for (int64_t n = 0; n < N; n++) printf("%.9g\n", Y[n]);
    ort->ReleaseSession(second);
    ort->ReleaseSession(first);
    return 0;
}
