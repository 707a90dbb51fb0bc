/* imegen's decoder-layer operators for ONNX Runtime: RVV fp32 kernels for the nodes between the MatMulNBits of an
 * LLM decoder, in domain IMEGEN_DOMAIN, in the forms onnxruntime-genai exports (imegen/ort/decoder_ops.py moves
 * them and refuses the forms not served here, with the reason):
 *
 *   SimplifiedLayerNormalization (X, scale) -> Y                        RMSNorm over the last axis
 *   SkipSimplifiedLayerNormalization (input, skip, gamma[, bias]) -> (output, input_skip_bias_sum)
 *   SiluMul (gate, up) -> gate * sigmoid(gate) * up                     genai's Sigmoid, Mul, Mul of the MLP, fused
 *   GroupQueryAttention (packed qkv, past_key, past_value, seqlens_k, total_sequence_length[, cos_cache, sin_cache])
 *       -> (output, present_key, present_value)                         ORT's com.microsoft operator, one batch row
 *                                                                        unpadded per seqlens_k, rotary inside; the
 *                                                                        attention itself on the spec's generated
 *                                                                        attention kernel (imegen_attention_kernels)
 *
 * Numerics are ORT's fp32 contract (the same formulas in fp32; exp is a degree-7 polynomial after range reduction,
 * within 1e-7 relative of expf), so the operators are checked against ORT's own within its tolerances.
 * The kernels are vector-length agnostic (vsetvl): they run on any RVV 1.0 hart. Work is split on ORT's intra-op
 * pool (KernelContext_ParallelFor): rows for the norms and the MLP; for attention, (batch row, KV head) to fill the
 * present cache, then tiles of the query rows sharing a KV head, each one call of the attention kernel. */
#include <math.h>
#include <riscv_vector.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#include "customop_lib.h"
#include "decoder_ops.h"
#include "ort_glue.h"

/* ------------------------------------------------------------------------------------------ vector math */
/* e^x for x <= 88: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial of degree 7 (truncation error
 * below 1e-8 relative there), times 2^n built in the exponent field. Below -87 the result is clamped to e^-87
 * (1.6e-38): callers only add such terms to sums of order 1. And y = g * sigmoid(g) * u = g * u / (1 + e^-g) on n
 * elements (y may be u). One copy per register group size (LM = m1, m2, m4): vector units cost a group's whole
 * width whatever vl is, so a short row takes the smallest group that holds it. */
