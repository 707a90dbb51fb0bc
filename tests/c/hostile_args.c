/* Calls one generated imegen-ABI kernel's entry points with hostile arguments and prints each
 * status, one per line, for tests/test_entry_points.py. Build with -DKERNEL_HEADER="x.h" -DP(f)=x_##f,
 * -DHAS_BIAS=0|1. Under ASan/UBSan any out-of-bounds access or overflow aborts the run. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include KERNEL_HEADER
#ifdef IME_EMU
#include "ime_emu.h"
#endif

#define M0 5
#define N0 7
#define K0 40

/* matmul_prepared_then's epilogue here: adds 1 to each element it is handed and counts the visits */
static int visits[M0 * N0], strays;
static void plus_one(void *ctx, float *c, size_t ldc, size_t m0, size_t rows, size_t n0, size_t cols) {
    float *base = ctx;
    if (c != base + m0 * ldc + n0 || m0 + rows > M0 || n0 + cols > N0) {
        strays++;
        return;
    }
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) c[i * ldc + j] += 1.0f, visits[(m0 + i) * N0 + n0 + j]++;
}

/* 1 when every element was visited exactly once and nothing else was handed over; resets the counts */
static int each_once(void) {
    int ok = strays == 0;
    for (int i = 0; i < M0 * N0; i++) ok &= visits[i] == 1, visits[i] = 0;
    strays = 0;
    return ok;
}

