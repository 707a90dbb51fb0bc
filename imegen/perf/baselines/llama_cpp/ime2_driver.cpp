// Driver for the IME2 peer check (imegen/perf/baselines/llama_cpp/ime2.py): runs one of llama.cpp's SpacemiT
// IME2 gemm entry points (ime2_kernels.cpp, translated at build time) under imegen's IME2 emulator on data the
// Python side wrote, the way ime.cpp walks the rows: call the entry point with the rows left, advance by the
// rows it reports (4 while 4 or more are left, else 1); one group of 32 columns per call.
//   argv: KERNEL M N K_BLKS BLK_LEN DIR
//   DIR/a.bin: the quantized A row groups, each in its kernel's layout, one after another
//   DIR/b.bin: the repacked B (32-column groups);  writes DIR/c.bin (M x N fp32, ldc = N)
// Prints "rows <r>" per call and "emulated <IME2 instructions>". ggml_abort stands in for ggml.c's (the
// kernels' asserts reference it).
//
// MoE (KERNEL moe_i8i4, moe_i8i4zp, moe_i8i5, moe_i8i5zp): ime.cpp's expert walk. M is the number of C rows
// (one per token and expert slot); a.bin holds one quantized A row per token (k_blks blocks of scale, sum, 32
// codes, as quantize_a_row_i8 writes it), b.bin every expert's B one after another, DIR/calls.txt the calls in
// order: "2 E A0 A1 C0 C1" runs moe_m2_gemm_kernel_* on expert E's B with token rows A0, A1 into C rows C0, C1
// (all N columns in one call, as ime.cpp passes them); "1 E A0 C0" runs the rows left over through the
// expert's gemm_kernel_* (count_m 1: the m1 path), one group of 32 columns per call.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml.h"
#include "ime_kernels.h"

extern "C" {
#include "ime2_emu.h"
}

