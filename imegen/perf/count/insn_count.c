/* imegen instruction-count plugin for qemu-riscv64 (QEMU TCG plugin API v1, QEMU >= 7.2).
 *
 * Counts the guest instructions QEMU retires, by address range and by class, decoded from the
 * instruction word. Nothing is timed: the output is exact, deterministic counts.
 *
 * Arguments (-plugin insn_count.so,arg=value,...):
 *   ranges=FILE  lines "LO HI TAG" (hex addresses, HI exclusive), TAG one of
 *                  kernel    the kernel's code
 *                  excluded  code whose instructions are not kernel work (the IME trap emulator,
 *                            the bench markers)
 *                  image     the executable's whole text; anything in it that is neither kernel
 *                            nor excluded is counted as "callee" (libc/libm called by the kernel)
 *                anything outside every range is "outside" (e.g. QEMU's signal trampoline page)
 *   out=FILE     where counts are written
 *   begin=ADDR, end=ADDR (hex, optional)  entry points of the bench marker functions: every
 *                time `end` is reached, the counts accumulated since the last `begin` are
 *                written as one "region" line; the whole run is written as "total" at exit
 *   beat=N       bytes per vector-memory beat (default 16)
 * The first output line ("format ...") names the columns of every later line.
 *
 * Classes: scalar instructions (int ALU, branch/jump, load/store, FP, divide/sqrt), vector
 * config (vsetvl/vsetvli/vsetivli), vector loads and stores (unit-stride, and strided/indexed
 * separately), vector integer ALU and vector FP (OP-V), and IME vmadot (custom-1 0x2B,
 * funct7 0b1110001 / 0b1110011). A vmadot is counted when it is attempted: under QEMU it traps
 * (SIGILL) into an emulator whose instructions are excluded by address.
 *
 * Vector arithmetic also accumulates a histogram of its EMUL (register-group size, from the
 * vtype set by the last vsetvli/vsetivli executed, and from the instruction's widening,
 * narrowing or whole-register count), so a cost model can turn it into datapath occupancy.
 * A vsetvl (register operand) leaves vtype unknown to the plugin; such executions are counted
 * ("vtype_unknown") and LMUL = 1 is assumed until the next vsetvli.
 *
 * Vector loads and stores are measured, not inferred: QEMU 7.2 performs them element by element
 * in helpers that report every active (unmasked, below vl) element access to plugin memory
 * callbacks. Per class the plugin sums the bytes and elements accessed and the "beats":
 * max(1, ceil(bytes / BEAT)) per instruction, BEAT = beat=N bytes (default 16, a 128-bit DLEN).
 *
 * Every vector instruction is also sorted into one of LLVM's SpacemiT-X60 scheduling kinds (the
 * groups whose hardware-measured occupancy RISCVSchedSpacemitX60.td gives as one table by LMUL,
 * docs/ime-isa.md §7) and histogrammed by what that occupancy depends on: the vtype's LMUL for
 * arithmetic, the data's EMUL for unit-stride accesses, the register count for whole-register
 * ones, log2(VLMAX / VLEN) of the vtype for strided and indexed ones. The cycles themselves are
 * applied in Python (imegen/perf/model/occupancy.py), from one table.
 *
 * Scalar instructions and vmadot use inline counters (qemu_plugin_register_vcpu_insn_exec_inline);
 * vector instructions need the dynamic vtype (and memory callbacks), so they use an execution
 * callback. Compressed (16-bit) instructions are scalar and classified from their quadrant/funct3.
 * Single-threaded guests only (the counters are not per-vCPU).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

enum { T_KERNEL, T_CALLEE, T_EXCLUDED, T_OUTSIDE, NTAG };
static const char *tag_names[NTAG] = {"kernel", "callee", "excluded", "outside"};

enum {
    C_INT,        /* scalar integer ALU, lui/auipc, csr, system */
    C_BRANCH,     /* branches and jumps */
    C_MEM,        /* scalar loads/stores (int and FP), atomics */
    C_FP,         /* scalar FP arithmetic, conversions, moves */
    C_DIV,        /* scalar integer divide/remainder, FP divide/sqrt */
    C_VSET,       /* vsetvli, vsetivli, vsetvl */
    C_VLOAD,      /* vector unit-stride / whole-register / mask loads */
    C_VSTORE,     /* vector unit-stride / whole-register / mask stores */
    C_VLSX,       /* vector strided or indexed loads/stores */
    C_VALU,       /* OP-V integer (OPI*, OPM*) */
    C_VFPU,       /* OP-V floating point (OPF*) */
    C_VMADOT,     /* IME vmadot* */
    NCLASS
};
static const char *class_names[NCLASS] = {"int", "branch", "mem", "fp", "div", "vset", "vload",
                                          "vstore", "vlsx", "valu", "vfpu", "vmadot"};

