/* imegen's ONNX Runtime custom-op library: MatMulNBits in domain IMEGEN_DOMAIN on imegen kernels.
 *
 * Load it with SessionOptions.register_custom_ops_library (Python) or RegisterCustomOpsLibrary_V2 (C);
 * `imegen ort-rewrite` moves a model's com.microsoft MatMulNBits nodes into the domain. At session
 * creation each node is matched to the kernel table (bits, block size, accuracy level -> compute type,
 * zero points, bias) and B/scales/zero points, which must be constant initializers, are packed once per
 * kernel; nodes nothing serves, or kernels the hart cannot run (VLEN), fail the session with a message
 * naming the node. B is packed in SLICES column slices; a Run quantizes A once and runs the slices on ORT's
 * intra-op pool (KernelContext_ParallelFor), each streaming only its own columns of B.
 * IMEGEN_IME_EMULATION (the QEMU flavour, never the hardware build) links the SIGILL IME emulator. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "customop_lib.h"
#include "onnxruntime_c_api.h"
#ifdef IMEGEN_IME_EMULATION
#include "ime_emu.h"
#endif

#ifndef IMEGEN_DOMAIN
#define IMEGEN_DOMAIN "ai.imegen"
#endif
#define MAX_KERNELS 256
/* Column slices of a node's B: one per IME core of a K1 (cores 0-3), the threads ORT should run there. */
#define SLICES 4

enum { IN_A, IN_B, IN_SCALES, IN_ZP, IN_GIDX, IN_BIAS, N_INPUTS };

static const OrtApi *ort;
static unsigned long calls[MAX_KERNELS];
static char stats_text[64 * MAX_KERNELS];

struct node {
    char name[256];
    size_t N, K;
    int has_bias;
    const struct imegen_kernel_entry *gemv, *gemm; /* M = 1 and M > 1 (the same one if only one serves) */
    size_t slices, width;                           /* column slices of B: width columns each, the last the rest */
    void *packed_gemv[SLICES], *packed_gemm[SLICES]; /* each slice packed on its own */
};

struct slices_job {
    const struct node *node;
    const struct imegen_kernel_entry *k;
    void *const *packed;
    const void *workspace; /* A, quantized once per Run; the slices only read it */
    const float *bias;
    float *C;
    size_t M;
    int status;
};

static OrtStatus *fail(OrtErrorCode code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ort->CreateStatus(code, msg);
}

#define TRY(call) do { OrtStatus *st_ = (call); if (st_) return st_; } while (0)

/* Read-only data of an input (the C API has only the mutable getter). */
static OrtStatus *tensor_data(const OrtValue *v, const void **out) {
    void *p;
    OrtStatus *st = ort->GetTensorMutableData((OrtValue *)v, &p);
    *out = p;
    return st;
}

static int64_t attr(const OrtKernelInfo *info, const char *name, int64_t fallback) {
    int64_t v;
    OrtStatus *st = ort->KernelInfoGetAttribute_int64(info, name, &v);
    if (st) {
        ort->ReleaseStatus(st);
        return fallback;
    }
    return v;
}

/* 1 when optional input i is wired (ORT gives absent optional inputs the name ""). */
static int present(const OrtKernelInfo *info, size_t count, size_t i) {
    char name[512];
    size_t size = sizeof name;
    if (i >= count) return 0;
    OrtStatus *st = ort->KernelInfo_GetInputName(info, i, name, &size);
    if (st) {
        ort->ReleaseStatus(st);
        return 1; /* a name too long for the buffer is still a name */
    }
    return name[0] != 0;
}

/* The constant initializer behind input i with its element type and count, or an error naming the node. */
static OrtStatus *constant(const OrtKernelInfo *info, const struct node *n, size_t i, const char *what,
                           ONNXTensorElementDataType type, size_t count, const void **data) {
    int is_constant = 0;
    const OrtValue *v = NULL;
    TRY(ort->KernelInfoGetConstantInput_tensor(info, i, &is_constant, &v));
    if (!is_constant || !v)
        return fail(ORT_INVALID_GRAPH, "imegen: node '%s': %s is not a constant initializer (imegen packs it once at "
                    "session creation); keep this node in com.microsoft", n->name, what);
    OrtTensorTypeAndShapeInfo *shape;
    ONNXTensorElementDataType t;
    size_t have;
    TRY(ort->GetTensorTypeAndShape(v, &shape));
    OrtStatus *st = ort->GetTensorElementType(shape, &t);
    if (!st) st = ort->GetTensorShapeElementCount(shape, &have);
    ort->ReleaseTensorTypeAndShapeInfo(shape);
    if (st) return st;
    if (t != type)
        return fail(ORT_INVALID_GRAPH, "imegen: node '%s': %s has element type %d, expected %d", n->name, what, (int)t,
                    (int)type);
    if (have != count)
        return fail(ORT_INVALID_GRAPH, "imegen: node '%s': %s has %zu elements, expected %zu for N = %zu, K = %zu",
                    n->name, what, have, count, n->N, n->K);
    return tensor_data(v, data);
}

