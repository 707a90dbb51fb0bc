/* imegen's ONNX Runtime custom-op library: MatMulNBits in domain IMEGEN_DOMAIN on imegen kernels.
 *
 * Load it with SessionOptions.register_custom_ops_library (Python) or RegisterCustomOpsLibrary_V2 (C);
 * `imegen ort-rewrite` / `imegen ort-accelerate` move a model's com.microsoft MatMulNBits nodes into the
 * domain. At session creation each node is matched to the kernel table by imegen/ort/serving.py's rule
 * (bits, block size, accuracy level -> compute type, zero points, bias; then the node's weight shape and,
 * per Run, its rows of A), and B/scales/zero points, which must be constant initializers, are packed once
 * per packing layout; nodes nothing serves, or kernels the hart cannot run (VLEN), fail the session with a
 * message naming the node. B is packed in SLICES column slices; a Run quantizes A once and runs the slices
 * on ORT's intra-op pool (KernelContext_ParallelFor), each streaming only its own columns of B.
 *
 * IME exists only on some harts (a K1's cores 0-3; a K3's A100 cores have IME2). The library is built for one
 * board (IMEGEN_IME_MARCHID and the rest below, from the IME target's ImeHarts), finds its harts at load
 * (/proc/cpuinfo marchid, or IMEGEN_IME_HARTS) and runs an IME slice only on a thread confined to them: on a K1
 * it pins the thread there for the slice; on a K3 the thread asks the kernel to make it an A100 thread for good
 * (IMEGEN_IME_ROUTE_FILE; pinned as on the K1 where that file is absent); where neither works it runs the node's
 * fallback kernel (rvv) for that slice. It never issues a vmadot elsewhere. IMEGEN_IME_EMULATION (the QEMU
 * flavour, never the hardware build) links the board's SIGILL emulator (IMEGEN_EMULATOR), which gives every
 * hart IME unless IMEGEN_IME_HARTS says otherwise. */
#define _GNU_SOURCE /* sched_setaffinity, cpu_set_t */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "customop_lib.h"
#include "decoder_ops.h"
#include "harts.h"
#include "onnxruntime_c_api.h"
#include "ort_glue.h"
#include <fcntl.h>

/* The board of the library's IME kernels (customop.py passes the target's ImeHarts): the marchid of its IME
 * harts, how many there are, where (for messages), and the file a thread writes to be routed there (K3). A
 * library with no IME kernel gets the K1's. */
#ifndef IMEGEN_IME_MARCHID
#define IMEGEN_IME_MARCHID IMEGEN_MARCHID_A60
#define IMEGEN_IME_BOARD "K1"
#define IMEGEN_IME_CORES 4
#define IMEGEN_IME_WHERE "0-3"
#endif

#ifdef IMEGEN_IME_EMULATION /* runtime/NAME.c for IMEGEN_EMULATOR=NAME */
#include "emulator.h"
#endif

#ifndef IMEGEN_DOMAIN
#define IMEGEN_DOMAIN "ai.imegen"
#endif
#define MAX_KERNELS 256
/* Column slices of a node's B: one per IME core (a K1's cores 0-3), the threads ORT should run there. */
#define SLICES IMEGEN_IME_CORES
/* Kernels one node may run: a gemv, up to MAX_GEMM gemm kernels for different row counts, a fallback
 * (imegen/ort/serving.py refuses a node more gemm kernels would serve, with the same limit). */
#define MAX_GEMM 14
#define NODE_KERNELS (MAX_GEMM + 2)

/* IN_GATE, imegen's own: Y = silu(gate) * (A B + bias), a gated MLP's up projection with its SiLU (decoder_ops.py
 * fuses Sigmoid, Mul, Mul into it), applied to each block of C as the kernel finishes it (matmul_prepared_then). */
enum { IN_A, IN_B, IN_SCALES, IN_ZP, IN_GIDX, IN_BIAS, IN_GATE, N_INPUTS };
/* matmul status codes of the library's own (negative: never a kernel's) */
enum { ST_NO_MEMORY = -1, ST_NO_IME_HART = -2, ST_NO_FALLBACK_PACK = -3 };

typedef struct imegen_kernel_entry kernel_t;

static unsigned long calls[MAX_KERNELS];

/* ----------------------------------------------------------------------------------------- IME harts */
static cpu_set_t ime_harts;
static int ime_hart_count;
static char ime_harts_from[160]; /* where the set came from, for imegen_ort_stats() and messages */
static unsigned long slices_on_ime, slices_pinned, slices_fallback;
#ifdef IMEGEN_IME_PREPARE_THERE
static unsigned long prepares_on_ime, prepares_pinned; /* where A was quantized (prepare_a) */
#endif
static unsigned long gated_calls; /* Runs of nodes with a SiLU gate (IN_GATE) */
static unsigned long long packed_bytes; /* B packed by live nodes: the memory the library adds to ORT's */

static void set_source(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ime_harts_from, sizeof ime_harts_from, fmt, ap);
    va_end(ap);
}