#define DEFINE_SILU(LM)                                                                                              \
    static inline vfloat32##LM##_t vexp_##LM(vfloat32##LM##_t x, size_t vl) {                                       \
        x = __riscv_vfmax_vf_f32##LM(__riscv_vfmin_vf_f32##LM(x, 88.0f, vl), -87.0f, vl);                          \
        const vint32##LM##_t n = __riscv_vfcvt_x_f_v_i32##LM(__riscv_vfmul_vf_f32##LM(x, 1.44269504088896341f, vl), vl); \
        const vfloat32##LM##_t nf = __riscv_vfcvt_f_x_v_f32##LM(n, vl);                                             \
        /* ln2 split in a part exact in fp32 products with n and the rest (Cody-Waite) */                           \
        vfloat32##LM##_t r = __riscv_vfnmsac_vf_f32##LM(x, 0.693359375f, nf, vl);                                   \
        r = __riscv_vfnmsac_vf_f32##LM(r, -2.12194440e-4f, nf, vl);                                                 \
        vfloat32##LM##_t p = __riscv_vfmv_v_f_f32##LM(1.0f / 5040, vl);                                             \
        p = __riscv_vfmadd_vv_f32##LM(p, r, __riscv_vfmv_v_f_f32##LM(1.0f / 720, vl), vl);                          \
        p = __riscv_vfmadd_vv_f32##LM(p, r, __riscv_vfmv_v_f_f32##LM(1.0f / 120, vl), vl);                          \
        p = __riscv_vfmadd_vv_f32##LM(p, r, __riscv_vfmv_v_f_f32##LM(1.0f / 24, vl), vl);                           \
        p = __riscv_vfmadd_vv_f32##LM(p, r, __riscv_vfmv_v_f_f32##LM(1.0f / 6, vl), vl);                            \
        p = __riscv_vfmadd_vv_f32##LM(p, r, __riscv_vfmv_v_f_f32##LM(0.5f, vl), vl);                                \
        p = __riscv_vfmadd_vv_f32##LM(p, r, __riscv_vfmv_v_f_f32##LM(1.0f, vl), vl);                                \
        p = __riscv_vfmadd_vv_f32##LM(p, r, __riscv_vfmv_v_f_f32##LM(1.0f, vl), vl);                                \
        const vint32##LM##_t bits = __riscv_vsll_vx_i32##LM(__riscv_vadd_vx_i32##LM(n, 127, vl), 23, vl);          \
        return __riscv_vfmul_vv_f32##LM(p, __riscv_vreinterpret_v_i32##LM##_f32##LM(bits), vl);                     \
    }                                                                                                               \
    static void silu_mul_##LM(const float *g, const float *u, float *y, size_t n) {                                 \
        for (size_t i = 0, vl; i < n; i += vl) {                                                                    \
            vl = __riscv_vsetvl_e32##LM(n - i);                                                                     \
            const vfloat32##LM##_t gv = __riscv_vle32_v_f32##LM(g + i, vl);                                         \
            const vfloat32##LM##_t e = vexp_##LM(__riscv_vfneg_v_f32##LM(gv, vl), vl);                              \
            const vfloat32##LM##_t den = __riscv_vfadd_vf_f32##LM(e, 1.0f, vl);                                     \
            const vfloat32##LM##_t num = __riscv_vfmul_vv_f32##LM(gv, __riscv_vle32_v_f32##LM(u + i, vl), vl);      \
            __riscv_vse32_v_f32##LM(y + i, __riscv_vfdiv_vv_f32##LM(num, den, vl), vl);                             \
        }                                                                                                           \
    }
DEFINE_SILU(m1)
DEFINE_SILU(m2)
DEFINE_SILU(m4)

static void silu_mul(const float *g, const float *u, float *y, size_t n) {
    if (n <= __riscv_vsetvlmax_e32m1()) silu_mul_m1(g, u, y, n);
    else if (n <= __riscv_vsetvlmax_e32m2()) silu_mul_m2(g, u, y, n);
    else silu_mul_m4(g, u, y, n);
}

static float sum_of_squares(const float *x, size_t n) {
    const size_t vlmax = __riscv_vsetvlmax_e32m8();
    vfloat32m8_t acc = __riscv_vfmv_v_f_f32m8(0.0f, vlmax);
    for (size_t i = 0, vl; i < n; i += vl) {
        vl = __riscv_vsetvl_e32m8(n - i);
        const vfloat32m8_t v = __riscv_vle32_v_f32m8(x + i, vl);
        acc = __riscv_vfmacc_vv_f32m8_tu(acc, v, v, vl);
    }
    const vfloat32m1_t zero = __riscv_vfmv_s_f_f32m1(0.0f, 1);
    return __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m8_f32m1(acc, zero, vlmax));
}

/* y = x / sqrt(mean(x^2) + eps) * gamma, as ORT's SimplifiedLayerNormalization computes it in fp32. */
static void rms_norm_row(const float *x, const float *gamma, float *y, size_t n, float eps) {
    const float rms = sqrtf(sum_of_squares(x, n) / (float)n + eps);
    const float inv = 1.0f / rms;
    for (size_t i = 0, vl; i < n; i += vl) {
        vl = __riscv_vsetvl_e32m8(n - i);
        const vfloat32m8_t v = __riscv_vfmul_vf_f32m8(__riscv_vle32_v_f32m8(x + i, vl), inv, vl);
        __riscv_vse32_v_f32m8(y + i, __riscv_vfmul_vv_f32m8(v, __riscv_vle32_v_f32m8(gamma + i, vl), vl), vl);
    }
}

/* ----------------------------------------------------------------------------------------- ORT helpers */
static OrtStatus *input(OrtKernelContext *ctx, size_t i, const char *node, const char *what, struct shape *s,
                        const void **data) {
    const OrtValue *v = NULL;
    TRY(ort->KernelContext_GetInput(ctx, i, &v));
    if (!v) return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': %s is missing", node, what);
    TRY(shape_of(v, node, what, s));
    return tensor_data(v, data);
}

