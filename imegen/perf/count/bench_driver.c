/* imegen bench driver: runs one generated kernel on deterministic data under the counting plugin.
 *
 * Compiled per kernel with -DIMEGEN_BENCH_HEADER="\"NAME.h\"" -DIMEGEN_BENCH_PREFIX=NAME_ and the
 * kernel's BLOCK/BITS/ZP/BIAS/IME settings (imegen/perf/count/measure.py). argv: cases "MxNxK".
 * For every case it packs B (not counted), then brackets two calls with the marker functions,
 * whose entry points the plugin watches:
 *     region 2i:   prepare_a          (A quantization / copy alone)
 *     region 2i+1: matmul             (prepare_a again + every tile)
 * and prints "M N K status emulated_vmadots checksum" per case. This file's code, like the IME
 * emulator's, is excluded from the counts by address.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include IMEGEN_BENCH_HEADER
#if IMEGEN_BENCH_IME
#include "ime_emu.h"
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K_(f) CAT(IMEGEN_BENCH_PREFIX, f)

#include "bench_markers.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static float uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rng() & 0xffffff) / 16777216.0f;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "bench driver: out of memory\n");
        exit(2);
    }
    return p;
}

static unsigned long emulated(void)
{
#if IMEGEN_BENCH_IME
    return imegen_ime_emu_count();
#else
    return 0;
#endif
}

int main(int argc, char **argv)
{
#if IMEGEN_BENCH_IME
    imegen_ime_emu_install();
#endif
    for (int c = 1; c < argc; c++) {
        size_t M, N, K;
        if (sscanf(argv[c], "%zux%zux%zu", &M, &N, &K) != 3) {
            fprintf(stderr, "bench driver: bad case %s\n", argv[c]);
            return 2;
        }
        const size_t kb = (K + IMEGEN_BENCH_BLOCK - 1) / IMEGEN_BENCH_BLOCK;
        const size_t bbytes = N * kb * IMEGEN_BENCH_BLOCK * IMEGEN_BENCH_BITS / 8;
        uint8_t *b = xmalloc(bbytes);
        for (size_t i = 0; i < bbytes; i++)
            b[i] = (uint8_t)rng();
        float *scales = xmalloc(N * kb * sizeof(float));
        for (size_t i = 0; i < N * kb; i++)
            scales[i] = uniform(0.001f, 0.01f);
#if IMEGEN_BENCH_ZP
        const size_t zbytes = N * (IMEGEN_BENCH_BITS == 4 ? (kb + 1) / 2 : kb);
        uint8_t *zp = xmalloc(zbytes);
        for (size_t i = 0; i < zbytes; i++)
            zp[i] = (uint8_t)rng();
#else
        uint8_t *zp = NULL;
#endif
#if IMEGEN_BENCH_BIAS
        float *bias = xmalloc(N * sizeof(float));
        for (size_t i = 0; i < N; i++)
            bias[i] = uniform(1.0f, 5.0f);
#else
        float *bias = NULL;
#endif
        float *A = xmalloc(M * K * sizeof(float));
        for (size_t i = 0; i < M * K; i++)
            A[i] = uniform(-1.0f, 1.0f);
        void *packed = xmalloc(K_(packed_b_size)(N, K));
        K_(pack_b)(N, K, b, scales, zp, packed);
        void *ws = xmalloc(K_(workspace_size)(M, K) + 1);
        float *C = xmalloc(M * N * sizeof(float));

        imegen_bench_begin();
        K_(prepare_a)(M, K, A, K, ws);
        imegen_bench_end();
        const unsigned long before = emulated();
        imegen_bench_begin();
        const int status = K_(matmul)(M, N, K, A, K, packed, bias, C, N, ws);
        imegen_bench_end();
        const unsigned long vmadots = emulated() - before;

        double checksum = 0.0;
        for (size_t i = 0; i < M * N; i++)
            checksum += C[i];
        printf("%zu %zu %zu %d %lu %.9g\n", M, N, K, status, vmadots, checksum);
        free(b), free(scales), free(zp), free(bias), free(A), free(packed), free(ws), free(C);
    }
    return 0;
}