static const struct imegen_kernel_entry *find(int gemv, int bits, int block, int int8, int asym, int bias) {
    for (size_t i = 0; i < imegen_kernel_count; i++) {
        const struct imegen_kernel_entry *k = &imegen_kernels[i];
        if (k->gemv == gemv && k->bits == bits && k->block == block && k->int8_compute == int8 &&
            k->asymmetric == asym && k->bias == bias)
            return k;
    }
    return NULL;
}

static OrtStatus *check_hart(const struct node *n, const struct imegen_kernel_entry *k) {
    if (k->supported()) return NULL;
    if (!strcmp(k->target, "ime"))
        return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': kernel %s uses SpacemiT IME (vmadot, VLEN 256), which this "
                    "hart lacks; on a K1 run on the IME cores (taskset -c 0-3)", n->name, k->name);
    return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': kernel %s needs RVV with VLEN >= %d, which this hart lacks",
                n->name, k->name, k->vlen);
}

/* B's column slices, each packed on its own: ORT's B, scales and zero points are [N][...] arrays, so a slice's
 * columns are one contiguous run of each. */
static OrtStatus *pack(const struct node *n, const struct imegen_kernel_entry *k, const uint8_t *b,
                       const float *scales, const uint8_t *zp, void **out) {
    TRY(check_hart(n, k));
#ifdef IMEGEN_IME_EMULATION
    static int installed;
    if (!strcmp(k->target, "ime") && !__atomic_exchange_n(&installed, 1, __ATOMIC_SEQ_CST)) imegen_ime_emu_install();
#endif
    const size_t kb = (n->K + (size_t)k->block - 1) / (size_t)k->block, blob = (size_t)(k->block * k->bits / 8);
    const size_t zstride = (kb * (size_t)k->bits + 7) / 8;
    for (size_t i = 0; i < n->slices; i++) {
        const size_t n0 = i * n->width, cols = n->N - n0 < n->width ? n->N - n0 : n->width;
        out[i] = malloc(k->packed_b_size(cols, n->K) + 1); /* malloc's alignment: packed B must be 8-byte aligned */
        if (!out[i]) return fail(ORT_FAIL, "imegen: node '%s': out of memory packing B", n->name);
        k->pack_b(cols, n->K, b + n0 * kb * blob, scales + n0 * kb, zp ? zp + n0 * zstride : NULL, out[i]);
    }
    return NULL;
}

static void destroy(void *p) {
    struct node *n = p;
    if (!n) return;
    for (size_t i = 0; i < SLICES; i++) {
        if (n->packed_gemm[i] != n->packed_gemv[i]) free(n->packed_gemm[i]);
        free(n->packed_gemv[i]);
    }
    free(n);
}

static size_t gcd(size_t a, size_t b) { return b ? gcd(b, a % b) : a; }