/* "0-3" for the set (at most `size` bytes). */
static void format_harts(const cpu_set_t *set, char *out, size_t size) {
    size_t at = 0;
    out[0] = 0;
    for (int h = 0; h < CPU_SETSIZE && at < size; h++) {
        if (!CPU_ISSET(h, set) || (h > 0 && CPU_ISSET(h - 1, set))) continue;
        int last = h;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, set)) last++;
        at += (size_t)snprintf(out + at, size - at, last > h ? "%s%d-%d" : "%s%d", at ? "," : "", h, last);
    }
    if (!out[0]) snprintf(out, size, "none");
}

/* Which harts may run vmadot; NULL, or an error message for a malformed IMEGEN_IME_HARTS. */
static const char *find_ime_harts(void) {
    CPU_ZERO(&ime_harts);
    const char *env = getenv(IMEGEN_IME_HARTS_ENV);
    if (env) {
        if (imegen_parse_harts(env, &ime_harts)) return "is not a hart list (e.g. 0-3, 0,2, or none)";
        set_source("%s", IMEGEN_IME_HARTS_ENV);
    } else {
#ifdef IMEGEN_IME_EMULATION
        long harts = sysconf(_SC_NPROCESSORS_CONF);
        for (long h = 0; h < harts && h < CPU_SETSIZE; h++) CPU_SET(h, &ime_harts);
        set_source("the IME emulator (every hart)");
#else
        FILE *f = fopen("/proc/cpuinfo", "r");
        const int reported = f ? imegen_harts_from_cpuinfo(f, &ime_harts, IMEGEN_IME_MARCHID) : 0;
        if (f) fclose(f);
        set_source(reported ? "/proc/cpuinfo marchid" : "/proc/cpuinfo (no marchid: not a SpacemiT " IMEGEN_IME_BOARD
                   "?)");
#endif
    }
    ime_hart_count = CPU_COUNT(&ime_harts);
    return NULL;
}

/* Is every hart of `mask` an IME hart? */
static int confined(const cpu_set_t *mask) {
    cpu_set_t outside;
    CPU_XOR(&outside, mask, &ime_harts);
    CPU_AND(&outside, &outside, mask);
    return !CPU_COUNT(&outside);
}

#ifdef IMEGEN_IME_ROUTE_FILE
/* Ask the kernel to make the calling thread one of the IME harts' for good (a K3's /proc/set_ai_thread: "0" is
 * the calling thread, as llama.cpp's SpacemiT backend writes it). 1 when the thread is confined to IME harts
 * afterwards: its own affinity, not the write's success, is the proof. */
static int route_file_missing; /* once open() said ENOENT: every later slice would only repeat that syscall */

static int routed_for_good(void) {
    if (__atomic_load_n(&route_file_missing, __ATOMIC_RELAXED)) return 0;
    const int fd = open(IMEGEN_IME_ROUTE_FILE, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) __atomic_store_n(&route_file_missing, 1, __ATOMIC_RELAXED);
        return 0;
    }
    const ssize_t wrote = write(fd, "0", 1);
    close(fd);
    cpu_set_t now;
    return wrote == 1 && !sched_getaffinity(0, sizeof now, &now) && confined(&now);
}
#endif

/* Confine the calling thread to IME harts for one slice: 0 when it already is, 1 when pinned now (*saved
 * holds its mask to restore), 2 when routed there for good (nothing to restore), -1 when it cannot be (no IME
 * hart, or the system refuses). */
static int enter_ime_harts(cpu_set_t *saved) {
    if (!ime_hart_count || sched_getaffinity(0, sizeof *saved, saved)) return -1;
    if (confined(saved)) return 0;
#ifdef IMEGEN_IME_ROUTE_FILE
    if (routed_for_good()) return 2;
#endif
    cpu_set_t target;
    CPU_AND(&target, saved, &ime_harts); /* the IME harts it may already use, else all of them */
    if (!CPU_COUNT(&target)) target = ime_harts;
    return sched_setaffinity(0, sizeof target, &target) ? -1 : 1;
}

/* pthread_once's job without it: glibc moved pthread_once into libc in 2.34 (a new symbol version), and the
 * hardware flavour must load with a K1 distribution's glibc 2.27 and later (tests/test_hardware_flavour.py). */
struct once {
    int done;
    pthread_mutex_t lock;
};