static OrtStatus *output(OrtKernelContext *ctx, size_t i, const int64_t *dims, size_t rank, float **data) {
    OrtValue *v;
    TRY(ort->KernelContext_GetOutput(ctx, i, dims, rank, &v));
    return ort->GetTensorMutableData(v, (void **)data);
}

/* ------------------------------------------------------------------------------------------- operators */
enum op_id { OP_NORM, OP_SKIP_NORM, OP_SILU_MUL, OP_GQA, N_OPS };

struct op_desc {
    const char *name;
    size_t inputs, required_inputs, outputs;
    ONNXTensorElementDataType in_types[9];
};

static const struct op_desc descs[N_OPS] = {
    [OP_NORM] = {"SimplifiedLayerNormalization", 2, 2, 1,
                 {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}},
    [OP_SKIP_NORM] = {"SkipSimplifiedLayerNormalization", 4, 3, 2,
                      {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                       ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}},
    [OP_SILU_MUL] = {"SiluMul", 2, 2, 1, {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}},
    [OP_GQA] = {"GroupQueryAttention", 7, 5, 3,
                {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                 ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32,
                 ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                 ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}},
};

static unsigned long op_nodes[N_OPS], op_calls[N_OPS];

struct node {
    enum op_id op;
    char name[256];
    float eps;
    int has_bias;
    /* attention */
    int heads, kv_heads, rotary, interleaved;
    float scale;
    const struct imegen_attention_entry *attention; /* the spec's first attention kernel this hart runs */
};

static OrtStatus *name_node(const OrtKernelInfo *info, struct node *n) {
    size_t size = sizeof n->name;
    OrtStatus *st = ort->KernelInfo_GetNodeName(info, n->name, &size);
    if (st) ort->ReleaseStatus(st), snprintf(n->name, sizeof n->name, "?");
    if (!n->name[0]) snprintf(n->name, sizeof n->name, "(unnamed %s)", descs[n->op].name);
    return NULL;
}

static int has_vector_unit(void) { return (getauxval(AT_HWCAP) & (1UL << ('V' - 'A'))) != 0; }

static OrtStatus *create_node(enum op_id op, const OrtKernelInfo *info, struct node *n) {
    n->op = op;
    name_node(info, n);
    if (!has_vector_unit())
        return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': %s runs on RVV, and this hart has no vector unit", n->name,
                    descs[op].name);
    n->eps = attr_float(info, "epsilon", 1e-5f);
    if (op == OP_SKIP_NORM) n->has_bias = input_wired(info, 3);
    if (op != OP_GQA) return NULL;
    n->heads = (int)attr_int(info, "num_heads", 0);
    n->kv_heads = (int)attr_int(info, "kv_num_heads", 0);
    n->rotary = attr_int(info, "do_rotary", 0) == 1;
    n->interleaved = attr_int(info, "rotary_interleaved", 0) == 1;
    n->scale = attr_float(info, "scale", 0.0f);
    if (n->heads <= 0 || n->kv_heads <= 0 || n->heads % n->kv_heads)
        return fail(ORT_INVALID_GRAPH, "imegen: node '%s': num_heads %d must be a positive multiple of kv_num_heads %d",
                    n->name, n->heads, n->kv_heads);
    if (n->rotary && (!input_wired(info, 5) || !input_wired(info, 6)))
        return fail(ORT_INVALID_GRAPH, "imegen: node '%s': do_rotary = 1 needs cos_cache and sin_cache", n->name);
    for (size_t i = 0; i < imegen_attention_count && !n->attention; i++)
        if (imegen_attention_kernels[i].supported()) n->attention = &imegen_attention_kernels[i];
    if (!n->attention)
        return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': %s, so nothing runs its attention here; keep the node in "
                    "com.microsoft", n->name, imegen_attention_count ? "no attention kernel of the spec supports this "
                    "hart's VLEN" : "the spec has no attention kernel");
    return NULL;
}

