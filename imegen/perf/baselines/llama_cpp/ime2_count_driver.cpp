// Counting driver for llama.cpp's Q4_0 path on the K3 (imegen/perf/baselines/llama_cpp/ime2_counts.py): the
// A quantizer and gemm entry point ime.cpp picks for a Q4_0 weight on IME2 (K a multiple of 256:
// quantize_a_*row_i8_hp + gemm_kernel_i8i4_hp, blocks of 256; else quantize_a_*row_i8 + gemm_kernel_i8i4,
// blocks of 32), run between the counting plugin's markers under qemu-riscv64 at VLEN 1024 with imegen's
// IME2 emulator.
//   argv: KERNEL M N K [DIR]      KERNEL i8i4 | i8i4hp
// A (M x K fp32, uniform in [-1, 1)) and B (random codes, fp16 scales in [-0.02, 0.02), already in the
// kernels' 32-column layout: per group of 32 columns and 32-code block, 32 fp16 scales then 512 bytes of
// nibbles; i8i4_hp reads 8 such blocks as one super-block) come from a fixed generator. Rows go in groups
// as ime.cpp walks them: 4 while 4 are left, else 1. Regions: one per row group quantizing its rows, then one
// per row group calling the entry point on all N columns. Prints per region "emulated" and the IME2
// instructions the emulator ran in it by kind (ime2_emu.h's order), then "checksum <sum of C>". DIR: also
// writes a.bin (A as the kernels read it), b.bin, c.bin (M x N fp32) and af.bin (A in fp32) for the NumPy check.
// ggml_abort and the ggml_* stand-ins satisfy rvv_kernels.cpp's references; none of them runs here.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml.h"
#include "ime_kernels.h"
#include "rvv_kernels.h"

extern "C" {
#include "bench_markers.h"
#include "ime2_emu.h"
}

void ggml_abort(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ime2 count driver: ggml_abort at %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static void not_here(const char *what)
{
    fprintf(stderr, "ime2 count driver: %s called\n", what);
    exit(2);
}

bool ggml_are_same_shape(const struct ggml_tensor *, const struct ggml_tensor *)
{
    not_here("ggml_are_same_shape");
    return false;
}

bool ggml_can_repeat(const struct ggml_tensor *, const struct ggml_tensor *)
{
    not_here("ggml_can_repeat");
    return false;
}

int64_t ggml_nelements(const struct ggml_tensor *)
{
    not_here("ggml_nelements");
    return 0;
}

int64_t ggml_nrows(const struct ggml_tensor *)
{
    not_here("ggml_nrows");
    return 0;
}

size_t ggml_type_size(enum ggml_type)
{
    not_here("ggml_type_size");
    return 0;
}

namespace {

uint64_t rng_state = 0x9e3779b97f4a7c15ull;

uint32_t rng()
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

float uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rng() & 0xffffff) / 16777216.0f;
}

struct path {
    size_t blk_len, a_row_bytes;  // K block and bytes per row and block of the quantized A
    void (*quant1)(size_t, const float *, size_t, uint8_t *);
    void (*quant4)(size_t, const float *, size_t, uint8_t *);
    size_t (*gemm)(size_t, const uint8_t *, const uint8_t *, const uint8_t *, float *, size_t, size_t, size_t, size_t);
};

void emit(const char *name, const std::string &dir, const void *data, size_t bytes)
{
    FILE *f = fopen((dir + "/" + name).c_str(), "wb");
    if (!f || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) {
        perror(name);
        exit(2);
    }
}

void kinds_line(const unsigned long before[IMEGEN_IME2_KINDS])
{
    unsigned long total = 0, now[IMEGEN_IME2_KINDS];
    for (int k = 0; k < IMEGEN_IME2_KINDS; k++)
        total += now[k] = imegen_ime2_emu_count_kind(k) - before[k];
    printf("emulated %lu", total);
    for (int k = 0; k < IMEGEN_IME2_KINDS; k++)
        printf(" %lu", now[k]);
    printf("\n");
}