/* EMUL histograms of vector arithmetic: bucket b counts instructions whose register group
 * is 2^(b-3) registers (1/8 .. 64). */
enum { U_VIEU, U_VFP, NUNIT };
static const char *unit_names[NUNIT] = {"vieu", "vfp"};
#define NEMUL 10
#define NMEM 3 /* vector memory classes, C_VLOAD .. C_VLSX */
enum { M_BYTES, M_ELEMS, M_BEATS, NMSTAT };
static const char *mstat_names[NMSTAT] = {"bytes", "elems", "beats"};

/* LLVM X60 scheduling kinds (occupancy.py names the same ones); bucket b of a kind: 2^(b-3) of what
 * its occupancy scales with (LMUL, EMUL or registers), or for K_VLMAX kinds VLMAX = VLEN * 2^(b-9). */
enum {
    K_LOAD, K_STORE, K_WHOLE, K_MASK_LS, K_STRIDED, K_INDEXED, /* memory */
    K_ADD, K_LOGIC, K_NARROW, K_GATHER, K_GATHER16_E8, K_SLIDE, K_CMP, K_COMPRESS, K_RED, K_DIV,
    K_MV_XS, K_MV_SX, K_MV_NR, K_MASK, K_POP,                     /* VIEU */
    K_FADD, K_FCVT, K_FWCVT, K_FRED, K_FDIV,                      /* VFP */
    NKIND
};
static const char *kind_names[NKIND] = {"load", "store", "whole", "mask_ls", "strided", "indexed",
                                        "add", "logic", "narrow", "gather", "gather16_e8", "slide", "cmp",
                                        "compress", "red", "div", "mv_xs", "mv_sx", "mv_nr", "mask", "pop",
                                        "fadd", "fcvt", "fwcvt", "fred", "fdiv"};
#define NKTAG 2 /* kinds are histogrammed for the counted tags only (kernel, callee) */

struct counts {
    uint64_t n[NTAG][NCLASS];
    uint64_t emul[NTAG][NUNIT][NEMUL];
    uint64_t mem[NTAG][NMEM][NMSTAT];
    uint64_t kind[NKTAG][NKIND][NEMUL];
    uint64_t vtype_unknown;
};

static struct counts now, mark;
static FILE *out;
static unsigned regions;
static uint64_t begin_addr = UINT64_MAX, end_addr = UINT64_MAX;
static uint64_t beat_bytes = 16;

struct range {
    uint64_t lo, hi;
    int tag; /* T_KERNEL, T_EXCLUDED, or -1 for the image */
};
static struct range *ranges;
static size_t nranges;

/* vtype as last set by vsetvli/vsetivli: log2 LMUL (-3..3) and log2 SEW (3..6). */
static int cur_lmul_log2 = 0, cur_sew_log2 = 3;

enum { E_VTYPE, E_FIXED, E_ONE };
enum { B_LMUL, B_EMUL, B_FIXED, B_VLMAX }; /* what a kind's bucket is taken from */
struct vdesc {
    uint8_t tag, cls, unit;
    uint8_t kind, bucket_kind; /* LLVM scheduling kind; B_EMUL: eew_log2 is the data's EEW */
    int8_t eew_log2, fixed_bucket_log2;
    uint8_t emul_kind; /* E_VTYPE: from vtype (+ adjustments); E_FIXED: fixed_log2; E_ONE: 1 reg */
    int8_t adjust_log2; /* +1: widening or narrowing (the wide group is 2*LMUL) */
    int8_t fixed_log2;
    uint32_t word;
};