/* --------------------------------------------------------------------------------------- row operators */
struct rows_job {
    const struct node *n;
    const float *x, *skip, *gamma, *bias;
    float *y, *sum;
    size_t width;
};

static void norm_row(void *p, size_t r) {
    const struct rows_job *j = p;
    const size_t w = j->width;
    const float *x = j->x + r * w;
    if (j->skip) { /* sum = input + skip (+ bias), kept as output 1 for the next residual */
        float *s = j->sum + r * w;
        for (size_t i = 0, vl; i < w; i += vl) {
            vl = __riscv_vsetvl_e32m8(w - i);
            vfloat32m8_t v = __riscv_vfadd_vv_f32m8(__riscv_vle32_v_f32m8(x + i, vl),
                                                    __riscv_vle32_v_f32m8(j->skip + r * w + i, vl), vl);
            if (j->bias) v = __riscv_vfadd_vv_f32m8(v, __riscv_vle32_v_f32m8(j->bias + i, vl), vl);
            __riscv_vse32_v_f32m8(s + i, v, vl);
        }
        x = s;
    }
    rms_norm_row(x, j->gamma, j->y + r * w, w, j->n->eps);
}

static void silu_mul_row(void *p, size_t r) {
    const struct rows_job *j = p;
    silu_mul(j->x + r * j->width, j->skip + r * j->width, j->y + r * j->width, j->width);
}

void imegen_silu_gate(float *y, size_t ldy, const float *g, size_t ldg, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) silu_mul(g + r * ldg, y + r * ldy, y + r * ldy, cols);
}

static OrtStatus *run_rows(OrtKernelContext *ctx, void (*fn)(void *, size_t), struct rows_job *j, size_t rows) {
    if (rows <= 1) {
        for (size_t r = 0; r < rows; r++) fn(j, r);
        return NULL;
    }
    return ort->KernelContext_ParallelFor(ctx, fn, rows, 0, j);
}

static OrtStatus *same_shape(const struct node *n, const struct shape *a, const struct shape *b, const char *what) {
    int same = a->rank == b->rank;
    for (size_t i = 0; same && i < a->rank; i++) same = a->dims[i] == b->dims[i];
    if (!same) return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': %s must have the input's shape (broadcasting "
                           "is not served)", n->name, what);
    return NULL;
}

static OrtStatus *compute_norm(const struct node *n, OrtKernelContext *ctx) {
    struct shape xs, gs, ss, bs;
    const void *x, *gamma, *skip = NULL, *bias = NULL;
    const int skipped = n->op == OP_SKIP_NORM;
    TRY(input(ctx, 0, n->name, "the input", &xs, &x));
    TRY(input(ctx, skipped ? 2 : 1, n->name, "the scale (gamma)", &gs, &gamma));
    if (xs.rank < 1) return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': the input is a scalar", n->name);
    const size_t width = (size_t)xs.dims[xs.rank - 1];
    if (gs.count != width)
        return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': the scale has %zu elements, the normalized axis %zu",
                    n->name, gs.count, width);
    if (skipped) {
        TRY(input(ctx, 1, n->name, "skip", &ss, &skip));
        TRY(same_shape(n, &xs, &ss, "skip"));
        if (n->has_bias) {
            TRY(input(ctx, 3, n->name, "bias", &bs, &bias));
            if (bs.count != width)
                return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': bias has %zu elements, the hidden size %zu",
                            n->name, bs.count, width);
        }
    }
    float *y, *sum = NULL;
    TRY(output(ctx, 0, xs.dims, xs.rank, &y));
    if (skipped) TRY(output(ctx, 1, xs.dims, xs.rank, &sum));
    if (!width) return NULL;
    struct rows_job j = {n, x, skip, gamma, bias, y, sum, width};
    return run_rows(ctx, norm_row, &j, xs.count / width);
}

static OrtStatus *compute_silu_mul(const struct node *n, OrtKernelContext *ctx) {
    struct shape gs, us;
    const void *g, *u;
    TRY(input(ctx, 0, n->name, "the gate", &gs, &g));
    TRY(input(ctx, 1, n->name, "the up projection", &us, &u));
    TRY(same_shape(n, &gs, &us, "the up projection"));
    float *y;
    TRY(output(ctx, 0, gs.dims, gs.rank, &y));
    if (!gs.count) return NULL;
    const size_t width = gs.rank ? (size_t)gs.dims[gs.rank - 1] : 1;
    struct rows_job j = {n, g, u, NULL, NULL, y, NULL, width};
    return run_rows(ctx, silu_mul_row, &j, width ? gs.count / width : 0);
}