void ggml_abort(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ime2 driver: ggml_abort at %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

namespace {

using entry_fn = size_t (*)(size_t, const uint8_t *, const uint8_t *, const uint8_t *, float *, size_t, size_t,
                            size_t, size_t);

using moe_fn = size_t (*)(size_t, const uint8_t **, const uint8_t *, const uint8_t *, float **, size_t, size_t,
                          size_t, size_t);

struct entry {
    const char *name;
    entry_fn    fn;
    size_t      a_row_bytes_per_blk;  // bytes per row and k block in the A layout (scale, sum, blk_len codes)
    size_t      b_col_bytes_per_blk;  // bytes per column and k block in the B layout (scale, blk_len codes)
    bool        zp_flag;              // pass a non-null quant_b_zp: i8i5 then reads Q5_1 blocks (zero points
                                      // inside B), else Q5_0; no kernel reads through the pointer
};

struct moe_entry {
    const char *name;
    moe_fn      pair;                 // the two-row MoE entry point
    entry_fn    single;               // what ime.cpp runs a leftover row through
    size_t      b_col_bytes_per_blk;  // bytes per column and k block of one expert's B
    bool        zp_flag;              // non-null quant_b_zp: Q4_1 / Q5_1 blocks (zero points inside B)
};

std::vector<uint8_t> read_file(const std::string &path)
{
    FILE *f = fopen(path.c_str(), "rb");
    if (!f) {
        perror(path.c_str());
        exit(2);
    }
    std::vector<uint8_t> data;
    uint8_t              buf[65536];
    size_t               n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        data.insert(data.end(), buf, buf + n);
    fclose(f);
    return data;
}

// The end of a run: the emulated IME2 instruction count on stdout, C to DIR/c.bin; returns the exit status.
int finish(const std::vector<float> &c, const std::string &dir)
{
    printf("emulated %lu\n", imegen_ime2_emu_count());
    FILE *f = fopen((dir + "/c.bin").c_str(), "wb");
    if (!f || fwrite(c.data(), sizeof(float), c.size(), f) != c.size() || fclose(f) != 0) {
        perror("c.bin");
        return 2;
    }
    return 0;
}

// ime.cpp's MoE walk over DIR/calls.txt (see the head of this file); returns the exit status.
int run_moe(const moe_entry &e, size_t M, size_t N, size_t k_blks, size_t blk_len, const std::string &dir)
{
    const size_t         a_row = k_blks * (sizeof(float) + sizeof(int16_t) + blk_len);  // q8_blk_size(32, true)
    const size_t         expert_bytes = N * k_blks * e.b_col_bytes_per_blk;
    std::vector<uint8_t> a = read_file(dir + "/a.bin"), b = read_file(dir + "/b.bin");
    if (a.empty() || a.size() % a_row != 0 || N % 32 != 0 || b.empty() || b.size() % expert_bytes != 0) {
        fprintf(stderr, "ime2 driver: a.bin (%zu bytes) or b.bin (%zu bytes) is not whole rows / experts\n",
                a.size(), b.size());
        return 2;
    }
    const size_t       tokens = a.size() / a_row, experts = b.size() / expert_bytes;
    std::vector<float> c(M * N, -12345.0f);
    static const uint8_t zp_flag = 0;
    const uint8_t       *zp = e.zp_flag ? &zp_flag : nullptr;
    FILE                *calls = fopen((dir + "/calls.txt").c_str(), "r");
    if (!calls) {
        perror("calls.txt");
        return 2;
    }
    imegen_ime2_emu_install();
    size_t rows, ex, a0, a1, c0, c1;
    while (fscanf(calls, "%zu %zu", &rows, &ex) == 2) {
        bool ok = ex < experts && (rows == 2 ? fscanf(calls, "%zu %zu %zu %zu", &a0, &a1, &c0, &c1) == 4 :
                                   rows == 1 && fscanf(calls, "%zu %zu", &a0, &c0) == 2);
        ok = ok && a0 < tokens && c0 < M && (rows == 1 || (a1 < tokens && c1 < M));
        if (!ok) {
            fprintf(stderr, "ime2 driver: bad line in calls.txt\n");
            return 2;
        }
        const uint8_t *expert = b.data() + ex * expert_bytes;
        if (rows == 2) {
            const uint8_t *a_rows[2] = { a.data() + a0 * a_row, a.data() + a1 * a_row };
            float         *c_rows[2] = { c.data() + c0 * N, c.data() + c1 * N };
            printf("rows %zu\n", e.pair(blk_len, a_rows, expert, zp, c_rows, 1, N, k_blks, N));
        } else {
            for (size_t n = 0; n < N; n += 32)
                printf("rows %zu\n", e.single(blk_len, a.data() + a0 * a_row,
                                              expert + n * e.b_col_bytes_per_blk * k_blks, zp, c.data() + c0 * N + n,
                                              1, 32, k_blks, N));
        }
    }
    fclose(calls);
    return finish(c, dir);
}

}  // namespace

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s KERNEL M N K_BLKS BLK_LEN DIR\n", argv[0]);
        return 2;
    }
    const std::string kernel = argv[1];
    const size_t      M = strtoul(argv[2], nullptr, 10), N = strtoul(argv[3], nullptr, 10);
    const size_t      k_blks = strtoul(argv[4], nullptr, 10), blk_len = strtoul(argv[5], nullptr, 10);
    const std::string dir = argv[6];

    // A per row and k block: fp32 scale, int16 sums (one per 16 codes for the K-quants, one per block for
    // i8i8: rvv_kernels.h's q8k_blk_size / q8_blk_size(.., true)), blk_len int8 codes. B per column and k
    // block: i8i8 an fp16 scale and blk_len int8 codes; i8i4 (Q4_0) an fp16 scale and blk_len / 2 bytes of
    // nibbles; the K-quants their nrow_block_q*_k<32> over 32 columns.
    const size_t q8k_row = sizeof(float) + sizeof(int16_t) * blk_len / 16 + blk_len;
    const size_t q8_row = sizeof(float) + sizeof(int16_t) + blk_len;
    // Q4_0 for the HP kernel (blk_len 256): A per row and super-block 8 x (fp16 scale, 32 codes), 8 fp16 sums and
    // an fp16 scale_avg (q8_hp_blk_size(256, true, true)); B per column 8 x (fp16 scale, 16 bytes of nibbles).
    const size_t q8_hp_row = blk_len + 2 * sizeof(uint16_t) * (blk_len / 32) + sizeof(uint16_t);
    const entry  entries[] = {
        { "i8i8", spacemit_kernels::ime2::gemm_kernel_i8i8, q8_row, 2 + blk_len, false },
        { "i8i2k", spacemit_kernels::ime2::gemm_kernel_i8i2k, q8k_row,
         sizeof(spacemit_kernels::nrow_block_q2_k<32>) / 32, false },
        { "i8i3k", spacemit_kernels::ime2::gemm_kernel_i8i3k, q8k_row,
         sizeof(spacemit_kernels::nrow_block_q3_k<32>) / 32, false },
        { "i8i5", spacemit_kernels::ime2::gemm_kernel_i8i5, q8_row, sizeof(spacemit_kernels::nrow_block_q5_0<32>) / 32,
         false },
        { "i8i5zp", spacemit_kernels::ime2::gemm_kernel_i8i5, q8_row,
         sizeof(spacemit_kernels::nrow_block_q5_1<32>) / 32, true },
        { "i8i4", spacemit_kernels::ime2::gemm_kernel_i8i4, q8_row, 2 + blk_len / 2, false },
        { "i8i4hp", spacemit_kernels::ime2::gemm_kernel_i8i4_hp, q8_hp_row, (blk_len / 32) * (2 + 16), false },
    };
    const moe_entry moe_entries[] = {
        { "moe_i8i4", spacemit_kernels::ime2::moe_m2_gemm_kernel_i8i4, spacemit_kernels::ime2::gemm_kernel_i8i4,
         2 + blk_len / 2, false },
        { "moe_i8i4zp", spacemit_kernels::ime2::moe_m2_gemm_kernel_i8i4, spacemit_kernels::ime2::gemm_kernel_i8i4,
         2 + 1 + blk_len / 2, true },
        { "moe_i8i5", spacemit_kernels::ime2::moe_m2_gemm_kernel_i8i5, spacemit_kernels::ime2::gemm_kernel_i8i5,
         sizeof(spacemit_kernels::nrow_block_q5_0<32>) / 32, false },
        { "moe_i8i5zp", spacemit_kernels::ime2::moe_m2_gemm_kernel_i8i5, spacemit_kernels::ime2::gemm_kernel_i8i5,
         sizeof(spacemit_kernels::nrow_block_q5_1<32>) / 32, true },
    };
    for (const moe_entry &x : moe_entries)
        if (kernel == x.name)
            return run_moe(x, M, N, k_blks, blk_len, dir);
    static const uint8_t zp_flag = 0;
    const entry *e = nullptr;
    for (const entry &x : entries)
        if (kernel == x.name)
            e = &x;
    if (!e) {
        fprintf(stderr, "ime2 driver: unknown kernel %s\n", kernel.c_str());
        return 2;
    }

    std::vector<uint8_t> a = read_file(dir + "/a.bin"), b = read_file(dir + "/b.bin");
    if (a.size() != M * k_blks * e->a_row_bytes_per_blk) {
        fprintf(stderr, "ime2 driver: a.bin has %zu bytes, expected %zu\n", a.size(),
                M * k_blks * e->a_row_bytes_per_blk);
        return 2;
    }
    if (N % 32 != 0 || b.size() != N * k_blks * e->b_col_bytes_per_blk) {
        fprintf(stderr, "ime2 driver: b.bin has %zu bytes, expected %zu (N a multiple of 32)\n", b.size(),
                N * k_blks * e->b_col_bytes_per_blk);
        return 2;
    }
    std::vector<float> c(M * N, -12345.0f);  // a value no kernel result is expected to hit: unwritten cells show

    imegen_ime2_emu_install();
    // One call per group of 32 columns: gemm_kernel_i8i8_m4 decrements its block count, an input-only asm
    // operand, so with clang -O2 a second column group in the same call runs one k block only (a bug of the
    // kernel, not of what IME2 computes: docs/ime2-isa.md §9). Each call here sees one group (every kernel).
    for (size_t n = 0; n < N; n += 32) {
        size_t a_off = 0;
        for (size_t m = 0; m < M;) {
            size_t rows = e->fn(blk_len, a.data() + a_off, b.data() + n * e->b_col_bytes_per_blk * k_blks,
                                e->zp_flag ? &zp_flag : nullptr,
                                c.data() + m * N + n, M - m, N - n < 32 ? N - n : 32, k_blks, N);
            printf("rows %zu\n", rows);
            if (rows == 0 || rows > M - m) {
                fprintf(stderr, "ime2 driver: kernel reported %zu rows with %zu left\n", rows, M - m);
                return 2;
            }
            a_off += rows * k_blks * e->a_row_bytes_per_blk;
            m += rows;
        }
    }
    return finish(c, dir);
}