static void once(struct once *o, void (*fn)(void)) {
    if (__atomic_load_n(&o->done, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&o->lock);
    if (!o->done) {
        fn();
        __atomic_store_n(&o->done, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&o->lock);
}

/* ------------------------------------------------------------------------------------------- nodes */
struct packed {
    int layout;
    void *slice[SLICES]; /* each column slice packed on its own */
};

struct node {
    char name[256];
    size_t N, K;
    int has_bias, gated;
    const kernel_t *gemv;             /* M = 1 (NULL: the gemm rule) */
    const kernel_t *gemm[NODE_KERNELS]; /* M > 1: ascending min_rows, the last with min_rows <= M */
    size_t n_gemm;
    const kernel_t *fallback;         /* slices that cannot reach an IME hart (NULL: none) */
    size_t slices, width;             /* column slices of B: width columns each, the last the rest */
    struct packed packs[NODE_KERNELS];
    size_t n_packs;
    size_t bytes; /* of all its packed copies */
    const uint8_t *b;                 /* ORT's constant initializers: the fallback packs from them late */
    const float *scales;
    const uint8_t *zp;
    pthread_mutex_t lock;             /* the fallback's late packing */
    struct node *next;                /* every live node, for imegen_ort_stats() */
};

static struct node *live_nodes;
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;

struct slices_job {
    const struct node *node;
    const kernel_t *k;
    void *const *packed;
    const float *A;        /* the fallback quantizes its own */
    const void *workspace; /* A, quantized once per Run by k; k's slices only read it */
    const float *bias;
    const float *gate; /* [M][N] (NULL: not gated) */
    float *C;
    size_t M;
    int status;
    int fell_back; /* some slice ran on the fallback kernel */
    int unprepared; /* A could not be quantized on an IME hart: every slice runs the fallback */
};

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

/* ------------------------------------------------------------------------------- kernel selection */
/* What a node asks of its kernels (imegen/ort/serving.py's NodeNeeds). */
struct needs {
    int bits, block, int8, asym, bias;
    size_t N, K;
};

static int is_ime(const kernel_t *k) { return k->needs_ime; }

static int matches(const kernel_t *k, const struct needs *q) {
    return k->bits == q->bits && k->block == q->block && k->int8_compute == q->int8 && k->asymmetric == q->asym &&
           k->bias == q->bias;
}

static int chosen_for_shape(const kernel_t *k, const struct needs *q) {
    for (size_t i = 0; i < k->n_shapes; i++)
        if (k->shapes[2 * i] == q->N && k->shapes[2 * i + 1] == q->K) return 1;
    return 0;
}

enum kind { GEMV, GEMM, FALLBACK };

static int of_kind(const kernel_t *k, enum kind kind) {
    return kind == FALLBACK ? k->fallback : !k->fallback && k->gemv == (kind == GEMV);
}

/* The node's kernels of one kind in spec order: those chosen for its shape, else those chosen for none. */
static size_t candidates(const struct needs *q, enum kind kind, const kernel_t **out) {
    size_t count = 0;
    for (int generic = 0; generic < 2 && !count; generic++)
        for (size_t i = 0; i < imegen_kernel_count && count < MAX_KERNELS; i++) {
            const kernel_t *k = &imegen_kernels[i];
            if (matches(k, q) && of_kind(k, kind) && (generic ? k->n_shapes == 0 : chosen_for_shape(k, q)))
                out[count++] = k;
        }
    return count;
}

/* gemv, the gemm kernels (the spec's first per min_rows, ascending) and, for IME, the fallback; 0, or -1 when
 * more than MAX_GEMM gemm kernels would serve the node. */
static int choose(struct node *n, const struct needs *q) {
    const kernel_t *found[MAX_KERNELS];
    n->gemv = candidates(q, GEMV, found) ? found[0] : NULL;
    size_t count = candidates(q, GEMM, found);
    n->n_gemm = 0;
    for (size_t i = 0; i < count; i++) {
        size_t at = n->n_gemm, dup = 0;
        for (size_t j = 0; j < n->n_gemm; j++) dup |= n->gemm[j]->min_rows == found[i]->min_rows;
        if (dup) continue;
        if (n->n_gemm == MAX_GEMM) return -1;
        while (at > 0 && n->gemm[at - 1]->min_rows > found[i]->min_rows) n->gemm[at] = n->gemm[at - 1], at--;
        n->gemm[at] = found[i], n->n_gemm++;
    }
    int ime = n->gemv && is_ime(n->gemv);
    for (size_t i = 0; i < n->n_gemm; i++) ime |= is_ime(n->gemm[i]);
    n->fallback = ime && candidates(q, FALLBACK, found) ? found[0] : NULL;
    return 0;
}

static const kernel_t *kernel_for(const struct node *n, size_t M) {
    if (M == 1 && n->gemv) return n->gemv;
    const kernel_t *best = NULL;
    for (size_t i = 0; i < n->n_gemm; i++)
        if (n->gemm[i]->min_rows <= M) best = n->gemm[i];
    return best ? best : n->n_gemm ? n->gemm[0] : n->gemv;
}

/* kernel_for on this process's harts: with no IME hart, the fallback (or a kernel that is not IME). */
static const kernel_t *runnable_kernel_for(const struct node *n, size_t M) {
    const kernel_t *k = kernel_for(n, M);
    if (!is_ime(k) || ime_hart_count) return k;
    if (n->fallback) return n->fallback;
    if (n->gemv && !is_ime(n->gemv)) return n->gemv;
    for (size_t i = 0; i < n->n_gemm; i++)
        if (!is_ime(n->gemm[i])) return n->gemm[i];
    return NULL; /* create() refuses such a node */
}

/* The kernels a Run may use on this process's harts: IME ones only where some hart has IME. */
static size_t runnable(const struct node *n, const kernel_t **out) {
    size_t count = 0;
    const kernel_t *all[NODE_KERNELS + 2];
    size_t total = 0;
    if (n->gemv) all[total++] = n->gemv;
    for (size_t i = 0; i < n->n_gemm; i++) all[total++] = n->gemm[i];
    for (size_t i = 0; i < total; i++)
        if (!is_ime(all[i]) || ime_hart_count) out[count++] = all[i];
    if (n->fallback && (!ime_hart_count || count < total)) out[count++] = n->fallback;
    return count;
}

/* ------------------------------------------------------------------------------------------ packing */
static OrtStatus *check_hart(const struct node *n, const kernel_t *k) {
    if (k->supported()) return NULL;
    if (is_ime(k))
        return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': kernel %s uses SpacemiT IME (vmadot, VLEN 256), and this "
                    "hart's VLEN is not 256", n->name, k->name);
    return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': kernel %s needs RVV with VLEN >= %d, which this hart lacks",
                n->name, k->name, k->vlen);
}