/* ------------------------------------------------------------------------------------------ attention */
struct gqa_job {
    const struct node *n;
    size_t batch, seq, head, heads_total; /* heads_total: q + k + v heads in the packed input */
    size_t present_len, past_len, rotary_dim, cache_rows;
    const float *qkv, *past_k, *past_v, *cos, *sin;
    const int32_t *seqlens;
    float *out, *present_k, *present_v;
    float scale;
    int shared; /* present_key/value are past_key/value's own buffers (fill_present) */
    int status; /* 2: out of memory, 3: the attention kernel refused */
};

/* The first position of batch row b's new tokens: its total length (seqlens_k + 1) less the new ones. */
static size_t past_of(const struct gqa_job *j, size_t b) { return (size_t)j->seqlens[b] + 1 - j->seq; }

/* x's first rotary_dim values rotated to position pos (rotate-half, or interleaved pairs), into y. */
static void rotate(const struct gqa_job *j, const float *x, float *y, size_t pos) {
    const size_t half = j->rotary_dim / 2;
    const float *c = j->cos + pos * half, *s = j->sin + pos * half;
    memcpy(y, x, j->head * sizeof *x);
    if (j->n->interleaved) {
        for (size_t i = 0; i < half; i++) {
            const float a = x[2 * i], b = x[2 * i + 1];
            y[2 * i] = a * c[i] - b * s[i];
            y[2 * i + 1] = b * c[i] + a * s[i];
        }
        return;
    }
    for (size_t i = 0, vl; i < half; i += vl) {
        vl = __riscv_vsetvl_e32m4(half - i);
        const vfloat32m4_t a = __riscv_vle32_v_f32m4(x + i, vl), b = __riscv_vle32_v_f32m4(x + half + i, vl);
        const vfloat32m4_t cv = __riscv_vle32_v_f32m4(c + i, vl), sv = __riscv_vle32_v_f32m4(s + i, vl);
        __riscv_vse32_v_f32m4(y + i, __riscv_vfnmsac_vv_f32m4(__riscv_vfmul_vv_f32m4(a, cv, vl), b, sv, vl), vl);
        __riscv_vse32_v_f32m4(y + half + i, __riscv_vfmacc_vv_f32m4(__riscv_vfmul_vv_f32m4(b, cv, vl), a, sv, vl), vl);
    }
}

static const float *qkv_row(const struct gqa_job *j, size_t b, size_t s, size_t packed_head) {
    return j->qkv + ((b * j->seq + s) * j->heads_total + packed_head) * j->head;
}

/* Present K/V of one (batch row, KV head): the past positions, then the new tokens (K rotated), zeros after.
 * When present is past's own buffer (onnxruntime-genai binds each present output to its max-length past input,
 * past_present_share_buffer), only the new tokens' rows are written: the past is already in place and the rows
 * after the valid length belong to the caller, so they are left as they are, as ORT's own operator leaves them. */
static void fill_present(void *p, size_t task) {
    struct gqa_job *j = p;
    const size_t kvh_count = (size_t)j->n->kv_heads, b = task / kvh_count, kvh = task % kvh_count;
    const size_t past = past_of(j, b), hd = j->head, row = hd * sizeof(float);
    float *pk = j->present_k + (b * kvh_count + kvh) * j->present_len * hd;
    float *pv = j->present_v + (b * kvh_count + kvh) * j->present_len * hd;
    const float *old_k = j->past_k + (b * kvh_count + kvh) * j->past_len * hd;
    const float *old_v = j->past_v + (b * kvh_count + kvh) * j->past_len * hd;
    if (past && !j->shared) memcpy(pk, old_k, past * row), memcpy(pv, old_v, past * row);
    const size_t k_head = (size_t)j->n->heads + kvh, v_head = k_head + kvh_count;
    for (size_t s = 0; s < j->seq; s++) {
        const float *k = qkv_row(j, b, s, k_head);
        if (j->n->rotary) rotate(j, k, pk + (past + s) * hd, past + s);
        else memcpy(pk + (past + s) * hd, k, row);
        memcpy(pv + (past + s) * hd, qkv_row(j, b, s, v_head), row);
    }
    const size_t end = past + j->seq;
    if (j->shared) return;
    memset(pk + end * hd, 0, (j->present_len - end) * row);
    memset(pv + end * hd, 0, (j->present_len - end) * row);
}

