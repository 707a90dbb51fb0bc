/* SIGILL trap-and-emulate for SpacemiT IME2 integer vmadot* (see ime2_emu.h).
 *
 * Build this file WITHOUT the V extension (-march=rv64gc): the handler runs while the interrupted
 * code's vector registers are live, and under QEMU user mode they are neither saved nor restored
 * around the signal. Compiled without V, the C code cannot touch them; the only vector instructions
 * are the explicit whole-register spills/fills below, which also leave vl and vtype alone.
 *
 * Semantics (docs/ime2-isa.md §2): C[8x8] int32 (rows 0-3 in vd, rows 4-7 in vd+1) += A x B^T.
 *   i8: A[8x16] = vs1 bytes row-major (slide n: rows n..n+7 of the 16x16 stack {vs1, vs1+1}),
 *       B^T[8x16] = vs2 bytes (byte 16*j + k is B[k][j]).
 *   i4: A[8x32], B^T[8x32], nibble e of a register in byte e/2 (even e: bits 3:0, odd e: bits 7:4).
 * Accumulation wraps mod 2^32.
 *
 * Also vpack.vv / vupack.vv (docs/ime2-isa.md §6.1), which every llama.cpp IME2 kernel uses to lay out
 * vmadot operands and results: chunks of pack_len bits (imm2: SEW, 128, 256, 512), the destination
 * being the register pair vd, vd+1 seen as one 2*VLEN-bit stream.
 *   vpack:  stream = vs1.chunk0, vs2.chunk0, vs1.chunk1, vs2.chunk1, ...
 *   vupack: the inverse; the stream {vs1, vs2} is split into its even chunks (-> vd) and odd chunks (-> vd+1).
 */
#define _GNU_SOURCE /* REG_PC and the ucontext_t register names */
#include "ime2_emu.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#define VLENB 128 /* A100: VLEN = 1024 bits */
#define TILE 8    /* M = N = 8 for every integer form */

/* Let the assembler accept one vector instruction although the file is built for rv64gc. */
#define WITH_V(insn) ".option push\n\t.option arch, +v\n\t" insn "\n\t.option pop"

/* Register numbers are part of the instruction, so each register needs its own asm statement. */
#define VREGS(X)                                                                              \
    X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)  \
    X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27) X(28) X(29)   \
    X(30) X(31)