static int tag_of(uint64_t pc)
{
    int in_image = 0;
    for (size_t i = 0; i < nranges; i++) {
        if (pc >= ranges[i].lo && pc < ranges[i].hi) {
            if (ranges[i].tag >= 0)
                return ranges[i].tag;
            in_image = 1;
        }
    }
    return in_image ? T_CALLEE : T_OUTSIDE;
}

static int ceil_log2(unsigned v)
{
    int l = 0;
    while ((1u << l) < v)
        l++;
    return l;
}

static int clamp_bucket(int log2_regs)
{
    int b = log2_regs + 3;
    return b < 0 ? 0 : b >= NEMUL ? NEMUL - 1 : b;
}

static void on_vset(unsigned int vcpu, void *ud)
{
    const struct vdesc *d = ud;
    (void)vcpu;
    now.n[d->tag][C_VSET]++;
    const uint32_t w = d->word;
    unsigned zimm;
    if ((w >> 31) == 0)
        zimm = (w >> 20) & 0x7ff; /* vsetvli */
    else if ((w >> 30) == 3)
        zimm = (w >> 20) & 0x3ff; /* vsetivli */
    else {                        /* vsetvl: vtype comes from a register we cannot read */
        now.vtype_unknown++;
        cur_lmul_log2 = 0, cur_sew_log2 = 3;
        return;
    }
    const unsigned vlmul = zimm & 7, vsew = (zimm >> 3) & 7;
    cur_lmul_log2 = vlmul < 4 ? (int)vlmul : (int)vlmul - 8; /* 5,6,7 -> -3,-2,-1 */
    cur_sew_log2 = 3 + (int)(vsew & 3);
}

/* The vector memory instruction executing now, and the element accesses it has made so far. */
static const struct vdesc *pending;
static uint64_t pending_bytes, pending_elems;

static void finish_pending(void)
{
    if (!pending)
        return;
    uint64_t *m = now.mem[pending->tag][pending->cls - C_VLOAD];
    const uint64_t beats = (pending_bytes + beat_bytes - 1) / beat_bytes;
    m[M_BYTES] += pending_bytes;
    m[M_ELEMS] += pending_elems;
    m[M_BEATS] += beats ? beats : 1;
    pending = NULL;
}

static void on_mem(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr, void *ud)
{
    (void)vcpu, (void)vaddr, (void)ud;
    pending_bytes += 1u << qemu_plugin_mem_size_shift(info);
    pending_elems++;
}

static void count_kind(const struct vdesc *d)
{
    if (d->tag >= NKTAG)
        return;
    int kind = d->kind, b;
    if (kind == K_GATHER && d->eew_log2 == 1 && cur_sew_log2 == 3)
        kind = K_GATHER16_E8; /* vrgatherei16 at SEW 8 has a table of its own */
    switch (d->bucket_kind) {
    case B_EMUL: b = cur_lmul_log2 + d->eew_log2 - cur_sew_log2 + 3; break;
    case B_FIXED: b = d->fixed_bucket_log2 + 3; break;
    case B_VLMAX: b = cur_lmul_log2 - cur_sew_log2 + 9; break;
    default: b = cur_lmul_log2 + 3;
    }
    now.kind[d->tag][kind][b < 0 ? 0 : b >= NEMUL ? NEMUL - 1 : b]++;
}

static void on_vmem(unsigned int vcpu, void *ud)
{
    const struct vdesc *d = ud;
    (void)vcpu;
    finish_pending();
    now.n[d->tag][d->cls]++;
    count_kind(d);
    pending = d, pending_bytes = 0, pending_elems = 0;
}

static void on_vector(unsigned int vcpu, void *ud)
{
    const struct vdesc *d = ud;
    (void)vcpu;
    now.n[d->tag][d->cls]++;
    int emul;
    if (d->emul_kind == E_FIXED)
        emul = d->fixed_log2;
    else if (d->emul_kind == E_ONE)
        emul = 0;
    else
        emul = cur_lmul_log2 + d->adjust_log2;
    now.emul[d->tag][d->unit][clamp_bucket(emul)]++;
    count_kind(d);
}