/* One tile of a (batch row, KV head)'s query rows, on the spec's attention kernel. Rows are ordered by position,
 * then by query head within the KV head's group, so a tile's rows mostly share their visible keys. */
static void attend_tile(void *p, size_t task) {
    struct gqa_job *j = p;
    const size_t heads = (size_t)j->n->heads, kv_heads = (size_t)j->n->kv_heads, group = heads / kv_heads, hd = j->head;
    const size_t R = (size_t)j->n->attention->q_rows, rows = group * j->seq, tiles = (rows + R - 1) / R;
    const size_t b = task / (kv_heads * tiles), kvh = task / tiles % kv_heads, r0 = task % tiles * R;
    const size_t nr = rows - r0 < R ? rows - r0 : R, past = past_of(j, b);
    const size_t scratch = j->n->attention->scratch_size(hd);
    float *q = malloc(2 * R * hd * sizeof(float) + R * sizeof(uint32_t) + scratch);
    if (!q) {
        __atomic_store_n(&j->status, 2, __ATOMIC_RELAXED);
        return;
    }
    float *o = q + R * hd;
    uint32_t *len = (uint32_t *)(o + R * hd);
    for (size_t i = 0; i < nr; i++) {
        const size_t s = (r0 + i) / group, h = kvh * group + (r0 + i) % group;
        if (j->n->rotary) rotate(j, qkv_row(j, b, s, h), q + i * hd, past + s);
        else memcpy(q + i * hd, qkv_row(j, b, s, h), hd * sizeof(float));
        len[i] = (uint32_t)(past + s + 1);
    }
    const float *K = j->present_k + (b * kv_heads + kvh) * j->present_len * hd;
    const float *V = j->present_v + (b * kv_heads + kvh) * j->present_len * hd;
    if (j->n->attention->run(nr, hd, q, hd, K, V, hd, len, j->scale, o, hd, len + R))
        __atomic_store_n(&j->status, 3, __ATOMIC_RELAXED);
    for (size_t i = 0; i < nr; i++) {
        const size_t s = (r0 + i) / group, h = kvh * group + (r0 + i) % group;
        memcpy(j->out + ((b * j->seq + s) * heads + h) * hd, o + i * hd, hd * sizeof(float));
    }
    free(q);
}

