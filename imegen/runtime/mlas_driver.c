/*
 * A stand-in for MLAS's MlasQNBitGemmBatch (ORT's qnbitgemm.cpp), written from its documented
 * contract, to run imegen's generated MLAS dispatch the way ORT would:
 *   - PackQuantBDataSize == 0 means "not available" (ORT falls back to its own path);
 *   - packed B, scales and zero points are addressed per column (n * ldb, n * kb);
 *   - N is split at multiples of 16 (thread ranges), then walked in chunks (128 for M1 and
 *     CompInt8, 32 for the dequantize + SGEMM path);
 *   - 4-bit: B packed once (plus ORT's scale-only call); CompInt8 rows quantized into Q8 blocks,
 *     the kernel called until all rows are handled;
 *   - 8-bit (BlkSum): pack called three times (B with scales, scales, zero points) into the
 *     regions of PackedQuantBDataStruct<float, 8> on a non-x86, non-ARM64 build, poisoned first;
 *     A quantized into PerGemmQuantAWorkspace; M split in ranges of 128 rows, each range's rows
 *     handed to the kernel in one call.
 * Input per case (little-endian): u64 M, N, K, BlkLen, compute, has_zp, has_bias, bits; f32 A[M][K];
 * u8 B[N][kb][BlkLen*bits/8]; f32 scales[N][kb]; [u8 zp[N][4-bit: (kb+1)/2, 8-bit: kb]]; [f32 bias[N]].
 * Output per case: i32 status (0 ok, 1 no kernel for this BlkLen/compute); u64 vmadot; f32 C[M][N].
 */
#include IMEGEN_DISPATCH_HEADER /* -DIMEGEN_DISPATCH_HEADER="\"<prefix>dispatch.h\"" */
#ifdef IMEGEN_IME /* the kernels' emulator: runtime/NAME.c for IMEGEN_EMULATOR=NAME (default ime_emu, the K1's IME) */
#include "emulator.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Counting markers (imegen/perf/mlas_counts.py): A quantization and the GEMM calls of a CompInt8
 * case run between a begin/end pair each. */
#include "bench_markers.h"
/* Poisoned guards after the packed B, the workspaces and C (a write past them ends the run). */
#include "guard.h"

#define D IMEGEN_DISPATCH

static void die(const char *what)
{
    fprintf(stderr, "mlas_driver: %s\n", what);
    exit(2);
}

static void *read_exact(FILE *f, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p || fread(p, 1, bytes, f) != bytes)
        die("short input");
    return p;
}

static uint64_t read_u64(FILE *f)
{
    uint64_t v;
    if (fread(&v, sizeof v, 1, f) != 1)
        die("short input");
    return v;
}

static unsigned long vmadots(void)
{
#ifdef IMEGEN_IME
    return emulator_count();
#else
    return 0;
#endif
}

/* Thread ranges: N split in two at a multiple of 16, as MLAS's partitioning would. Ranges and their column
 * chunks run last first (threads may run in any order): an entry writing past its columns then lands on
 * finished ones and the comparison catches it. */
static size_t range_split(size_t N)
{
    return N > 16 ? (N / 2 + 15) / 16 * 16 : N;
}

static void fp32_m1(size_t BlkLen, size_t K, size_t kb, const float *A, const uint8_t *packed, const float *scales,
                    const uint8_t *zp, const float *bias, float *C, size_t n0, size_t n1)
{
    const size_t ldb = kb * BlkLen / 2, zpb = (kb + 1) / 2;
    for (size_t left = (n1 - n0 + 127) / 128; left > 0; left--) {
        const size_t n = n0 + (left - 1) * 128, cn = n1 - n < 128 ? n1 - n : 128;
        D(SQ4BitGemmM1Kernel_CompFp32)(BlkLen, A, packed + n * ldb, scales + n * kb, zp ? zp + n * zpb : NULL, C + n, cn, K, kb,
                                       bias ? bias + n : NULL);
    }
}