/* The node's copy of B packed for `layout`, or NULL. Runs may read n_packs while a fallback slice appends
 * its copy (under n->lock): the release store in pack() publishes the entry before the count. */
static void **packed_slices(struct node *n, int layout) {
    const size_t count = __atomic_load_n(&n->n_packs, __ATOMIC_ACQUIRE);
    for (size_t i = 0; i < count; i++)
        if (n->packs[i].layout == layout) return n->packs[i].slice;
    return NULL;
}

/* B's column slices packed for k (once per layout): ORT's B, scales and zero points are [N][...] arrays, so a
 * slice's columns are one contiguous run of each. */
static OrtStatus *pack(struct node *n, const kernel_t *k) {
    TRY(check_hart(n, k));
    if (packed_slices(n, k->layout)) return NULL;
#ifdef IMEGEN_IME_EMULATION
    static struct once emulator = {0, PTHREAD_MUTEX_INITIALIZER}; /* every session waits for the handler */
    if (is_ime(k)) once(&emulator, emulator_install);
#endif
    struct packed *p = &n->packs[n->n_packs];
    const size_t kb = (n->K + (size_t)k->block - 1) / (size_t)k->block, blob = (size_t)(k->block * k->bits / 8);
    const size_t zstride = (kb * (size_t)k->bits + 7) / 8;
    size_t bytes = 0;
    for (size_t i = 0; i < n->slices; i++) {
        const size_t n0 = i * n->width, cols = n->N - n0 < n->width ? n->N - n0 : n->width;
        p->slice[i] = malloc(k->packed_b_size(cols, n->K) + 1); /* malloc's alignment: packed B must be 8-byte aligned */
        if (!p->slice[i]) {
            for (size_t j = 0; j < i; j++) free(p->slice[j]), p->slice[j] = NULL;
            return fail(ORT_FAIL, "imegen: node '%s': out of memory packing B", n->name);
        }
        bytes += k->packed_b_size(cols, n->K);
        k->pack_b(cols, n->K, n->b + n0 * kb * blob, n->scales + n0 * kb, n->zp ? n->zp + n0 * zstride : NULL,
                  p->slice[i]);
    }
    p->layout = k->layout;
    n->bytes += bytes;
    __atomic_fetch_add(&packed_bytes, bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&n->n_packs, n->n_packs + 1, __ATOMIC_RELEASE);
    return NULL;
}

static void forget(struct node *n) {
    pthread_mutex_lock(&live_lock);
    for (struct node **at = &live_nodes; *at; at = &(*at)->next)
        if (*at == n) {
            *at = n->next;
            break;
        }
    pthread_mutex_unlock(&live_lock);
}

static void destroy(void *p) {
    struct node *n = p;
    if (!n) return;
    forget(n);
    __atomic_fetch_sub(&packed_bytes, n->bytes, __ATOMIC_RELAXED);
    for (size_t i = 0; i < n->n_packs; i++)
        for (size_t s = 0; s < SLICES; s++) free(n->packs[i].slice[s]);
    pthread_mutex_destroy(&n->lock);
    free(n);
}

static size_t gcd(size_t a, size_t b) { return b ? gcd(b, a % b) : a; }

static OrtStatus *no_ime_hart(const struct node *n, const kernel_t *k) {
    return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': kernel %s uses SpacemiT IME, and no hart has it here (IME "
                "harts from %s: none), and %s has no fallback kernel (fallback = yes) for this node. On a "
                IMEGEN_IME_BOARD " IME is on cores " IMEGEN_IME_WHERE "; set %s=" IMEGEN_IME_WHERE " if this system hides marchid",
                n->name, k->name, ime_harts_from, imegen_spec_file, IMEGEN_IME_HARTS_ENV);
}