static OrtStatus *create(const OrtKernelInfo *info, struct node *n) {
    size_t size = sizeof n->name, count = 0;
    OrtStatus *st = ort->KernelInfo_GetNodeName(info, n->name, &size);
    if (st) ort->ReleaseStatus(st), snprintf(n->name, sizeof n->name, "?");
    if (!n->name[0]) snprintf(n->name, sizeof n->name, "(unnamed MatMulNBits)");
    TRY(ort->KernelInfo_GetInputCount(info, &count));
    const int64_t K = attr(info, "K", -1), N = attr(info, "N", -1), bits = attr(info, "bits", 4),
                  block = attr(info, "block_size", -1), level = attr(info, "accuracy_level", 0);
    if (K <= 0 || N <= 0 || block <= 0)
        return fail(ORT_INVALID_GRAPH, "imegen: node '%s': attributes K, N and block_size must be positive", n->name);
    n->K = (size_t)K, n->N = (size_t)N;
    const int asym = present(info, count, IN_ZP);
    n->has_bias = present(info, count, IN_BIAS);
    if (present(info, count, IN_GIDX))
        return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': g_idx (act-order) is not supported", n->name);
    if (level != 0 && level != 1 && level != 4)
        return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': accuracy_level %lld (imegen serves 0/1: fp32, 4: int8)",
                    n->name, (long long)level);
    const int int8 = level == 4;
    n->gemv = find(1, (int)bits, (int)block, int8, asym, n->has_bias);
    n->gemm = find(0, (int)bits, (int)block, int8, asym, n->has_bias);
    if (!n->gemv && !n->gemm)
        return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': no kernel in %s serves bits %lld, block_size %lld, %s "
                    "compute, %s zero points, %s bias", n->name, imegen_spec_file, (long long)bits, (long long)block,
                    int8 ? "int8" : "fp32", asym ? "asymmetric" : "symmetric", n->has_bias ? "with" : "no");
    if (!n->gemv) n->gemv = n->gemm;
    if (!n->gemm) n->gemm = n->gemv;
    const size_t k_blocks = (n->K + (size_t)block - 1) / (size_t)block;
    const void *b, *scales, *zp = NULL;
    TRY(constant(info, n, IN_B, "B", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, n->N * k_blocks * (size_t)(block * bits / 8), &b));
    TRY(constant(info, n, IN_SCALES, "scales", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, n->N * k_blocks, &scales));
    if (asym)
        TRY(constant(info, n, IN_ZP, "zero_points (uint8)", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
                     n->N * ((k_blocks * (size_t)bits + 7) / 8), &zp));
    /* Slices of whole panels of both kernels (no padding inside a row of slices), at most SLICES of them. */
    const size_t pv = (size_t)n->gemv->panel, pm = (size_t)n->gemm->panel, unit = pv / gcd(pv, pm) * pm;
    n->width = ((n->N + SLICES - 1) / SLICES + unit - 1) / unit * unit;
    n->slices = (n->N + n->width - 1) / n->width;
    TRY(pack(n, n->gemv, b, scales, zp, n->packed_gemv));
    if (n->gemm == n->gemv) memcpy(n->packed_gemm, n->packed_gemv, sizeof n->packed_gemm);
    else TRY(pack(n, n->gemm, b, scales, zp, n->packed_gemm));
    return NULL;
}

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info,
                                             void **kernel) {
    (void)op, (void)api;
    struct node *n = calloc(1, sizeof *n);
    if (!n) return fail(ORT_FAIL, "imegen: out of memory");
    OrtStatus *st = create(info, n);
    if (st) {
        destroy(n);
        return st;
    }
    *kernel = n;
    return NULL;
}

static void run_slice(void *p, size_t i) {
    struct slices_job *j = p;
    const struct node *n = j->node;
    const size_t n0 = i * n->width, cols = n->N - n0 < n->width ? n->N - n0 : n->width;
    const size_t scratch_bytes = j->k->scratch_size(n->K);
    void *scratch = scratch_bytes ? malloc(scratch_bytes) : NULL; /* a staged B: its own per slice */
    if (scratch_bytes && !scratch) {
        __atomic_store_n(&j->status, -1, __ATOMIC_RELAXED);
        return;
    }
    const int status = j->k->matmul_prepared(j->M, cols, n->K, j->packed[i], j->bias ? j->bias + n0 : NULL, j->C + n0,
                                             n->N, j->workspace, scratch);
    if (status) __atomic_store_n(&j->status, status, __ATOMIC_RELAXED);
    free(scratch);
}