static void on_begin(unsigned int vcpu, void *ud)
{
    (void)vcpu, (void)ud;
    finish_pending();
    mark = now;
}

static void write_counts(const char *label, const struct counts *c, const struct counts *base)
{
    fprintf(out, "%s", label);
    for (int t = 0; t < NTAG; t++) {
        for (int k = 0; k < NCLASS; k++)
            fprintf(out, " %" PRIu64, c->n[t][k] - (base ? base->n[t][k] : 0));
        for (int u = 0; u < NUNIT; u++)
            for (int e = 0; e < NEMUL; e++)
                fprintf(out, " %" PRIu64, c->emul[t][u][e] - (base ? base->emul[t][u][e] : 0));
        for (int k = 0; k < NMEM; k++)
            for (int m = 0; m < NMSTAT; m++)
                fprintf(out, " %" PRIu64, c->mem[t][k][m] - (base ? base->mem[t][k][m] : 0));
    }
    for (int t = 0; t < NKTAG; t++)
        for (int k = 0; k < NKIND; k++)
            for (int e = 0; e < NEMUL; e++)
                fprintf(out, " %" PRIu64, c->kind[t][k][e] - (base ? base->kind[t][k][e] : 0));
    fprintf(out, " %" PRIu64 "\n", c->vtype_unknown - (base ? base->vtype_unknown : 0));
}

static void on_end(unsigned int vcpu, void *ud)
{
    (void)vcpu, (void)ud;
    finish_pending();
    char label[32];
    snprintf(label, sizeof label, "region %u", regions++);
    write_counts(label, &now, &mark);
    mark = now;
}

/* Scalar class of a 16-bit compressed instruction. */
static int class_c(uint16_t h)
{
    const unsigned op = h & 3, f3 = h >> 13;
    if (op == 0)
        return (f3 == 0 || f3 == 4) ? C_INT : C_MEM;
    if (op == 1)
        return f3 >= 5 ? C_BRANCH : C_INT;
    /* op == 2 */
    if (f3 == 4 && ((h >> 2) & 31) == 0 && ((h >> 7) & 31) != 0)
        return C_BRANCH; /* c.jr / c.jalr */
    return (f3 == 0 || f3 == 4) ? C_INT : C_MEM;
}

static int is_vector_width(unsigned width)
{
    return width == 0 || width >= 5;
}

/* LLVM X60 scheduling kind of a vector memory instruction (opcode LOAD-FP / STORE-FP). */
static void memory_kind(uint32_t w, struct vdesc *d)
{
    static const int8_t eew_log2[8] = {3, 0, 0, 0, 0, 4, 5, 6}; /* width 0, 5, 6, 7: EEW 8..64 */
    const unsigned mop = (w >> 26) & 3, umop = (w >> 20) & 31, nf = w >> 29;
    d->eew_log2 = eew_log2[(w >> 12) & 7];
    if (mop == 2 || mop == 1 || mop == 3) {
        d->kind = mop == 2 ? K_STRIDED : K_INDEXED, d->bucket_kind = B_VLMAX;
    } else if (umop == 8) {
        d->kind = K_WHOLE, d->bucket_kind = B_FIXED, d->fixed_bucket_log2 = (int8_t)ceil_log2(nf + 1);
    } else if (umop == 11) {
        d->kind = K_MASK_LS, d->bucket_kind = B_FIXED, d->fixed_bucket_log2 = 0;
    } else {
        d->kind = (w & 0x7f) == 0x07 ? K_LOAD : K_STORE, d->bucket_kind = B_EMUL;
    }
}