int main(void) {
#ifdef IME_EMU
    imegen_ime_emu_install();
#endif
    static uint8_t b[N0 * 2 * 32], zp[N0 * 2];
    static float scales[N0 * 2], a[M0 * K0], c[M0 * N0], bias[N0];
    memset(b, 0x88, sizeof b);
    memset(zp, 0x88, sizeof zp);
    for (int i = 0; i < N0 * 2; i++) scales[i] = 0.5f;
    for (int i = 0; i < M0 * K0; i++) a[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < N0; i++) bias[i] = (float)i;
    const float *bs = HAS_BIAS ? bias : NULL;
    void *pb = malloc(P(packed_b_size)(N0, K0));
    void *ws = malloc(P(workspace_size)(M0, K0));
    P(pack_b)(N0, K0, b, scales, zp, pb);
    /* sizes: huge dimensions give 0, never a wrapped size */
    printf("%d\n", P(packed_b_size)(SIZE_MAX / 2, K0) == 0);
    printf("%d\n", P(packed_b_size)(N0, SIZE_MAX / 2) == 0);
    printf("%d\n", P(workspace_size)((size_t)-1, K0) == 0);
    printf("%d\n", P(packed_b_size)(N0, K0) > 0 && P(workspace_size)(M0, K0) > 0);
    /* matmul statuses */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0, pb, bs, c, N0, ws));             /* valid */
    printf("%d\n", P(matmul)((size_t)-1, N0, K0, a, K0, pb, bs, c, N0, ws));     /* M huge */
    printf("%d\n", P(matmul)(M0, SIZE_MAX / 2, K0, a, K0, pb, bs, c, N0, ws));   /* N huge */
    printf("%d\n", P(matmul)(M0, N0, K0, NULL, K0, pb, bs, c, N0, ws));          /* NULL A */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0, NULL, bs, c, N0, ws));           /* NULL B */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0, (char *)pb + 4, bs, c, N0, ws)); /* B not 8-byte aligned */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0, pb, bs, NULL, N0, ws));          /* NULL C */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0, pb, bs, c, N0, NULL));           /* NULL workspace */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0 - 1, pb, bs, c, N0, ws));         /* lda < K */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0, pb, bs, c, N0 - 1, ws));         /* ldc < N */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0, pb, bs, c, SIZE_MAX / 2, ws));   /* M * ldc overflows */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0, pb, HAS_BIAS ? NULL : bias, c, N0, ws)); /* bias mismatch */
    printf("%d\n", P(matmul)(0, N0, K0, NULL, 0, NULL, bs, NULL, 0, NULL));      /* M = 0: nothing to do */
    printf("%d\n", P(matmul)(M0, 0, K0, NULL, 0, NULL, bs, NULL, 0, NULL));      /* N = 0: nothing to do */
    for (int i = 0; i < M0 * N0; i++) c[i] = 99.0f;
    int st = P(matmul)(M0, N0, 0, NULL, 0, NULL, bs, c, N0, NULL);               /* K = 0: C = bias or 0 */
    int ok = 1;
    for (int m = 0; m < M0; m++)
        for (int n = 0; n < N0; n++)
            ok &= c[m * N0 + n] == (HAS_BIAS ? bias[n] : 0.0f);
    printf("%d %d\n", st, ok);
    /* NULL zero points: ORT's default 2^(bits-1) (here 8, as in the explicit 0x88 bytes) */
    static float c1[M0 * N0], c2[M0 * N0];
    int s1 = P(matmul)(M0, N0, K0, a, K0, pb, bs, c1, N0, ws);
    P(pack_b)(N0, K0, b, scales, NULL, pb);
    int s2 = P(matmul)(M0, N0, K0, a, K0, pb, bs, c2, N0, ws);
    printf("%d %d %d\n", s1, s2, memcmp(c1, c2, sizeof c1) == 0);
    /* matmul_prepared: the workspace prepare_a filled, read only; the same result as matmul */
    static float c3[M0 * N0];
    void *scratch = malloc(P(scratch_size)(K0) + 1);
    P(prepare_a)(M0, K0, a, K0, ws);
    int s3 = P(matmul_prepared)(M0, N0, K0, pb, bs, c3, N0, ws, scratch);
    printf("%d %d\n", s3, memcmp(c2, c3, sizeof c3) == 0);
    printf("%d\n", P(matmul_prepared)(M0, N0, K0, (char *)pb + 4, bs, c3, N0, ws, scratch)); /* B not aligned */
    printf("%d\n", P(matmul_prepared)(M0, N0, K0, pb, bs, c3, N0, NULL, scratch));            /* NULL workspace */
    printf("%d\n", P(matmul_prepared)(M0, N0, K0, pb, bs, NULL, N0, ws, scratch));            /* NULL C */
    printf("%d\n", P(scratch_size)(SIZE_MAX / 2) == 0 || P(scratch_size)(K0) == 0);           /* never wraps */
    printf("%d\n", P(matmul_prepared)(M0, N0, K0, pb, bs, c3, N0, ws, NULL) == (P(scratch_size)(K0) ? 2 : 0)); /* NULL scratch */
    /* matmul_prepared_then: matmul_prepared's C, then each element handed to the epilogue once, final */
    static float c4[M0 * N0];
    int s4 = P(matmul_prepared_then)(M0, N0, K0, pb, bs, c4, N0, ws, scratch, plus_one, c4);
    int same = 1;
    for (int i = 0; i < M0 * N0; i++) same &= c4[i] == c3[i] + 1.0f;
    printf("%d %d %d\n", s4, each_once(), same);
    s4 = P(matmul_prepared_then)(M0, N0, 0, NULL, bs, c4, N0, NULL, NULL, plus_one, c4); /* K = 0: C = bias + 1 */
    same = 1;
    for (int m = 0; m < M0; m++)
        for (int n = 0; n < N0; n++) same &= c4[m * N0 + n] == (HAS_BIAS ? bias[n] : 0.0f) + 1.0f;
    printf("%d %d %d\n", s4, each_once(), same);
    s4 = P(matmul_prepared_then)(M0, N0, K0, pb, bs, c4, N0, NULL, scratch, plus_one, c4); /* NULL workspace */
    printf("%d %d\n", s4, strays == 0 && !memchr(visits, 1, sizeof visits));            /* refused, no epilogue */
    /* C overlapping what the call reads: refused (no call computes in place); C just past A: fine */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0, pb, bs, a, N0, ws));                  /* C on A */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0, pb, bs, (float *)ws, N0, ws));        /* C in the workspace */
    printf("%d\n", P(matmul)(M0, N0, K0, a, K0, pb, bs, (float *)pb, N0, ws));        /* C on packed B */
    printf("%d\n", HAS_BIAS ? P(matmul)(M0, N0, K0, a, K0, pb, bias, bias, N0, ws) : 2); /* C on the bias */
    static float ac[M0 * K0 + M0 * N0];
    memcpy(ac, a, sizeof a);
    printf("%d\n", P(matmul)(M0, N0, K0, ac, K0, pb, bs, ac + M0 * K0, N0, ws));     /* C right after A */
    printf("%d\n", P(matmul)(M0, N0 - 1, K0, ac, K0, pb, bs, ac + M0 * K0 - 1, N0, ws)); /* C on A's last float */
    static float ca[M0 * N0 + M0 * K0];
    memcpy(ca + M0 * N0, a, sizeof a);
    printf("%d\n", P(matmul)(M0, N0, K0, ca + M0 * N0, K0, pb, bs, ca, N0, ws));     /* A right after C */
    memmove(ca + M0 * N0 - 1, ca + M0 * N0, sizeof a);
    printf("%d\n", P(matmul)(M0, N0, K0, ca + M0 * N0 - 1, K0, pb, bs, ca, N0, ws)); /* A from C's last float */
    printf("%d\n", P(matmul_prepared)(M0, N0, K0, pb, bs, (float *)ws, N0, ws, scratch)); /* C in the workspace */
    printf("%d\n", P(scratch_size)(K0) ? P(matmul_prepared)(M0, N0, K0, pb, bs, (float *)scratch, N0, ws, scratch) : 2);
    free(scratch);
    free(pb);
    free(ws);
    return 0;
}