static void fp32_sgemm(size_t BlkLen, size_t M, size_t K, size_t kb, const float *A, const uint8_t *packed,
                       const float *scales, const uint8_t *zp, const float *bias, float *C, size_t ldc, size_t n0, size_t n1)
{
    const size_t ldb = kb * BlkLen / 2, zpb = (kb + 1) / 2;
    const size_t bytes = kb * BlkLen * 32 * sizeof(float); /* MLAS's dequantized-B buffer: 32 columns */
    float *buf = imegen_poisoned(16, bytes);
    for (size_t left = (n1 - n0 + 31) / 32; left > 0; left--) {
        const size_t n = n0 + (left - 1) * 32, cn = n1 - n < 32 ? n1 - n : 32;
        D(SQ4BitBlkDequantBForSgemm_CompFp32)(BlkLen, buf, packed + n * ldb, scales + n * kb, zp ? zp + n * zpb : NULL, cn, K, kb);
        imegen_check_guard(buf, bytes, "SQ4BitBlkDequantBForSgemm_CompFp32 wrote past its 32 columns of K");
        for (size_t m = 0; m < M; m++)
            for (size_t j = 0; j < cn; j++) { /* MlasSgemmCopyPackB order: 16-column panels of K rows */
                double acc = 0;
                for (size_t k = 0; k < K; k++)
                    acc += (double)A[m * K + k] * buf[j / 16 * 16 * K + k * 16 + j % 16];
                C[m * ldc + n + j] = (float)acc + (bias ? bias[n + j] : 0.0f);
            }
    }
    free(buf);
}

static void int8_gemm(size_t BlkLen, size_t M, size_t K, size_t kb, const uint8_t *qa, size_t qlda, const uint8_t *packed,
                      const float *scales, const uint8_t *zp, const float *bias, float *C, size_t ldc, size_t n0, size_t n1)
{
    const size_t ldb = kb * BlkLen / 2, zpb = (kb + 1) / 2;
    for (size_t left = (n1 - n0 + 127) / 128; left > 0; left--) {
        const size_t n = n0 + (left - 1) * 128, cn = n1 - n < 128 ? n1 - n : 128;
        for (size_t m = 0; m < M;) {
            const size_t done = D(SQ4BitGemmKernel_CompInt8)(BlkLen, qa + m * qlda, packed + n * ldb, scales + n * kb,
                                                             zp ? zp + n * zpb : NULL, C + m * ldc + n, M - m, cn, K, kb, ldc,
                                                             bias ? bias + n : NULL);
            if (done == 0 || done > M - m)
                die("kernel handled an impossible number of rows");
            m += done;
        }
    }
}

static int sq4(size_t BlkLen, int compute, size_t M, size_t N, size_t K, const float *A, const uint8_t *B,
               const float *scales, const uint8_t *zp, const float *bias, float *C)
{
    const size_t kb = (K + BlkLen - 1) / BlkLen;
    const size_t size = D(Q4BitGemmPackQuantBDataSize)(N, K, BlkLen, zp != NULL, compute);
    if (size == 0)
        return 1;
    uint8_t *packed = imegen_poisoned(16, size);
    D(SQ4BitGemmPackQuantBData)(N, K, BlkLen, compute, B, packed, NULL);
    D(SQ4BitGemmPackQuantBData)(N, K, BlkLen, compute, NULL, packed, NULL); /* ORT's scale-only call */
    imegen_check_guard(packed, size, "SQ4BitGemmPackQuantBData wrote past Q4BitGemmPackQuantBDataSize()");
    const size_t split = range_split(N);
    const size_t ranges[2][2] = { { 0, split }, { split, N } };
    if (compute == IMEGEN_COMPUTE_INT8) {
        const size_t qlda = kb * (BlkLen + 4);
        const size_t align = D(QNBitGemmPerGemmWorkspaceAlignment)(BlkLen, compute);
        const size_t wsize = D(QNBitGemmPerGemmWorkspaceSize)(M, N, K, BlkLen, zp != NULL, compute, 4);
        uint8_t *ws = imegen_poisoned(align, wsize);
        imegen_bench_begin();
        for (size_t m = 0; m < M; m++)
            D(QuantizeARow_CompInt8)(BlkLen, A + m * K, K, ws + m * qlda);
        imegen_bench_end();
        imegen_bench_begin();
        for (int r = 1; r >= 0; r--)
            int8_gemm(BlkLen, M, K, kb, ws, qlda, packed, scales, zp, bias, C, N, ranges[r][0], ranges[r][1]);
        imegen_bench_end();
        imegen_check_guard(ws, wsize, "QuantizeARow_CompInt8 wrote past QNBitGemmPerGemmWorkspaceSize()");
        free(ws);
    } else {
        for (int r = 1; r >= 0; r--) {
            if (M == 1)
                fp32_m1(BlkLen, K, kb, A, packed, scales, zp, bias, C, ranges[r][0], ranges[r][1]);
            else
                fp32_sgemm(BlkLen, M, K, kb, A, packed, scales, zp, bias, C, N, ranges[r][0], ranges[r][1]);
        }
    }
    free(packed);
    return 0;
}