/* LLVM X60 scheduling kind of an OP-V arithmetic instruction (bucket: the vtype's LMUL unless set). */
static void arith_kind(uint32_t w, struct vdesc *d)
{
    const unsigned funct3 = (w >> 12) & 7, f6 = w >> 26, vs1 = (w >> 15) & 31;
    const int fp = funct3 == 1 || funct3 == 5, opm = funct3 == 2 || funct3 == 6, vv = funct3 == 0;
    d->bucket_kind = B_LMUL;
    if (fp) {
        d->kind = (f6 == 1 || f6 == 3 || f6 == 5 || f6 == 7 || f6 == 0x31 || f6 == 0x33) ? K_FRED
                : (f6 >= 8 && f6 <= 10) || f6 == 0x17 ? K_FCVT              /* vfsgnj*, vfmerge/vfmv.v.f */
                : f6 == 0x0e || f6 == 0x0f ? K_SLIDE                         /* vfslide1up/down */
                : f6 == 0x10 ? K_MV_SX                                       /* vfmv.f.s, vfmv.s.f */
                : f6 == 0x12 ? (vs1 < 8 ? K_FCVT : K_FWCVT)                  /* vfcvt; vfwcvt, vfncvt */
                : f6 == 0x13 ? (vs1 == 0 ? K_FDIV : K_FCVT)                  /* vfsqrt; vfrsqrt7, vfrec7, vfclass */
                : f6 >= 0x18 && f6 <= 0x1f ? K_CMP
                : f6 == 0x20 || f6 == 0x21 ? K_FDIV
                : f6 >= 0x30 && f6 <= 0x37 ? K_FWCVT                         /* vfwadd/vfwsub(.w) (LLVM: the convert table) */
                : f6 >= 0x38 ? K_LOGIC                                       /* vfwmul, vfwmacc...: ConstOneUntilMF2ThenDouble */
                : K_FADD;
        return;
    }
    if (opm) {
        d->kind = f6 <= 7 ? K_RED
                : f6 == 0x0e || f6 == 0x0f ? K_SLIDE                         /* vslide1up/down */
                : f6 == 0x10 ? (funct3 == 6 ? K_MV_SX : vs1 == 0 ? K_MV_XS : K_POP)
                : f6 == 0x12 || f6 == 0x14 ? K_LOGIC                         /* vzext/vsext; vid, viota, vmsbf... */
                : f6 == 0x17 ? K_COMPRESS
                : f6 >= 0x18 && f6 <= 0x1f ? K_MASK
                : f6 >= 0x20 && f6 <= 0x23 ? K_DIV
                : f6 >= 0x30 ? K_LOGIC                                       /* widening integer */
                : K_ADD;                                                     /* vaadd.., vmul*, vmacc/vmadd/vnmsac/vnmsub */
        return;
    }
    /* OPIVV, OPIVI, OPIVX */
    if (funct3 == 3 && f6 == 0x27) { /* vmv<nr>r.v */
        d->kind = K_MV_NR, d->bucket_kind = B_FIXED, d->fixed_bucket_log2 = (int8_t)ceil_log2(vs1 + 1);
        return;
    }
    d->eew_log2 = (vv && f6 == 0x0e) ? 1 : 0; /* vrgatherei16: its SEW-8 table is chosen at run time */
    d->kind = f6 <= 7 || (f6 >= 0x20 && f6 <= 0x23) || f6 == 0x27 ? K_ADD   /* add/sub/min/max, saturating, vsmul */
            : f6 == 0x0c ? (vv ? K_GATHER : K_LOGIC)                        /* vrgather.vv; .vx/.vi */
            : f6 == 0x0e ? (vv ? K_GATHER : funct3 == 4 ? K_LOGIC : K_SLIDE) /* vrgatherei16; vslideup.vx; .vi */
            : f6 == 0x0f ? K_SLIDE                                          /* vslidedown */
            : f6 == 0x11 || f6 == 0x13 || (f6 >= 0x18 && f6 <= 0x1f) ? K_CMP /* vmadc, vmsbc, compares */
            : f6 >= 0x2c && f6 <= 0x2f ? K_NARROW
            : f6 == 0x30 || f6 == 0x31 ? K_RED
            : K_LOGIC;                                                      /* logical, vadc/vsbc, vmerge/vmv, shifts */
}

