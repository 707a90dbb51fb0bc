// imegen bench driver for llama.cpp's real SpacemiT IME1 Q4_0 kernels (imegen/perf/baselines/llama_cpp/).
//
// Builds Q4_0 weights (N rows of K/32 blocks: fp16 scale, 16 bytes of nibbles) and fp32 A from a fixed
// generator, repacks B with llama.cpp's own repack<block_q4_0, 32, 16> (repack.cpp, not counted), then runs
// the loop of llama_loop.cpp between the counting plugin's markers. argv: MODE M N K ARGS...
//   full  M N K NTH [DIR]  regions: quantize A for thread 0..NTH-1, then phase 2 (tasks) for 0..NTH-1;
//                          DIR: also write w.bin (the Q4_0 blocks), a.bin and c.bin for the NumPy check
//   quant M N K NTH        regions: quantize A for thread 0..NTH-1 only
//   task  M N K MC NC      region: one phase-2 task at row 0 / column 0 of MC rows x NC columns
// Prints one line per region, "emulated <vmadots>", then "checksum <sum of C>".
// Scaffolding: ggml_abort and ggml_nrows stand in for ggml.c (repack.cpp references them); the ggml_tensor
// passed to repack is the real struct from ggml.h with only type, ne and data set.
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"
#include "ggml.h"
#include "llama_loop.h"
#include "repack.h"

extern "C" {
#include "bench_markers.h"
#include "ime_emu.h"
}

void ggml_abort(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "llama driver: ggml_abort at %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

int64_t ggml_nrows(const struct ggml_tensor *t)
{
    return t->ne[1] * t->ne[2] * t->ne[3];
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng()
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static float uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rng() & 0xffffff) / 16777216.0f;
}

static void write_file(const std::string &path, const void *data, size_t bytes)
{
    FILE *f = fopen(path.c_str(), "wb");
    if (!f || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) {
        fprintf(stderr, "llama driver: cannot write %s\n", path.c_str());
        exit(2);
    }
}

static unsigned long region_begin()
{
    unsigned long before = imegen_ime_emu_count();
    imegen_bench_begin();
    return before;
}

static void region_end(unsigned long before)
{
    imegen_bench_end();
    printf("emulated %lu\n", imegen_ime_emu_count() - before);
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s full M N K NTH [DIR] | task M N K MC NC\n", argv[0]);
        return 2;
    }
    const std::string mode = argv[1];
    const int64_t M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]);
    if (M < 1 || N % 16 || K % QK4_0 || N < 16 || K < QK4_0) {
        fprintf(stderr, "llama driver: need M >= 1, N a multiple of 16, K a multiple of 32\n");
        return 2;
    }
    imegen_ime_emu_install();
    const int64_t kb = K / QK4_0;
    std::vector<block_q4_0> src(N * kb);
    for (block_q4_0 &b : src) {
        _Float16 d = (_Float16)uniform(0.001f, 0.01f);
        memcpy(&b.d, &d, sizeof b.d);
        for (uint8_t &q : b.qs)
            q = (uint8_t)rng();
    }
    std::vector<float> A(M * K);
    for (float &a : A)
        a = uniform(-1.0f, 1.0f);

    std::vector<uint8_t> packed(src.size() * sizeof(block_q4_0));
    ggml_tensor t{};
    t.type = GGML_TYPE_Q4_0;
    t.ne[0] = K, t.ne[1] = N, t.ne[2] = 1, t.ne[3] = 1;
    t.data = packed.data();
    if (ggml::cpu::riscv64_spacemit::repack<block_q4_0, 32, 16>(&t, src.data(), packed.size()) != 0) {
        fprintf(stderr, "llama driver: repack refused the shape\n");
        return 2;
    }
    std::vector<uint8_t> qa(M * llama_q8_row_stride(K) + 64);
    std::vector<float> C(M * N, 0.0f);

    if (mode == "full" || mode == "quant") {
        const int nth = atoi(argv[5]);
        for (int ith = 0; ith < nth; ith++) {
            unsigned long r = region_begin();
            llama_quantize_a(ith, nth, M, K, A.data(), qa.data());
            region_end(r);
        }
        for (int ith = 0; ith < nth && mode == "full"; ith++) {
            unsigned long r = region_begin();
            llama_gemm(ith, nth, M, N, K, packed.data(), qa.data(), C.data());
            region_end(r);
        }
        if (argc > 6) {
            const std::string dir = argv[6];
            write_file(dir + "/w.bin", src.data(), src.size() * sizeof(block_q4_0));
            write_file(dir + "/a.bin", A.data(), A.size() * sizeof(float));
            write_file(dir + "/c.bin", C.data(), C.size() * sizeof(float));
        }
    } else if (mode == "task") {
        const int64_t mc = atoll(argv[5]), nc = argc > 6 ? atoll(argv[6]) : 0;
        if (mc < 1 || mc > M || nc < 1 || nc > N) {
            fprintf(stderr, "llama driver: task MC NC must fit in M N\n");
            return 2;
        }
        llama_quantize_a(0, 1, M, K, A.data(), qa.data());
        unsigned long r = region_begin();
        llama_task(M, N, K, 0, mc, 0, nc, packed.data(), qa.data(), C.data());
        region_end(r);
    } else {
        fprintf(stderr, "llama driver: unknown mode %s\n", mode.c_str());
        return 2;
    }
    double checksum = 0.0;
    for (float c : C)
        checksum += c;
    printf("checksum %.9g\n", checksum);
    return 0;
}