/* PackedQuantBDataStruct<float, 8>'s regions for a workspace of `size` bytes (RISC-V: no alignment
 * of the data itself; block sums 64-byte aligned, N rounded up to 16; then the scales). */
static void sq8_regions(uint8_t *ws, size_t size, size_t N, size_t kb, size_t BlkLen, float **blksum, float **scales)
{
    const uintptr_t end = (uintptr_t)(ws + N * kb * BlkLen);
    *blksum = (float *)((end + 63) & ~(uintptr_t)63);
    *scales = *blksum + (N + 15) / 16 * 16 * kb;
    /* ORT's scale region is N x kb floats; imegen's kernels read it rounded up to 16 columns too. */
    if ((uint8_t *)(*scales + (N + 15) / 16 * 16 * kb) > ws + size)
        die("Q8BitGemmPackQuantBDataSize is smaller than the PackedQuantBDataStruct regions imegen uses");
}

static int sq8(size_t BlkLen, size_t M, size_t N, size_t K, const float *A, const uint8_t *B, const float *scales,
               const uint8_t *zp, const float *bias, float *C)
{
    const int compute = IMEGEN_COMPUTE_INT8;
    const size_t kb = (K + BlkLen - 1) / BlkLen, ldb = kb * BlkLen, lda = kb * BlkLen;
    const size_t size = D(Q8BitGemmPackQuantBDataSize)(N, K, BlkLen, zp != NULL, compute);
    if (size == 0)
        return 1;
    uint8_t *packed = imegen_poisoned(64, size);
    float *blksum, *pscales;
    sq8_regions(packed, size, N, kb, BlkLen, &blksum, &pscales);
    D(SQ8BitGemmPackQuantBDataAndBlkSum)(N, K, BlkLen, compute, B, scales, zp != NULL, NULL, packed, pscales, blksum, NULL);
    D(SQ8BitGemmPackQuantBDataAndBlkSum)(N, K, BlkLen, compute, NULL, scales, zp != NULL, NULL, packed, pscales, blksum, NULL);
    if (zp)
        D(SQ8BitGemmPackQuantBDataAndBlkSum)(N, K, BlkLen, compute, NULL, NULL, true, zp, packed, pscales, blksum, NULL);
    imegen_check_guard(packed, size, "SQ8BitGemmPackQuantBDataAndBlkSum wrote past Q8BitGemmPackQuantBDataSize()");

    const size_t align = D(QNBitGemmPerGemmWorkspaceAlignment)(BlkLen, compute);
    const size_t wsize = D(QNBitGemmPerGemmWorkspaceSize)(M, N, K, BlkLen, zp != NULL, compute, 8);
    uint8_t *ws = imegen_poisoned(align, wsize);
    uint8_t *qa = ws; /* PerGemmQuantAWorkspace: int8 A [M][lda], scales [M][kb], block sums [M][kb] */
    float *qscale = (float *)(qa + M * lda), *qsum = qscale + M * kb;
    imegen_bench_begin();
    for (size_t m = 0; m < M; m++)
        D(QuantizeARowComputeBlkSum_CompInt8)(BlkLen, A + m * K, K, qa + m * lda, qscale + m * kb, qsum + m * kb);
    imegen_bench_end();
    imegen_bench_begin();
    const size_t split = range_split(N);
    const size_t nranges[2][2] = { { 0, split }, { split, N } };
    for (size_t m0 = 0; m0 < M; m0 += 128) {
        const size_t cm = M - m0 < 128 ? M - m0 : 128;
        for (int r = 1; r >= 0; r--)
            for (size_t left = (nranges[r][1] - nranges[r][0] + 127) / 128; left > 0; left--) {
                const size_t n = nranges[r][0] + (left - 1) * 128, cn = nranges[r][1] - n < 128 ? nranges[r][1] - n : 128;
                D(SQ8BitGemmKernel_BlkSum_CompInt8)(BlkLen, qa + m0 * lda, qscale + m0 * kb, packed + n * ldb, pscales + n * kb,
                                                    zp ? zp + n * kb : NULL, C + m0 * N + n, cm, cn, K, kb, bias ? bias + n : NULL,
                                                    N, qsum + m0 * kb, blksum + n * kb, NULL);
            }
    }
    imegen_bench_end();
    imegen_check_guard(ws, wsize, "QuantizeARowComputeBlkSum_CompInt8 wrote past QNBitGemmPerGemmWorkspaceSize()");
    free(ws);
    free(packed);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--supported") == 0) {
        /* What MLAS asks once at init, on this hart and with no emulator: check's refusal rows. */
        printf("%d\n", D(supported)() ? 1 : 0);
        return 0;
    }
    if (argc != 3)
        die("usage: mlas_driver INPUT OUTPUT | mlas_driver --supported");