static OrtStatus *ORT_API_CALL compute(void *kernel, OrtKernelContext *ctx) {
    const struct node *n = kernel;
    const OrtValue *a_value, *bias_value = NULL;
    TRY(ort->KernelContext_GetInput(ctx, IN_A, &a_value));
    if (n->has_bias) TRY(ort->KernelContext_GetInput(ctx, IN_BIAS, &bias_value));
    OrtTensorTypeAndShapeInfo *shape;
    size_t rank;
    int64_t dims[16];
    TRY(ort->GetTensorTypeAndShape(a_value, &shape));
    OrtStatus *st = ort->GetDimensionsCount(shape, &rank);
    if (!st && (rank < 1 || rank > 16)) st = fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': A has rank %zu", n->name, rank);
    if (!st) st = ort->GetDimensions(shape, dims, rank);
    ort->ReleaseTensorTypeAndShapeInfo(shape);
    if (st) return st;
    if (dims[rank - 1] != (int64_t)n->K)
        return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': A's last dimension is %lld, expected K = %zu", n->name,
                    (long long)dims[rank - 1], n->K);
    size_t M = 1;
    for (size_t i = 0; i + 1 < rank; i++) M *= (size_t)dims[i];
    if (n->has_bias) {
        OrtTensorTypeAndShapeInfo *bshape;
        size_t bcount = 0;
        TRY(ort->GetTensorTypeAndShape(bias_value, &bshape));
        st = ort->GetTensorShapeElementCount(bshape, &bcount);
        ort->ReleaseTensorTypeAndShapeInfo(bshape);
        if (st) return st;
        if (bcount != n->N)
            return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': bias has %zu elements, expected N = %zu", n->name,
                        bcount, n->N);
    }
    dims[rank - 1] = (int64_t)n->N;
    OrtValue *c_value;
    TRY(ort->KernelContext_GetOutput(ctx, 0, dims, rank, &c_value));
    if (M == 0) return NULL;
    const struct imegen_kernel_entry *k = M == 1 ? n->gemv : n->gemm;
    struct slices_job j = {n, k, M == 1 ? n->packed_gemv : n->packed_gemm, NULL, NULL, NULL, M, 0};
    const void *a, *bias = NULL;
    void *c;
    TRY(tensor_data(a_value, &a));
    if (bias_value) TRY(tensor_data(bias_value, &bias));
    TRY(ort->GetTensorMutableData(c_value, &c));
    const size_t ws_bytes = k->workspace_size(M, n->K); /* 0: M over IMEGEN_MAX_DIM */
    if (!ws_bytes) return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': A has %zu rows, more than imegen's kernels take",
                               n->name, M);
    void *ws = malloc(ws_bytes);
    if (!ws) return fail(ORT_FAIL, "imegen: node '%s': out of memory for the workspace (M = %zu)", n->name, M);
    k->prepare_a(M, n->K, a, n->K, ws); /* A quantized once; every slice reads it */
    j.workspace = ws, j.bias = bias, j.C = c;
    __atomic_fetch_add(&calls[k - imegen_kernels], 1, __ATOMIC_RELAXED);
    if (n->slices == 1) run_slice(&j, 0);
    else st = ort->KernelContext_ParallelFor(ctx, run_slice, n->slices, 0, &j);
    free(ws);
    if (st) return st;
    if (j.status)
        return fail(ORT_FAIL, "imegen: node '%s': kernel %s failed (status %d%s)", n->name, j.k->name, j.status,
                    j.status == 1 ? ": VLEN not accepted on this hart" : j.status == 3 ? ": an A block's max |a| exceeds 127 x 65504, or A holds a NaN (fp16 A scales)"
                    : j.status < 0 ? ": out of memory" : "");
    return NULL;
}

static const char *ORT_API_CALL op_name(const OrtCustomOp *op) { (void)op; return "MatMulNBits"; }
static const char *ORT_API_CALL op_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp *op, size_t i) {
    (void)op;
    static const ONNXTensorElementDataType types[N_INPUTS] = {
        ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
        ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, /* zero points: uint8 checked at creation (float ones refused) */
        ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
    return types[i];
}
static size_t ORT_API_CALL input_count(const OrtCustomOp *op) { (void)op; return N_INPUTS; }
static ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp *op, size_t i) {
    (void)op, (void)i;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static size_t ORT_API_CALL output_count(const OrtCustomOp *op) { (void)op; return 1; }
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_char(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i < IN_ZP ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL output_char(const OrtCustomOp *op, size_t i) {
    (void)op, (void)i;
    return INPUT_OUTPUT_REQUIRED;
}
static OrtMemType ORT_API_CALL input_mem(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return OrtMemTypeDefault; }
static int ORT_API_CALL one(const OrtCustomOp *op) { (void)op; return 1; }
static int ORT_API_CALL start_version(const OrtCustomOp *op) { (void)op; return 1; }
static int ORT_API_CALL end_version(const OrtCustomOp *op) { (void)op; return 2147483647; }

static OrtCustomOp matmul_nbits_op;

/* Per kernel: "NAME calls N" lines, then "vmadots N" in emulation builds (for tests and ort-model-check). */
const char *imegen_ort_stats(void) {
    size_t at = 0;
    for (size_t i = 0; i < imegen_kernel_count && i < MAX_KERNELS; i++)
        at += (size_t)snprintf(stats_text + at, sizeof stats_text - at, "%s calls %lu\n", imegen_kernels[i].name,
                               __atomic_load_n(&calls[i], __ATOMIC_RELAXED));
#ifdef IMEGEN_IME_EMULATION
    snprintf(stats_text + at, sizeof stats_text - at, "vmadots %lu\n", imegen_ime_emu_count());
#endif
    return stats_text;
}

OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    ort = base->GetApi(ORT_API_VERSION);
    if (!ort) return NULL; /* an ORT older than the header: it cannot report an error through this API either */
    if (imegen_kernel_count > MAX_KERNELS) return fail(ORT_FAIL, "imegen: more than %d kernels", MAX_KERNELS);
    OrtCustomOp *op = &matmul_nbits_op;
    memset(op, 0, sizeof *op);
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
    OrtCustomOpDomain *domain;
    TRY(ort->CreateCustomOpDomain(IMEGEN_DOMAIN, &domain));
    TRY(ort->CustomOpDomain_Add(domain, op));
    return ort->AddCustomOpDomain(options, domain);
}