static OrtStatus *create(const OrtKernelInfo *info, struct node *n) {
    size_t size = sizeof n->name;
    OrtStatus *st = ort->KernelInfo_GetNodeName(info, n->name, &size);
    if (st) ort->ReleaseStatus(st), snprintf(n->name, sizeof n->name, "?");
    if (!n->name[0]) { /* as imegen/ort/rewrite.py names it */
        char out[200];
        size_t out_size = sizeof out;
        st = ort->KernelInfo_GetOutputName(info, 0, out, &out_size);
        if (st) ort->ReleaseStatus(st), snprintf(out, sizeof out, "?");
        snprintf(n->name, sizeof n->name, "(unnamed, output %s)", out);
    }
    const int64_t K = attr_int(info, "K", -1), N = attr_int(info, "N", -1), bits = attr_int(info, "bits", 4),
                  block = attr_int(info, "block_size", -1), level = attr_int(info, "accuracy_level", 0);
    if (K <= 0 || N <= 0 || block <= 0)
        return fail(ORT_INVALID_GRAPH, "imegen: node '%s': attributes K, N and block_size must be positive", n->name);
    n->K = (size_t)K, n->N = (size_t)N;
    n->has_bias = input_wired(info, IN_BIAS);
    n->gated = input_wired(info, IN_GATE);
    if (input_wired(info, IN_GIDX))
        return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': g_idx (act-order) is not supported", n->name);
    if (level < 0 || level > 4)
        return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': accuracy_level %lld is not one of ORT's 0-4", n->name,
                    (long long)level);
    /* Levels 0-3 compute in fp32 (ORT's CPU has no fp16/bf16 path for them), level 4 in int8. */
    const struct needs q = {(int)bits, (int)block, level == 4, input_wired(info, IN_ZP), n->has_bias, n->N, n->K};
    if (choose(n, &q))
        return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': more than %d gemm kernels (of different min_rows) in %s "
                    "serve it; the library holds at most %d per node", n->name, MAX_GEMM, imegen_spec_file, MAX_GEMM);
    if (!n->gemv && !n->n_gemm)
        return fail(ORT_NOT_IMPLEMENTED, "imegen: node '%s': no kernel in %s serves bits %lld, block_size %lld, %s "
                    "compute, %s zero points, %s bias", n->name, imegen_spec_file, (long long)bits, (long long)block,
                    q.int8 ? "int8" : "fp32", q.asym ? "asymmetric" : "symmetric", n->has_bias ? "with" : "no");
    const size_t k_blocks = (n->K + (size_t)block - 1) / (size_t)block;
    const void *b, *scales, *zp = NULL;
    TRY(constant(info, n, IN_B, "B", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, n->N * k_blocks * (size_t)(block * bits / 8), &b));
    TRY(constant(info, n, IN_SCALES, "scales", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, n->N * k_blocks, &scales));
    if (q.asym)
        TRY(constant(info, n, IN_ZP, "zero_points (uint8)", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
                     n->N * ((k_blocks * (size_t)bits + 7) / 8), &zp));
    n->b = b, n->scales = scales, n->zp = zp;
    const kernel_t *use[NODE_KERNELS + 2];
    const size_t n_use = runnable(n, use);
    if (!runnable_kernel_for(n, 1) || (n->n_gemm && !runnable_kernel_for(n, n->gemm[n->n_gemm - 1]->min_rows)))
        return no_ime_hart(n, n->gemv ? n->gemv : n->gemm[0]);
    /* Slices of whole panels of every kernel the node may run (no padding inside a row of slices). */
    size_t unit = 1;
    for (size_t i = 0; i < n_use; i++) unit = unit / gcd(unit, (size_t)use[i]->panel) * (size_t)use[i]->panel;
    if (n->fallback) unit = unit / gcd(unit, (size_t)n->fallback->panel) * (size_t)n->fallback->panel;
    n->width = ((n->N + SLICES - 1) / SLICES + unit - 1) / unit * unit;
    n->slices = (n->N + n->width - 1) / n->width;
    for (size_t i = 0; i < n_use; i++)
        if (use[i] != n->fallback || !ime_hart_count) TRY(pack(n, use[i])); /* with IME harts the fallback packs late */
    return NULL;
}

static OrtStatus *ORT_API_CALL create_kernel(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info,
                                             void **kernel) {
    (void)op, (void)api;
    struct node *n = calloc(1, sizeof *n);
    if (!n) return fail(ORT_FAIL, "imegen: out of memory");
    pthread_mutex_init(&n->lock, NULL);
    OrtStatus *st = create(info, n);
    if (st) {
        destroy(n);
        return st;
    }
    pthread_mutex_lock(&live_lock);
    n->next = live_nodes, live_nodes = n;
    pthread_mutex_unlock(&live_lock);
    *kernel = n;
    return NULL;
}

/* ------------------------------------------------------------------------------------------- Run */
static void count_call(const kernel_t *k) { __atomic_fetch_add(&calls[k - imegen_kernels], 1, __ATOMIC_RELAXED); }

static size_t slice_columns(const struct node *n, size_t i, size_t *n0) {
    *n0 = i * n->width;
    return n->N - *n0 < n->width ? n->N - *n0 : n->width;
}

/* A gated node's epilogue: the slice's gate, rows N apart like C's. */
struct gate_ctx {
    const float *gate;
    size_t ld;
};

static void silu_gate_block(void *ctx, float *c, size_t ldc, size_t m0, size_t rows, size_t n0, size_t cols) {
    const struct gate_ctx *g = ctx;
    imegen_silu_gate(c, ldc, g->gate + m0 * g->ld + n0, g->ld, rows, cols);
}

/* Slice i on the Run's kernel, from the workspace prepare_a filled; a gated node's SiLU on each block of C the
 * kernel finishes, while it is in the cache. */
static int run_prepared(const struct slices_job *j, size_t i) {
    const struct node *n = j->node;
    size_t n0;
    const size_t cols = slice_columns(n, i, &n0), scratch_bytes = j->k->scratch_size(n->K);
    void *scratch = scratch_bytes ? malloc(scratch_bytes) : NULL; /* a staged B: its own per slice */
    if (scratch_bytes && !scratch) return ST_NO_MEMORY;
    struct gate_ctx gate = {j->gate ? j->gate + n0 : NULL, n->N};
    const int status = j->k->matmul_prepared_then(j->M, cols, n->K, j->packed[i], j->bias ? j->bias + n0 : NULL,
                                                  j->C + n0, n->N, j->workspace, scratch,
                                                  j->gate ? silu_gate_block : NULL, &gate);
    free(scratch);
    return status;
}