/* Fill a descriptor for a vector instruction; returns its class, or -1 if it is scalar. */
static int decode_vector(uint32_t w, struct vdesc *d)
{
    const unsigned opcode = w & 0x7f, funct3 = (w >> 12) & 7, funct6 = w >> 26;
    d->unit = 0, d->emul_kind = E_VTYPE, d->adjust_log2 = 0, d->fixed_log2 = 0;
    d->kind = K_ADD, d->bucket_kind = B_LMUL, d->eew_log2 = 0, d->fixed_bucket_log2 = 0;
    if (opcode == 0x07 || opcode == 0x27) {
        if (!is_vector_width(funct3))
            return -1;
        const unsigned mop = (w >> 26) & 3;
        memory_kind(w, d);
        if (mop != 0)
            return C_VLSX; /* strided (2) or indexed (1, 3) */
        return opcode == 0x07 ? C_VLOAD : C_VSTORE;
    }
    if (opcode != 0x57)
        return -1;
    if (funct3 == 7)
        return C_VSET;
    const int fp = funct3 == 1 || funct3 == 5;
    const int opm = funct3 == 2 || funct3 == 6;
    d->unit = fp ? U_VFP : U_VIEU;
    arith_kind(w, d);
    if ((fp || opm) && (funct6 >> 4) == 3) {
        d->adjust_log2 = 1; /* widening: destination group is 2*LMUL */
    } else if (!fp && !opm && funct6 >= 0x2c && funct6 <= 0x2f) {
        d->adjust_log2 = 1; /* vnsrl/vnsra/vnclip(u): source group is 2*LMUL */
    } else if (fp && funct6 == 0x12) {
        const unsigned vs1 = (w >> 15) & 31;
        if ((vs1 & 0x18) == 0x08 || (vs1 & 0x18) == 0x10)
            d->adjust_log2 = 1; /* vfwcvt / vfncvt */
    } else if (funct3 == 3 && funct6 == 0x27) {
        d->emul_kind = E_FIXED; /* vmv<nr>r.v: nr = simm5 + 1 */
        d->fixed_log2 = (int8_t)ceil_log2(((w >> 15) & 31) + 1);
    } else if ((opm && funct6 >= 0x18 && funct6 <= 0x1f) || (opm && funct6 == 0x10) ||
               (fp && funct6 == 0x10)) {
        d->emul_kind = E_ONE; /* mask logicals, vmv.x.s/vcpop/vfirst, vfmv.f.s */
    }
    return fp ? C_VFPU : C_VALU;
}

static int is_vmadot(uint32_t w)
{
    const unsigned funct7 = w >> 25;
    return (w & 0x7f) == 0x2b && (funct7 == 0x71 || funct7 == 0x73);
}

/* Scalar class of a 32-bit instruction that is neither vector nor vmadot. */
static int class_scalar(uint32_t w)
{
    const unsigned opcode = w & 0x7f, funct3 = (w >> 12) & 7, funct7 = w >> 25;
    switch (opcode) {
    case 0x03: case 0x23: case 0x07: case 0x27: case 0x2f:
        return C_MEM;
    case 0x63: case 0x6f: case 0x67:
        return C_BRANCH;
    case 0x33: case 0x3b:
        return (funct7 == 1 && funct3 >= 4) ? C_DIV : C_INT;
    case 0x43: case 0x47: case 0x4b: case 0x4f:
        return C_FP;
    case 0x53: {
        const unsigned f5 = funct7 >> 2;
        return (f5 == 0x03 || f5 == 0x0b) ? C_DIV : C_FP; /* fdiv, fsqrt */
    }
    default:
        return C_INT;
    }
}

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    const size_t n = qemu_plugin_tb_n_insns(tb);
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        const uint64_t pc = qemu_plugin_insn_vaddr(insn);
        const int tag = tag_of(pc);
        if (pc == begin_addr)
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_begin, QEMU_PLUGIN_CB_NO_REGS, NULL);
        if (pc == end_addr)
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_end, QEMU_PLUGIN_CB_NO_REGS, NULL);
        const size_t size = qemu_plugin_insn_size(insn);
        const uint8_t *bytes = qemu_plugin_insn_data(insn);
        int cls;
        if (size == 2) {
            cls = class_c((uint16_t)(bytes[0] | bytes[1] << 8));
        } else {
            uint32_t w = 0;
            memcpy(&w, bytes, size < 4 ? size : 4);
            if (is_vmadot(w)) {
                cls = C_VMADOT;
            } else {
                struct vdesc probe;
                cls = decode_vector(w, &probe);
                if (cls >= 0) {
                    struct vdesc *d = malloc(sizeof *d);
                    if (!d)
                        abort();
                    *d = probe;
                    d->tag = (uint8_t)tag, d->cls = (uint8_t)cls, d->word = w;
                    const int is_mem = cls >= C_VLOAD && cls <= C_VLSX;
                    qemu_plugin_register_vcpu_insn_exec_cb(insn, cls == C_VSET ? on_vset : is_mem ? on_vmem : on_vector,
                                                           QEMU_PLUGIN_CB_NO_REGS, d);
                    if (is_mem)
                        qemu_plugin_register_vcpu_mem_cb(insn, on_mem, QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_MEM_RW, d);
                    continue;
                }
                cls = class_scalar(w);
            }
        }
        qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64, &now.n[tag][cls], 1);
    }
}

