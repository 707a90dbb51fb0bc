/* The kernel table an imegen custom-op library is built from (generated: templates/customop_kernels.c.j2). */
#ifndef IMEGEN_CUSTOMOP_LIB_H
#define IMEGEN_CUSTOMOP_LIB_H

#include <stddef.h>
#include <stdint.h>

struct imegen_kernel_entry {
    const char *name;
    int needs_ime;      /* 1: executes vmadot, so runs only on IME harts (the target's own fact, targets/) */
    int vlen;           /* VLEN the kernel needs (ime: exactly 256, rvv: at least this), 0 for scalar */
    int gemv;           /* 1: decode kernel (preferred at M = 1), 0: gemm */
    int bits, block, int8_compute, asymmetric, bias, tile_m, panel;
    int fallback;           /* 1: runs only slices whose thread cannot reach an IME hart */
    size_t min_rows;        /* gemm: the fewest rows of A it is chosen for */
    int layout;             /* kernels with the same layout pack B into the same bytes: one packed copy serves them */
    size_t n_shapes;        /* the weight shapes (N, K) it was chosen for; 0: any */
    const uint32_t *shapes; /* n_shapes pairs N, K */
    int (*supported)(void);
    size_t (*packed_b_size)(size_t N, size_t K);
    void (*pack_b)(size_t N, size_t K, const uint8_t *b, const float *scales, const uint8_t *zp, void *packed);
    size_t (*workspace_size)(size_t M, size_t K);
    void (*prepare_a)(size_t M, size_t K, const float *A, size_t lda, void *workspace);
    int (*matmul)(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *packed_b, const float *bias,
                  float *C, size_t ldc, void *workspace);
    size_t (*scratch_size)(size_t K);
    int (*matmul_prepared)(size_t M, size_t N, size_t K, const void *packed_b, const float *bias, float *C, size_t ldc,
                           const void *workspace, void *scratch);
    int (*matmul_prepared_then)(size_t M, size_t N, size_t K, const void *packed_b, const float *bias, float *C,
                                size_t ldc, const void *workspace, void *scratch,
                                void (*epilogue)(void *ctx, float *c, size_t ldc, size_t m0, size_t rows, size_t n0,
                                                 size_t cols),
                                void *ctx);
};

/* An attention kernel (templates/attention.h.j2) for the decoder operators' GroupQueryAttention. */
struct imegen_attention_entry {
    const char *name;
    int q_rows; /* query rows one call computes together */
    int (*supported)(void);
    size_t (*scratch_size)(size_t head_dim);
    int (*run)(size_t rows, size_t head_dim, const float *Q, size_t ldq, const float *K, const float *V, size_t ldkv,
               const uint32_t *len, float scale, float *O, size_t ldo, void *scratch);
};

extern const struct imegen_kernel_entry imegen_kernels[];
extern const struct imegen_attention_entry imegen_attention_kernels[];
extern const size_t imegen_attention_count;
extern const size_t imegen_kernel_count;
extern const char imegen_spec_file[];

#endif