/* Slice i on the fallback kernel, which quantizes its own A (its workspace layout is its own). */
static int run_fallback(const struct slices_job *j, size_t i) {
    struct node *n = (struct node *)j->node; /* the late pack writes n->packs under n->lock */
    const kernel_t *k = n->fallback;
    pthread_mutex_lock(&n->lock);
    void **packed = packed_slices(n, k->layout);
    if (!packed) {
        OrtStatus *st = pack(n, k);
        if (st) ort->ReleaseStatus(st);
        packed = packed_slices(n, k->layout);
    }
    pthread_mutex_unlock(&n->lock);
    if (!packed) return ST_NO_FALLBACK_PACK;
    size_t n0;
    const size_t cols = slice_columns(n, i, &n0), ws_bytes = k->workspace_size(j->M, n->K);
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    if (!ws) return ST_NO_MEMORY;
    const int status = k->matmul(j->M, cols, n->K, j->A, n->K, packed[i], j->bias ? j->bias + n0 : NULL, j->C + n0,
                                 n->N, ws);
    free(ws);
    if (!status && j->gate) /* the fallback has no prepared workspace to hand an epilogue: the SiLU afterwards */
        imegen_silu_gate(j->C + n0, n->N, j->gate + n0, n->N, j->M, cols);
    return status;
}

static void run_slice(void *p, size_t i) {
    struct slices_job *j = p;
    int status;
    if (!is_ime(j->k)) {
        status = run_prepared(j, i);
    } else if (j->unprepared) {
        status = j->node->fallback ? run_fallback(j, i) : ST_NO_IME_HART;
        if (j->node->fallback) {
            __atomic_store_n(&j->fell_back, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&slices_fallback, 1, __ATOMIC_RELAXED);
        }
    } else {
        cpu_set_t saved;
        const int how = enter_ime_harts(&saved);
        if (how >= 0) {
            status = run_prepared(j, i);
            if (how == 1) sched_setaffinity(0, sizeof saved, &saved); /* routed (2): it stays */
            __atomic_fetch_add(how ? &slices_pinned : &slices_on_ime, 1, __ATOMIC_RELAXED);
        } else if (j->node->fallback) {
            status = run_fallback(j, i);
            __atomic_store_n(&j->fell_back, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&slices_fallback, 1, __ATOMIC_RELAXED);
        } else {
            status = ST_NO_IME_HART;
        }
    }
    if (status) __atomic_store_n(&j->status, status, __ATOMIC_RELAXED);
}

/* k's A quantization into ws: on a board whose IME harts have a VLEN of their own (IMEGEN_IME_PREPARE_THERE: the
 * K3's A100s beside its X100s), an IME kernel's quantizer, vector code written for that VLEN, runs on an IME hart,
 * entered as a slice enters one (a quantizer at another VLEN would cover part of each block, silently). 0 when it
 * cannot be: the slices then run the fallback, which quantizes its own. */
static int prepare_a(const kernel_t *k, size_t M, size_t K, const void *A, void *ws) {
#ifdef IMEGEN_IME_PREPARE_THERE
    if (is_ime(k)) {
        cpu_set_t saved;
        const int how = enter_ime_harts(&saved);
        if (how < 0) return 0;
        k->prepare_a(M, K, A, K, ws);
        if (how == 1) sched_setaffinity(0, sizeof saved, &saved); /* routed (2): it stays */
        __atomic_fetch_add(how ? &prepares_pinned : &prepares_on_ime, 1, __ATOMIC_RELAXED);
        return 1;
    }
#endif
    k->prepare_a(M, K, A, K, ws);
    return 1;
}

static const char *status_text(int status) {
    switch (status) {
    case 1: return ": VLEN not accepted on this hart";
    case 3: return ": an A block's max |a| exceeds 127 x 65504, or A holds a NaN (fp16 A scales)";
    case ST_NO_MEMORY: return ": out of memory";
    case ST_NO_FALLBACK_PACK: return ": the fallback kernel could not be packed (this hart's VLEN is not one it "
                                     "accepts, or out of memory)";
    case ST_NO_IME_HART: return ": this thread cannot run on an IME hart (sched_setaffinity refused), and the spec "
                                "has no fallback kernel for the node";
    default: return "";
    }
}