void snapshot(unsigned long out[IMEGEN_IME2_KINDS])
{
    for (int k = 0; k < IMEGEN_IME2_KINDS; k++)
        out[k] = imegen_ime2_emu_count_kind(k);
}

}  // namespace

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: %s i8i4|i8i4hp M N K [DIR]\n", argv[0]);
        return 2;
    }
    namespace sk = spacemit_kernels;
    const std::string kernel = argv[1];
    const size_t      M = strtoul(argv[2], nullptr, 10), N = strtoul(argv[3], nullptr, 10);
    const size_t      K = strtoul(argv[4], nullptr, 10);
    const path        i8i4 = { 32, sk::q8_blk_size(32, true), sk::rvv::quantize_a_row_i8, sk::rvv::quantize_a_4row_i8,
                               sk::ime2::gemm_kernel_i8i4 };
    const path        hp = { 256, sk::q8_hp_blk_size(256, true, true), sk::rvv::quantize_a_row_i8_hp,
                             sk::rvv::quantize_a_4row_i8_hp, sk::ime2::gemm_kernel_i8i4_hp };
    if (kernel != "i8i4" && kernel != "i8i4hp") {
        fprintf(stderr, "ime2 count driver: unknown kernel %s\n", kernel.c_str());
        return 2;
    }
    const path &p = kernel == "i8i4" ? i8i4 : hp;
    if (M == 0 || N == 0 || N % 32 || K % p.blk_len) {
        fprintf(stderr, "ime2 count driver: N must be a multiple of 32 and K of %zu\n", p.blk_len);
        return 2;
    }
    const size_t k_blks = K / p.blk_len, blocks32 = K / 32;

    std::vector<float> a(M * K);
    for (float &x : a)
        x = uniform(-1.0f, 1.0f);
    std::vector<uint8_t> b(N / 32 * blocks32 * (64 + 512));
    for (size_t i = 0; i < b.size(); i += 576) {
        _Float16 *scales = reinterpret_cast<_Float16 *>(&b[i]);
        for (int c = 0; c < 32; c++)
            scales[c] = static_cast<_Float16>(uniform(-0.02f, 0.02f));
        for (int j = 64; j < 576; j++)
            b[i + j] = (uint8_t)rng();
    }
    std::vector<uint8_t> qa(M * k_blks * p.a_row_bytes);
    std::vector<float>   c(M * N, -12345.0f);
    std::vector<size_t>  groups;
    for (size_t m = 0; m < M; m += groups.back())
        groups.push_back(M - m >= 4 ? 4 : 1);

    imegen_ime2_emu_install();
    unsigned long before[IMEGEN_IME2_KINDS];
    size_t        m = 0, off = 0;
    for (size_t g : groups) {
        snapshot(before);
        imegen_bench_begin();
        (g == 4 ? p.quant4 : p.quant1)(p.blk_len, &a[m * K], K, &qa[off]);
        imegen_bench_end();
        kinds_line(before);
        m += g, off += g * k_blks * p.a_row_bytes;
    }
    m = 0, off = 0;
    for (size_t g : groups) {
        snapshot(before);
        imegen_bench_begin();
        const size_t rows = p.gemm(p.blk_len, &qa[off], b.data(), nullptr, &c[m * N], M - m, N, k_blks, N);
        imegen_bench_end();
        kinds_line(before);
        if (rows != g) {
            fprintf(stderr, "ime2 count driver: the kernel took %zu rows, expected %zu\n", rows, g);
            return 2;
        }
        m += g, off += g * k_blks * p.a_row_bytes;
    }
    double checksum = 0.0;
    for (float x : c)
        checksum += x;
    printf("checksum %.9g\n", checksum);
    if (argc == 6) {
        const std::string dir = argv[5];
        emit("a.bin", dir, qa.data(), qa.size());
        emit("b.bin", dir, b.data(), b.size());
        emit("c.bin", dir, c.data(), c.size() * sizeof(float));
        emit("af.bin", dir, a.data(), a.size() * sizeof(float));
    }
    return 0;
}