#ifdef IMEGEN_IME
    emulator_install();
#endif
    if (!D(supported)())
        die("dispatch not supported on this hart");
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    if (!in || !out)
        die("cannot open files");
    const uint64_t ncases = read_u64(in);
    for (uint64_t t = 0; t < ncases; t++) {
        const size_t M = read_u64(in), N = read_u64(in), K = read_u64(in), BlkLen = read_u64(in);
        const int compute = (int)read_u64(in), has_zp = (int)read_u64(in), has_bias = (int)read_u64(in);
        const size_t bits = read_u64(in), kb = (K + BlkLen - 1) / BlkLen;
        float *A = read_exact(in, M * K * sizeof(float));
        uint8_t *B = read_exact(in, N * kb * BlkLen * bits / 8);
        float *scales = read_exact(in, N * kb * sizeof(float));
        uint8_t *zp = has_zp ? read_exact(in, N * (bits == 8 ? kb : (kb + 1) / 2)) : NULL;
        float *bias = has_bias ? read_exact(in, N * sizeof(float)) : NULL;
        float *C = imegen_guarded_c(M, N);
        int32_t status = 0;
        const unsigned long before = vmadots();
        if (bits == 8)
            status = compute == IMEGEN_COMPUTE_INT8 ? sq8(BlkLen, M, N, K, A, B, scales, zp, bias, C) : 1;
        else
            status = sq4(BlkLen, compute, M, N, K, A, B, scales, zp, bias, C);
        const uint64_t executed = vmadots() - before;
        imegen_check_c(C, M, N, N, "an entry wrote past C's last row");
        fwrite(&status, sizeof status, 1, out);
        fwrite(&executed, sizeof executed, 1, out);
        fwrite(C, sizeof(float), M * N, out);
        free(A), free(B), free(scales), free(zp), free(bias), free(C);
    }
    fclose(in);
    return fclose(out) == 0 ? 0 : 2;
}