static OrtStatus *ORT_API_CALL compute(void *kernel, OrtKernelContext *ctx) {
    const struct node *n = kernel;
    const OrtValue *a_value, *bias_value = NULL, *gate_value = NULL;
    TRY(ort->KernelContext_GetInput(ctx, IN_A, &a_value));
    if (n->has_bias) TRY(ort->KernelContext_GetInput(ctx, IN_BIAS, &bias_value));
    if (n->gated) TRY(ort->KernelContext_GetInput(ctx, IN_GATE, &gate_value));
    struct shape a_shape, bias_shape, gate_shape;
    TRY(shape_of(a_value, n->name, "A", &a_shape));
    const size_t rank = a_shape.rank;
    int64_t *dims = a_shape.dims;
    if (rank < 1) return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': A is a scalar", n->name);
    if (dims[rank - 1] != (int64_t)n->K)
        return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': A's last dimension is %lld, expected K = %zu", n->name,
                    (long long)dims[rank - 1], n->K);
    size_t M = 1;
    for (size_t i = 0; i + 1 < rank; i++) M *= (size_t)dims[i];
    if (n->has_bias) {
        TRY(shape_of(bias_value, n->name, "bias", &bias_shape));
        if (bias_shape.count != n->N)
            return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': bias has %zu elements, expected N = %zu", n->name,
                        bias_shape.count, n->N);
    }
    dims[rank - 1] = (int64_t)n->N; /* now Y's shape */
    if (n->gated) { /* the gate is read as Y's elements: it must have Y's shape */
        TRY(shape_of(gate_value, n->name, "the gate", &gate_shape));
        int same = gate_shape.rank == rank;
        for (size_t i = 0; same && i < rank; i++) same = gate_shape.dims[i] == dims[i];
        if (!same)
            return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': the gate's shape is not the output's (A's leading "
                        "dimensions, then N = %zu)", n->name, n->N);
    }
    OrtValue *c_value;
    TRY(ort->KernelContext_GetOutput(ctx, 0, dims, rank, &c_value));
    if (M == 0) return NULL;
    const kernel_t *k = runnable_kernel_for(n, M);
    if (k != kernel_for(n, M)) /* no IME hart in this process: every slice runs on the fallback */
        __atomic_fetch_add(&slices_fallback, n->slices, __ATOMIC_RELAXED);
    struct slices_job j = {.node = n, .k = k, .packed = packed_slices((struct node *)n, k->layout), .M = M};
    if (!j.packed) /* create() packs every kernel a Run can pick: this would be a bug, reported, not a crash */
        return fail(ORT_FAIL, "imegen: node '%s': kernel %s has no packed B (internal error)", n->name, k->name);
    const void *a, *bias = NULL, *gate = NULL;
    void *c;
    TRY(tensor_data(a_value, &a));
    if (bias_value) TRY(tensor_data(bias_value, &bias));
    if (gate_value) TRY(tensor_data(gate_value, &gate));
    TRY(ort->GetTensorMutableData(c_value, &c));
    const size_t ws_bytes = k->workspace_size(M, n->K); /* 0: M over IMEGEN_MAX_DIM */
    if (!ws_bytes) return fail(ORT_INVALID_ARGUMENT, "imegen: node '%s': A has %zu rows, more than imegen's kernels take",
                               n->name, M);
    void *ws = malloc(ws_bytes);
    if (!ws) return fail(ORT_FAIL, "imegen: node '%s': out of memory for the workspace (M = %zu)", n->name, M);
    j.unprepared = !prepare_a(k, M, n->K, a, ws); /* A quantized once; every slice on k reads it */
    j.A = a, j.workspace = ws, j.bias = bias, j.gate = gate, j.C = c;
    count_call(k);
    if (gate) __atomic_fetch_add(&gated_calls, 1, __ATOMIC_RELAXED);
    OrtStatus *st = NULL;
    if (n->slices == 1) run_slice(&j, 0);
    else st = ort->KernelContext_ParallelFor(ctx, run_slice, n->slices, 0, &j);
    free(ws);
    if (j.fell_back) count_call(n->fallback);
    if (st) return st;
    if (j.status)
        return fail(ORT_FAIL, "imegen: node '%s': kernel %s failed (status %d%s)", n->name, j.k->name, j.status,
                    status_text(j.status));
    return NULL;
}