static void at_exit(qemu_plugin_id_t id, void *ud)
{
    (void)id, (void)ud;
    finish_pending();
    write_counts("total", &now, NULL);
    fclose(out);
}

static int load_ranges(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char name[32];
    uint64_t lo, hi;
    while (fscanf(f, "%" SCNx64 " %" SCNx64 " %31s", &lo, &hi, name) == 3) {
        struct range *r = realloc(ranges, (nranges + 1) * sizeof *r);
        if (!r)
            abort();
        ranges = r;
        int tag = strcmp(name, "kernel") == 0 ? T_KERNEL : strcmp(name, "excluded") == 0 ? T_EXCLUDED
                  : strcmp(name, "image") == 0 ? -1 : -2;
        if (tag == -2) {
            fclose(f);
            return -1;
        }
        ranges[nranges++] = (struct range){lo, hi, tag};
    }
    fclose(f);
    return 0;
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv)
{
    const char *out_path = NULL;
    (void)info;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "ranges=", 7) == 0) {
            if (load_ranges(a + 7) != 0) {
                fprintf(stderr, "insn_count: cannot read ranges file %s\n", a + 7);
                return -1;
            }
        } else if (strncmp(a, "out=", 4) == 0) {
            out_path = a + 4;
        } else if (strncmp(a, "begin=", 6) == 0) {
            begin_addr = strtoull(a + 6, NULL, 16);
        } else if (strncmp(a, "end=", 4) == 0) {
            end_addr = strtoull(a + 4, NULL, 16);
        } else if (strncmp(a, "beat=", 5) == 0) {
            beat_bytes = strtoull(a + 5, NULL, 10);
            if (beat_bytes == 0) {
                fprintf(stderr, "insn_count: beat must be positive\n");
                return -1;
            }
        } else {
            fprintf(stderr, "insn_count: unknown argument %s\n", a);
            return -1;
        }
    }
    if (!out_path || !(out = fopen(out_path, "w"))) {
        fprintf(stderr, "insn_count: need a writable out=FILE\n");
        return -1;
    }
    /* Self-describing header: the column order of every "region"/"total" line. */
    fprintf(out, "format");
    for (int t = 0; t < NTAG; t++) {
        for (int k = 0; k < NCLASS; k++)
            fprintf(out, " %s.%s", tag_names[t], class_names[k]);
        for (int u = 0; u < NUNIT; u++)
            for (int e = 0; e < NEMUL; e++)
                fprintf(out, " %s.%s.e%d", tag_names[t], unit_names[u], e - 3);
        for (int k = 0; k < NMEM; k++)
            for (int m = 0; m < NMSTAT; m++)
                fprintf(out, " %s.%s.%s", tag_names[t], class_names[C_VLOAD + k], mstat_names[m]);
    }
    for (int t = 0; t < NKTAG; t++)
        for (int k = 0; k < NKIND; k++)
            for (int e = 0; e < NEMUL; e++)
                fprintf(out, " %s.occ.%s.b%d", tag_names[t], kind_names[k], e);
    fprintf(out, " vtype_unknown\n");
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