static OrtStatus *gqa_shapes(const struct node *n, OrtKernelContext *ctx, struct gqa_job *j) {
    struct shape qs, ks, vs, ls, ts, cs, ss;
    const void *qkv, *pk, *pv, *seqlens, *total, *cos = NULL, *sin = NULL;
    TRY(input(ctx, 0, n->name, "query", &qs, &qkv));
    TRY(input(ctx, 1, n->name, "past_key", &ks, &pk));
    TRY(input(ctx, 2, n->name, "past_value", &vs, &pv));
    TRY(input(ctx, 3, n->name, "seqlens_k", &ls, &seqlens));
    TRY(input(ctx, 4, n->name, "total_sequence_length", &ts, &total));
    const size_t heads_total = (size_t)(n->heads + 2 * n->kv_heads);
    if (qs.rank != 3 || qs.dims[2] % (int64_t)heads_total)
        return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': query must be [batch, sequence, (num_heads + 2 "
                    "kv_num_heads) x head_size] (packed QKV)", n->name);
    j->batch = (size_t)qs.dims[0], j->seq = (size_t)qs.dims[1], j->head = (size_t)qs.dims[2] / heads_total;
    j->heads_total = heads_total;
    if (!n->attention->scratch_size(j->head)) /* 0: a head size the attention kernel does not take */
        return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': head size %zu is beyond attention kernel %s", n->name,
                    j->head, n->attention->name);
    if (ks.rank != 4 || ks.dims[0] != (int64_t)j->batch || ks.dims[1] != n->kv_heads || ks.dims[3] != (int64_t)j->head
        || vs.rank != 4 || memcmp(ks.dims, vs.dims, sizeof ks.dims[0] * 4))
        return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': past_key and past_value must be [batch, kv_num_heads, "
                    "past, head_size] (BNSH)", n->name);
    if (ls.count != j->batch || ts.count != 1)
        return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': seqlens_k must have one entry per batch row and "
                    "total_sequence_length one value", n->name);
    j->past_len = (size_t)ks.dims[2];
    const int32_t total_len = *(const int32_t *)total;
    j->present_len = total_len > (int32_t)j->past_len ? (size_t)total_len : j->past_len;
    j->seqlens = seqlens;
    for (size_t b = 0; b < j->batch; b++) {
        const int64_t past = (int64_t)j->seqlens[b] + 1 - (int64_t)j->seq;
        if (past < 0 || past > (int64_t)j->past_len || (size_t)past + j->seq > j->present_len)
            return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': batch row %zu: seqlens_k %d with %zu new tokens and "
                        "a past of %zu (padded rows are not served)", n->name, b, j->seqlens[b], j->seq, j->past_len);
    }
    if (n->rotary) {
        TRY(input(ctx, 5, n->name, "cos_cache", &cs, &cos));
        TRY(input(ctx, 6, n->name, "sin_cache", &ss, &sin));
        if (cs.rank != 2 || ss.rank != 2 || memcmp(cs.dims, ss.dims, 2 * sizeof cs.dims[0]) ||
            (size_t)cs.dims[1] * 2 > j->head)
            return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': cos_cache and sin_cache must be [positions, "
                        "rotary_dim / 2] with rotary_dim <= head size", n->name);
        j->rotary_dim = (size_t)cs.dims[1] * 2, j->cache_rows = (size_t)cs.dims[0];
        if (j->present_len > j->cache_rows)
            return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': %zu positions, but the cos/sin caches hold %zu",
                        n->name, j->present_len, j->cache_rows);
    }
    j->qkv = qkv, j->past_k = pk, j->past_v = pv, j->cos = cos, j->sin = sin;
    j->scale = n->scale != 0.0f ? n->scale : 1.0f / sqrtf((float)j->head);
    return NULL;
}

static OrtStatus *compute_gqa(const struct node *n, OrtKernelContext *ctx) {
    struct gqa_job j = {0};
    j.n = n;
    TRY(gqa_shapes(n, ctx, &j));
    const int64_t out_dims[3] = {(int64_t)j.batch, (int64_t)j.seq, (int64_t)((size_t)n->heads * j.head)};
    const int64_t kv_dims[4] = {(int64_t)j.batch, n->kv_heads, (int64_t)j.present_len, (int64_t)j.head};
    TRY(output(ctx, 0, out_dims, 3, &j.out));
    TRY(output(ctx, 1, kv_dims, 4, &j.present_k));
    TRY(output(ctx, 2, kv_dims, 4, &j.present_v));
    j.shared = j.present_k == j.past_k && j.present_v == j.past_v; /* both, as ORT tests it */
    const size_t kv_tasks = j.batch * (size_t)n->kv_heads, rows = (size_t)(n->heads / n->kv_heads) * j.seq;
    const size_t R = (size_t)n->attention->q_rows, tiles = kv_tasks * ((rows + R - 1) / R);
    if (!j.seq || !j.batch) return NULL;
    TRY(ort->KernelContext_ParallelFor(ctx, fill_present, kv_tasks, 0, &j)); /* every tile below reads it all */
    TRY(ort->KernelContext_ParallelFor(ctx, attend_tile, tiles, 0, &j));
    if (j.status == 2) return fail(ORT_FAIL, "imegen: node '%s': out of memory for attention", n->name);
    if (j.status) return fail(ORT_FAIL, "imegen: node '%s': attention kernel %s failed", n->name, n->attention->name);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ ORT glue */
struct imegen_op {
    OrtCustomOp base; /* first: ORT hands back the OrtCustomOp pointer */
    enum op_id id;
};

static struct imegen_op ops[N_OPS];

static enum op_id id_of(const OrtCustomOp *op) { return ((const struct imegen_op *)op)->id; }

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info,
                                             void **kernel) {
    (void)api;
    struct node *n = calloc(1, sizeof *n);
    if (!n) return fail(ORT_FAIL, "imegen: out of memory");
    OrtStatus *st = create_node(id_of(op), info, n);
    if (st) {
        free(n);
        return st;
    }
    __atomic_fetch_add(&op_nodes[n->op], 1, __ATOMIC_RELAXED);
    *kernel = n;
    return NULL;
}