static const char *ORT_API_CALL op_name(const OrtCustomOp *op) { (void)op; return "MatMulNBits"; }
static ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp *op, size_t i) {
    (void)op;
    static const ONNXTensorElementDataType types[N_INPUTS] = {
        ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
        ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, /* zero points: uint8 checked at creation (float ones refused) */
        ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
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

static OrtCustomOp matmul_nbits_op;
static struct once process_once = {0, PTHREAD_MUTEX_INITIALIZER};
static const char *hart_list_error; /* a malformed IMEGEN_IME_HARTS: every registration fails with it */
static char hart_list_text[128];
static void init_process(void);

/* imegen_ort_stats()'s text, rebuilt by each call (the caller reads it before calling again). */
static char *stats_text;
static size_t stats_size;

static void append(size_t *at, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const int need = stats_text ? vsnprintf(stats_text + *at, stats_size - *at, fmt, ap) : -1;
        va_end(ap);
        if (need >= 0 && *at + (size_t)need < stats_size) {
            *at += (size_t)need;
            return;
        }
        const size_t size = stats_size ? 2 * stats_size + (size_t)(need > 0 ? need : 0) : 4096;
        char *grown = realloc(stats_text, size);
        if (!grown) return; /* keep what fits */
        stats_text = grown, stats_size = size;
    }
}

static void append_route(size_t *at, const struct node *n) {
    append(at, "route %s:", n->name);
    if (n->gemv) append(at, " M=1 %s", n->gemv->name);
    for (size_t i = 0; i < n->n_gemm; i++) {
        const size_t low = i ? n->gemm[i]->min_rows : n->gemv ? 2 : 1; /* gemm[0] also takes fewer rows */
        append(at, "%s M=%zu", n->gemv || i ? "," : "", low);
        if (i + 1 < n->n_gemm) append(at, "..%zu %s", n->gemm[i + 1]->min_rows - 1, n->gemm[i]->name);
        else append(at, "+ %s", n->gemm[i]->name);
    }
    if (n->fallback) append(at, ", no IME hart: %s", n->fallback->name);
    append(at, "\n");
}

/* Lines: "NAME calls N" per kernel (the Runs it served, whole or some slices); "ime_harts LIST (from ...)";
 * "decoder OP nodes N calls N" per decoder operator in use (SiluGate: MatMulNBits nodes with a gate input);
 * "ime_slices on_ime N pinned N fallback N"; "packed_bytes N" (B packed by the live nodes); "route NODE: ..."
 * per live node; "vmadots N" in emulation builds. For tests, ort-model-check and ort-accelerate's users. */
const char *imegen_ort_stats(void) {
    static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&stats_lock); /* one caller at a time rebuilds the text */
    size_t at = 0;
    char harts[256];
    if (stats_text) stats_text[0] = 0;
    for (size_t i = 0; i < imegen_kernel_count && i < MAX_KERNELS; i++)
        append(&at, "%s calls %lu\n", imegen_kernels[i].name, __atomic_load_n(&calls[i], __ATOMIC_RELAXED));
    format_harts(&ime_harts, harts, sizeof harts);
    append(&at, "ime_harts %s (from %s)\n", harts, ime_harts_from);
    append(&at, "ime_slices on_ime %lu pinned %lu fallback %lu\n", __atomic_load_n(&slices_on_ime, __ATOMIC_RELAXED),
           __atomic_load_n(&slices_pinned, __ATOMIC_RELAXED), __atomic_load_n(&slices_fallback, __ATOMIC_RELAXED));
#ifdef IMEGEN_IME_PREPARE_THERE
    append(&at, "ime_prepares on_ime %lu pinned %lu\n", __atomic_load_n(&prepares_on_ime, __ATOMIC_RELAXED),
           __atomic_load_n(&prepares_pinned, __ATOMIC_RELAXED));
#endif
    append(&at, "packed_bytes %llu\n", __atomic_load_n(&packed_bytes, __ATOMIC_RELAXED));
    unsigned long gated_nodes = 0;
    pthread_mutex_lock(&live_lock);
    for (const struct node *n = live_nodes; n; n = n->next) append_route(&at, n), gated_nodes += (unsigned long)n->gated;
    pthread_mutex_unlock(&live_lock);
    imegen_decoder_ops_stats(append, &at);
    const unsigned long gated_runs = __atomic_load_n(&gated_calls, __ATOMIC_RELAXED);
    if (gated_nodes || gated_runs) /* as a decoder operator: decoder_ops.py's decision names it SiluGate */
        append(&at, "decoder SiluGate nodes %lu calls %lu\n", gated_nodes, gated_runs);
#ifdef IMEGEN_IME_EMULATION
    append(&at, "vmadots %lu\n", emulator_count());
#endif
    pthread_mutex_unlock(&stats_lock);
    return stats_text ? stats_text : "";
}

OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    ort = base->GetApi(ORT_API_VERSION);
    if (!ort) { /* an ORT older than the header: say so through API 1, which every ORT has */
        char msg[256];
        snprintf(msg, sizeof msg, "imegen: onnxruntime %s does not offer C API version %d, which this library was "
                 "built against (onnxruntime 1.%d or newer): it registered no operator", base->GetVersionString(),
                 ORT_API_VERSION, ORT_API_VERSION);
        fprintf(stderr, "%s\n", msg);
        const OrtApi *oldest = base->GetApi(1);
        return oldest ? oldest->CreateStatus(ORT_FAIL, msg) : NULL;
    }
    if (imegen_kernel_count > MAX_KERNELS) return fail(ORT_FAIL, "imegen: more than %d kernels", MAX_KERNELS);
    /* Once per process: sessions created earlier keep running on what they were packed for, and a Run never
     * sees the hart set or the operator table half rewritten. */
    once(&process_once, init_process);
    if (hart_list_error) return fail(ORT_INVALID_ARGUMENT, "imegen: %s=\"%s\" %s", IMEGEN_IME_HARTS_ENV,
                                     hart_list_text, hart_list_error);
    OrtCustomOpDomain *domain;
    TRY(ort->CreateCustomOpDomain(IMEGEN_DOMAIN, &domain));
    TRY(ort->CustomOpDomain_Add(domain, &matmul_nbits_op));
    TRY(imegen_decoder_ops_add(domain));
    return ort->AddCustomOpDomain(options, domain);
}

/* The library's process-wide state: which harts have IME (IMEGEN_IME_HARTS as it was when the library was first
 * registered) and the operator ORT calls. */
static void init_process(void) {
    hart_list_error = find_ime_harts();
    if (hart_list_error) snprintf(hart_list_text, sizeof hart_list_text, "%s", getenv(IMEGEN_IME_HARTS_ENV));
    imegen_decoder_ops_init(ort);
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
}