#define SPILL_CASE(n)                                                                  \
    case n:                                                                            \
        __asm__ volatile(WITH_V("vs1r.v v" #n ", (%0)") : : "r"(buf) : "memory");     \
        break;
#define FILL_CASE(n)                                                                   \
    case n:                                                                            \
        __asm__ volatile(WITH_V("vl1r.v v" #n ", (%0)") : : "r"(buf) : "memory");     \
        break;

static void vreg_spill(unsigned reg, void *buf) {
    switch (reg) { VREGS(SPILL_CASE) }
}

static void vreg_fill(unsigned reg, const void *buf) {
    switch (reg) { VREGS(FILL_CASE) }
}

struct vmadot {
    unsigned vd, vs1, vs2, slide;
    int int4, a_signed, b_signed;
};

struct vpack {
    unsigned vd, vs1, vs2, imm2;
    int unpack;
};

/* Decode smt.vpack.vv / smt.vupack.vv (spec §8.6.1): [31:26] 011001, [25] 1, [14] 0 pack / 1 unpack,
 * [13:12] imm2, vd even. 0 for anything else (the narrowing packs vnpack* are not run). */
static int vpack_decode(uint32_t w, struct vpack *d) {
    if ((w & 0x7f) != 0x2b || w >> 25 != 0x33 || (w >> 7 & 1))
        return 0;
    d->vd = w >> 7 & 31;
    d->vs1 = w >> 15 & 31;
    d->vs2 = w >> 20 & 31;
    d->unpack = w >> 14 & 1;
    d->imm2 = w >> 12 & 3;
    return 1;
}

/* The spec does not say what a destination pair overlapping a source computes; refuse it rather than
 * pick an answer (no llama.cpp kernel does it). */
static int vpack_registers_legal(const struct vpack *d) {
    return d->vs1 != d->vd && d->vs1 != d->vd + 1 && d->vs2 != d->vd && d->vs2 != d->vd + 1;
}

/* Decode an IME2 integer vmadot / vmadotN word (docs/ime2-isa.md §3); 0 if it is anything else,
 * including the .sp / .hp / vfwmadot / vpack forms, which this emulator does not run. */
static int vmadot_decode(uint32_t w, struct vmadot *d) {
    unsigned dtype = w >> 29 & 3, family = w >> 26 & 7;
    /* custom-1, bit 31 and bit 25 set, vd even, data type i4 (10) or i8 (11) */
    if ((w & 0x7f) != 0x2b || !(w >> 31) || !(w >> 25 & 1) || (w >> 7 & 1) || dtype < 2)
        return 0;
    if (family == 0) { /* base: bit 14 reserved */
        if (w >> 14 & 1)
            return 0;
        d->vs1 = w >> 15 & 31;
        d->slide = 0;
    } else if (family == 1 && dtype == 3) { /* slide, i8 only: vs1[4:1] in [19:16], slide-1 in [15:14] */
        unsigned code = w >> 14 & 3;
        if (code == 3)
            return 0;
        d->vs1 = (w >> 16 & 15) << 1;
        d->slide = code + 1;
    } else {
        return 0;
    }
    d->int4 = dtype == 2;
    d->vd = w >> 7 & 31;
    d->vs2 = w >> 20 & 31;
    d->a_signed = w >> 13 & 1; /* sg: 00 uu, 01 us, 10 su, 11 ss (A, B) */
    d->b_signed = w >> 12 & 1;
    return 1;
}

/* The destination pair must not overlap a source (docs/ime2-isa.md §4): the spec calls that illegal,
 * so running it would hide a register-allocation bug that hardware need not compute as expected. */
static int registers_legal(const struct vmadot *d) {
    unsigned a_last = d->slide ? d->vs1 + 1 : d->vs1;
    int a_overlaps = d->vs1 <= d->vd + 1 && d->vd <= a_last;
    int b_overlaps = d->vs2 == d->vd || d->vs2 == d->vd + 1;
    return !a_overlaps && !b_overlaps;
}

/* LMUL must be 1 (the spec: anything else is illegal). The A100 fixes the tile, so SEW does not select
 * it: the known user issues vmadot under e8, e16 and e32, always with vl = VLMAX. Refused as well:
 * vl < VLMAX (the generic IME spec selects a smaller unit from vl x SEW, which the A100 profile does
 * not define) and SEW 64 (no document or user shows it). docs/ime2-isa.md §5. */
static int vtype_allows_ime2(void) {
    unsigned long vtype, vl;
    __asm__ volatile(WITH_V("csrr %0, vtype") : "=r"(vtype));
    __asm__ volatile(WITH_V("csrr %0, vl") : "=r"(vl));
    int vill = (int)(vtype >> (8 * sizeof vtype - 1));
    unsigned long vsew = vtype >> 3 & 7, vlmul = vtype & 7;
    return !vill && vlmul == 0 && vsew <= 2 && vl == (unsigned long)VLENB >> vsew;
}

/* vpack/vupack: the pseudocode bounds pack_len by VLEN x LMUL; every llama.cpp use is at LMUL 1 with
 * vl = VLMAX, SEW 8 to 64 (SEW sets pack_len for imm2 0). Anything else is refused, as for vmadot. */
static int vtype_allows_pack(void) {
    unsigned long vtype, vl;
    __asm__ volatile(WITH_V("csrr %0, vtype") : "=r"(vtype));
    __asm__ volatile(WITH_V("csrr %0, vl") : "=r"(vl));
    int vill = (int)(vtype >> (8 * sizeof vtype - 1));
    unsigned long vsew = vtype >> 3 & 7, vlmul = vtype & 7;
    return !vill && vlmul == 0 && vsew <= 3 && vl == (unsigned long)VLENB >> vsew;
}

static int32_t byte_elem(const uint8_t *reg, unsigned e, int is_signed) {
    return is_signed ? (int8_t)reg[e] : reg[e];
}

static int32_t nibble_elem(const uint8_t *reg, unsigned e, int is_signed) {
    int32_t v = reg[e >> 1] >> (4 * (e & 1)) & 15;
    return is_signed ? (v ^ 8) - 8 : v;
}

static void vmadot_execute(const struct vmadot *d) {
    /* Spill every source before writing vd (registers_legal has already refused overlaps). */
    uint8_t a[2 * VLENB], b[VLENB];
    uint32_t c[2 * VLENB / 4];
    vreg_spill(d->vs1, a);
    if (d->slide)
        vreg_spill(d->vs1 + 1, a + VLENB);
    vreg_spill(d->vs2, b);
    vreg_spill(d->vd, c);
    vreg_spill(d->vd + 1, c + VLENB / 4);

    int32_t (*elem)(const uint8_t *, unsigned, int) = d->int4 ? nibble_elem : byte_elem;
    unsigned k_len = d->int4 ? 32 : 16;          /* K of the tile: 128 bytes hold 8 rows of it */
    unsigned a_first = d->slide * k_len;         /* slide n starts n rows further into {vs1, vs1+1} */
    for (unsigned i = 0; i < TILE; i++) {
        for (unsigned j = 0; j < TILE; j++) {
            uint32_t acc = c[i * TILE + j];
            for (unsigned k = 0; k < k_len; k++) /* |product| <= 255*255: exact in int32; sum wraps */
                acc += (uint32_t)(elem(a, a_first + i * k_len + k, d->a_signed) *
                                  elem(b, j * k_len + k, d->b_signed));
            c[i * TILE + j] = acc;
        }
    }

    vreg_fill(d->vd, c);
    vreg_fill(d->vd + 1, c + VLENB / 4);
}

/* pack_len in bytes: imm2 0 is SEW, 1-3 are 128, 256, 512 bits. */
static unsigned pack_bytes(unsigned imm2) {
    unsigned long vtype;
    __asm__ volatile(WITH_V("csrr %0, vtype") : "=r"(vtype));
    return imm2 ? 16u << (imm2 - 1) : 1u << (vtype >> 3 & 7);
}

static void vpack_execute(const struct vpack *d) {
    uint8_t src[2 * VLENB], dst[2 * VLENB]; /* src: vs1 then vs2; dst: vd then vd+1 */
    vreg_spill(d->vs1, src);
    vreg_spill(d->vs2, src + VLENB);
    unsigned chunk = pack_bytes(d->imm2), per_reg = VLENB / chunk;
    for (unsigned c = 0; c < 2 * per_reg; c++) {
        /* chunk c of the interleaved stream is chunk c/2 of vs1 (c even) or of vs2 (c odd) */
        uint8_t *stream = (d->unpack ? src : dst) + c * chunk;
        uint8_t *plain = (d->unpack ? dst : src) + (c & 1) * VLENB + c / 2 * chunk;
        if (d->unpack)
            memcpy(plain, stream, chunk);
        else
            memcpy(stream, plain, chunk);
    }
    vreg_fill(d->vd, dst);
    vreg_fill(d->vd + 1, dst + VLENB);
}

static unsigned long emulated_count;

unsigned long imegen_ime2_emu_count(void) {
    return __atomic_load_n(&emulated_count, __ATOMIC_RELAXED);
}

/* Read the word at pc as two halfwords: pc is only 2-byte aligned, and a 16-bit
 * instruction may end a mapped page. */
static int fetch_insn32(uintptr_t pc, uint32_t *word) {
    const volatile uint16_t *p = (const volatile uint16_t *)pc;
    uint16_t lo = p[0];
    if ((lo & 3) != 3) /* compressed instruction */
        return 0;
    *word = lo | (uint32_t)p[1] << 16;
    return 1;
}

/* Say which word trapped and why it is not run, with async-signal-safe write(2) only: the process
 * dies next. */
static void report(uint32_t word, uintptr_t pc, const char *why) {
    char msg[] = "imegen IME2 emulator: illegal instruction 0x........ at pc 0x................: ";
    char *w = strstr(msg, "0x") + 2, *p = strstr(w, "0x") + 2;
    for (int i = 0; i < 8; i++)
        w[i] = "0123456789abcdef"[(word >> (28 - 4 * i)) & 15];
    for (int i = 0; i < 16; i++)
        p[i] = "0123456789abcdef"[(pc >> (60 - 4 * i)) & 15];
    ssize_t unused = write(2, msg, sizeof msg - 1);
    unused = write(2, why, strlen(why));
    (void)unused;
}

static void die_honestly(int sig) {
    /* The re-raised signal stays blocked until the handler returns, then the default action
     * terminates the process with SIGILL. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

static void on_sigill(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = ctx;
    uintptr_t pc = uc->uc_mcontext.__gregs[REG_PC];
    uint32_t word;
    struct vmadot d;
    /* si_code <= 0: sent by kill()/raise(), so pc says nothing about the cause. */
    if (si->si_code <= 0 || !fetch_insn32(pc, &word)) {
        die_honestly(sig);
        return;
    }
    const char *why = NULL;
    struct vpack pk;
    if (vpack_decode(word, &pk)) {
        if (!vtype_allows_pack())
            why = "vpack/vupack need LMUL 1 and vl = VLMAX at SEW 8 to 64\n";
        else if (!vpack_registers_legal(&pk))
            why = "the destination pair vd, vd+1 of vpack/vupack overlaps a source register\n";
        if (why) {
            report(word, pc, why);
            die_honestly(sig);
            return;
        }
        vpack_execute(&pk);
        __atomic_fetch_add(&emulated_count, 1, __ATOMIC_RELAXED);
        uc->uc_mcontext.__gregs[REG_PC] = pc + 4;
        return;
    }
    if (!vmadot_decode(word, &d))
        why = "not an IME2 instruction it runs (integer vmadot* i8/i4, vmadotN* i8, vpack.vv, vupack.vv; "
              "fp16: QEMU -cpu rv64,v=true,Zfh=true,vlen=1024)\n";
    else if (!vtype_allows_ime2())
        why = "IME2 needs LMUL 1 and vl = VLMAX at SEW 8, 16 or 32\n";
    else if (!registers_legal(&d))
        why = "the destination pair vd, vd+1 overlaps a source register\n";
    if (why) {
        report(word, pc, why);
        die_honestly(sig);
        return;
    }
    vmadot_execute(&d);
    __atomic_fetch_add(&emulated_count, 1, __ATOMIC_RELAXED);
    uc->uc_mcontext.__gregs[REG_PC] = pc + 4;
}

void imegen_ime2_emu_install(void) {
    unsigned long vlenb;
    __asm__ volatile(WITH_V("csrr %0, vlenb") : "=r"(vlenb));
    if (vlenb != VLENB) {
        fprintf(stderr,
                "imegen IME2 emulator: IME2 requires VLEN=1024 (K3 A100), but this CPU has VLEN=%lu; "
                "run QEMU with -cpu rv64,v=true,Zfh=true,vlen=1024\n",
                vlenb * 8);
        exit(3);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigill;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGILL, &sa, NULL) != 0) {
        perror("imegen IME2 emulator: sigaction(SIGILL)");
        exit(3);
    }
}