static OrtStatus *ORT_API_CALL compute(void *kernel, OrtKernelContext *ctx) {
    const struct node *n = kernel;
    __atomic_fetch_add(&op_calls[n->op], 1, __ATOMIC_RELAXED);
    switch (n->op) {
    case OP_NORM:
    case OP_SKIP_NORM: return compute_norm(n, ctx);
    case OP_SILU_MUL: return compute_silu_mul(n, ctx);
    case OP_GQA: return compute_gqa(n, ctx);
    default: return fail(ORT_FAIL, "imegen: unknown decoder operator");
    }
}

static void destroy(void *kernel) {
    struct node *n = kernel;
    if (n) __atomic_fetch_sub(&op_nodes[n->op], 1, __ATOMIC_RELAXED);
    free(n);
}

static const char *ORT_API_CALL op_name(const OrtCustomOp *op) { return descs[id_of(op)].name; }
static size_t ORT_API_CALL input_count(const OrtCustomOp *op) { return descs[id_of(op)].inputs; }
static size_t ORT_API_CALL output_count(const OrtCustomOp *op) { return descs[id_of(op)].outputs; }
static ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp *op, size_t i) {
    return descs[id_of(op)].in_types[i];
}
static ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp *op, size_t i) {
    (void)op, (void)i;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_char(const OrtCustomOp *op, size_t i) {
    return i < descs[id_of(op)].required_inputs ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL output_char(const OrtCustomOp *op, size_t i) {
    (void)op, (void)i;
    return INPUT_OUTPUT_REQUIRED;
}

void imegen_decoder_ops_init(const OrtApi *api) {
    ort = api;
    for (int i = 0; i < N_OPS; i++) {
        OrtCustomOp *op = &ops[i].base;
        memset(&ops[i], 0, sizeof ops[i]);
        ops[i].id = (enum op_id)i;
        op->version = ORT_API_VERSION;
        op->GetName = op_name;
        op->GetExecutionProviderType = op_provider;
        op->GetInputType = input_type;
        op->GetInputTypeCount = input_count;
        op->GetOutputType = output_type;
        op->GetOutputTypeCount = output_count;
        op->KernelDestroy = destroy;
        op->GetInputCharacteristic = input_char;
        op->GetOutputCharacteristic = output_char;
        op->GetInputMemoryType = input_mem;
        op->GetVariadicInputMinArity = one;
        op->GetVariadicInputHomogeneity = one;
        op->GetVariadicOutputMinArity = one;
        op->GetVariadicOutputHomogeneity = one;
        op->CreateKernelV2 = create_kernel;
        op->KernelComputeV2 = compute;
        op->GetStartVersion = start_version;
        op->GetEndVersion = end_version;
    }
}

OrtStatus *imegen_decoder_ops_add(OrtCustomOpDomain *domain) {
    for (int i = 0; i < N_OPS; i++) TRY(ort->CustomOpDomain_Add(domain, &ops[i].base));
    return NULL;
}

void imegen_decoder_ops_stats(imegen_append_fn append, size_t *at) {
    for (int i = 0; i < N_OPS; i++) {
        const unsigned long nodes = __atomic_load_n(&op_nodes[i], __ATOMIC_RELAXED);
        const unsigned long runs = __atomic_load_n(&op_calls[i], __ATOMIC_RELAXED);
        if (nodes || runs) append(at, "decoder %s nodes %lu calls %lu\n", descs[i].name, nodes, runs);
    }
}
