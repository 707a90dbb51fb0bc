/* SIGILL trap-and-emulate for SpacemiT IME2 matrix and layout instructions (see ime2_emu.h).
 *
 * Build this file WITHOUT the V extension (-march=rv64gc): the handler runs while the interrupted
 * code's vector registers are live, and under QEMU user mode they are neither saved nor restored
 * around the signal. Compiled without V, the C code cannot touch them; the only vector instructions
 * are the explicit whole-register spills/fills of trap.h, which also leave vl and vtype alone.
 *
 * Semantics (docs/ime2-isa.md §2): C[8x8] int32 (rows 0-3 in vd, rows 4-7 in vd+1) += A x B^T.
 *   i8: A[8x16] = vs1 bytes row-major (slide n: rows n..n+7 of the 16x16 stack {vs1, vs1+1}),
 *       B^T[8x16] = vs2 bytes (byte 16*j + k is B[k][j]).
 *   i4: A[8x32], B^T[8x32], nibble e of a register in byte e/2 (even e: bits 3:0, odd e: bits 7:4).
 * Accumulation wraps mod 2^32.
 *
 * vmadot*.hp (block-scaled, docs/ime2-isa.md §6.2): the same integer dot products (int32 tmp), then per cell
 * vd[8i+j] = fp16(vd[8i+j] + fp16(fp16(tmp) * scale[j])), scale[j] = FP16 element 8*imm3 + j of v0/v1 and
 * C one register of 64 FP16. Each of the three steps is rounded to nearest, ties to even, as the spec's C
 * pseudocode reads (vd[p] += (fp16)tmp * scale); no flush of subnormals, NaN results are the canonical
 * 0x7e00. MCPM.BF16 (BF16 instead of FP16) is a control register, not part of the word: the emulator
 * assumes its FP16 setting, as llama.cpp's kernels do (they never write it).
 *
 * Also vpack.vv / vupack.vv (docs/ime2-isa.md §6.1), which every llama.cpp IME2 kernel uses to lay out
 * vmadot operands and results: chunks of pack_len bits (imm2: SEW, 128, 256, 512), the destination
 * being the register pair vd, vd+1 seen as one 2*VLEN-bit stream.
 *   vpack:  stream = vs1.chunk0, vs2.chunk0, vs1.chunk1, vs2.chunk1, ...
 *   vupack: the inverse; the stream {vs1, vs2} is split into its even chunks (-> vd) and odd chunks (-> vd+1).
 *
 * vmadot*.sp (4:2 sparse, docs/ime2-isa.md §6.3): A dense in {vs1, vs1+1} (i8 8x32, i4 8x64), B compressed in vs2
 * (8 columns of 16 / 32 stored values), per column and group of four k one mask nibble from v0/v1 (segment imm2)
 * whose two set bits (bit b = position b) say which two of A's four k meet B's two stored values:
 *   C[i][j] += A[i][4g + lo] * B[j][2g] + A[i][4g + hi] * B[j][2g + 1]   (no contribution for other nibbles)
 * the spec's pseudocode with K = 16 (i4: 32) stored values per column, the reading under which the spec's own
 * example prints what it does. Accumulation wraps mod 2^32.
 *
 * vfwmadot / vfwmadot1/2/3 (docs/ime2-isa.md §6.4): C[8x8] fp32 (rows 0-3 in vd, 4-7 in vd+1) += A[8x8] x B^T,
 * A and B FP16 (A rows slide..slide+7 of the 16x8 stack {vs1, vs1+1} for the slide forms), per cell and in the
 * order q = 0..7: vd[p] = fp32(vd[p] + a*b), the product exact, each sum rounded to nearest even. FP16 only
 * (MCPM.BF16 as for .hp).
 *
 * And vnpack4.vv (docs/ime2-isa.md §9.1), which llama.cpp's Q4_0 kernels use to split int8 activations into
 * nibbles: every source byte is truncated to its low 4 bits, whatever SEW is; two consecutive bytes make one
 * destination byte (the first in bits 3:0). vd (one register) is built of chunks of pack_len bits (imm2: 32,
 * 64, 128, 256), alternately from vs1 and vs2, each the nibbles of the next 2*pack_len bits of its source:
 *   vd = nib(vs1 bytes 0..2c-1), nib(vs2 bytes 0..2c-1), nib(vs1 bytes 2c..4c-1), ...   (c = pack_len/8)
 * so all of vs1 and vs2 land in vd. The spec's pseudocode cannot be run as written; this is the reading under
 * which SpacemiT's own kernels compute what their scalar references say.
 */
#define _GNU_SOURCE /* REG_PC and the ucontext_t register names */
#include "harts.h"
#include "ime2_emu.h"
#include "trap.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#define VLENB 128 /* A100: VLEN = 1024 bits */
#define TILE 8    /* M = N = 8 for every integer form */

struct vmadot {
    unsigned vd, vs1, vs2, slide;
    int int4, a_signed, b_signed;
};

struct vmadot_hp {
    unsigned vd, vs1, vs2, scale, imm3;
    int int4, a_signed, b_signed;
};

struct vpack {
    unsigned vd, vs1, vs2, imm2;
    int unpack;
};

struct vnpack4 {
    unsigned vd, vs1, vs2, imm2;
};

struct vmadot_sp {
    unsigned vd, vs1, vs2, mask, imm2;
    int int4, a_signed, b_signed;
};

struct vfwmadot {
    unsigned vd, vs1, vs2, slide;
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

/* Decode smt.vnpack4.vv (spec §8.6.2): [31:26] 010000, [25] 1, [14] 0 (1 is the saturating vnspack4, not run),
 * [13:12] imm2, vd any register. 0 for anything else. */
static int vnpack4_decode(uint32_t w, struct vnpack4 *d) {
    if ((w & 0x7f) != 0x2b || w >> 25 != 0x21 || (w >> 14 & 1))
        return 0;
    d->vd = w >> 7 & 31;
    d->vs1 = w >> 15 & 31;
    d->vs2 = w >> 20 & 31;
    d->imm2 = w >> 12 & 3;
    return 1;
}

/* The spec does not say what a destination pair overlapping a source computes; refuse it rather than
 * pick an answer (no llama.cpp kernel does it). */
static int vpack_registers_legal(const struct vpack *d) {
    return d->vs1 != d->vd && d->vs1 != d->vd + 1 && d->vs2 != d->vd && d->vs2 != d->vd + 1;
}

/* vnpack4: vd must not be a source. The spec's register rules (§8.6.2) say nothing; no kernel does it, and
 * hardware that writes vd while still reading a source need not give what spilling first gives. */
static int vnpack4_registers_legal(const struct vnpack4 *d) {
    return d->vd != d->vs1 && d->vd != d->vs2;
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

/* Decode an IME2 vmadot*.hp word (spec §8.4): [31] 1, DT i4 (10) or i8 (11), the signedness family in
 * [28:26] (011 uu, 100 ss, 101 su, 110 us; others reserved), [25] scale register v0/v1, imm3 in [14:12],
 * vd any register. 0 for anything else. */
static int vmadot_hp_decode(uint32_t w, struct vmadot_hp *d) {
    unsigned dtype = w >> 29 & 3, family = w >> 26 & 7;
    if ((w & 0x7f) != 0x2b || !(w >> 31) || dtype < 2 || family < 3 || family > 6)
        return 0;
    /* (A, B) signed per family: 011 uu, 100 ss, 101 su, 110 us */
    static const unsigned char a_signed[] = {0, 0, 0, 0, 1, 1, 0}, b_signed[] = {0, 0, 0, 0, 1, 0, 1};
    d->a_signed = a_signed[family];
    d->b_signed = b_signed[family];
    d->int4 = dtype == 2;
    d->scale = w >> 25 & 1;
    d->vs2 = w >> 20 & 31;
    d->vs1 = w >> 15 & 31;
    d->imm3 = w >> 12 & 7;
    d->vd = w >> 7 & 31;
    return 1;
}

/* .hp (MUL_C 1): vd must not be vs1 or vs2 (spec §2.3, §5.4.5). vd must not be the scale register either:
 * the spec does not list it, but its pseudocode updates vd[p] while later cells still read vscale, so the
 * result would depend on an order the spec leaves open (imegen's encoder refuses it too). */
static int hp_registers_legal(const struct vmadot_hp *d) {
    return d->vd != d->vs1 && d->vd != d->vs2 && d->vd != d->scale;
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

/* Decode an IME2 vmadot*.sp word (spec §8.3): [31] 1, DT i4 (10) or i8 (11), family 010, [25] mask v0/v1,
 * vs1[4:1] in [19:16], imm2 in [15] and [7], [14] 0, sg in [13:12], vd[4:1] in [11:8]. 0 for anything else. */
static int vmadot_sp_decode(uint32_t w, struct vmadot_sp *d) {
    unsigned dtype = w >> 29 & 3, family = w >> 26 & 7;
    if ((w & 0x7f) != 0x2b || !(w >> 31) || dtype < 2 || family != 2 || (w >> 14 & 1))
        return 0;
    d->int4 = dtype == 2;
    d->mask = w >> 25 & 1;
    d->vs2 = w >> 20 & 31;
    d->vs1 = (w >> 16 & 15) << 1;
    d->imm2 = (w >> 15 & 1) << 1 | (w >> 7 & 1);
    d->a_signed = w >> 13 & 1;
    d->b_signed = w >> 12 & 1;
    d->vd = (w >> 8 & 15) << 1;
    return 1;
}

/* §5.3.5: imm2 must select a segment of the mask register: 256 bits each for i8 (0-3), 512 for i4 (0-1). */
static int sp_segment_legal(const struct vmadot_sp *d) {
    return d->imm2 < (d->int4 ? 2u : 4u);
}

/* The destination pair must not overlap a source: A's pair, B or the mask register (§2.3, §5.3.5). */
static int sp_registers_legal(const struct vmadot_sp *d) {
    unsigned vd = d->vd;
    int a_overlaps = d->vs1 <= vd + 1 && vd <= d->vs1 + 1;
    int other_overlaps = d->vs2 == vd || d->vs2 == vd + 1 || d->mask == vd || d->mask == vd + 1;
    return !a_overlaps && !other_overlaps;
}

/* §5.3.4's case table: for each 4-bit mask, the positions (0-3 in a group of four k) of the two A elements it
 * selects, lower first (bit b selects position b); 0 for the ten patterns that select nothing (§5.3.3). */
static const unsigned char SP_PICK[16] = {
    [0x3] = 0x10 | 0, [0x5] = 0x20 | 0, [0x6] = 0x20 | 1, [0x9] = 0x30 | 0, [0xa] = 0x30 | 1, [0xc] = 0x30 | 2,
};
#define SP_LO(pick) ((pick) & 15u)
#define SP_HI(pick) ((pick) >> 4)

/* Mask nibble n of the register: byte n/2, bits 3:0 for even n (the 4-bit element order of §2.7.2). */
static unsigned mask_nibble(const uint8_t *mask, unsigned n) {
    return mask[n >> 1] >> (4 * (n & 1)) & 15;
}

static void vmadot_sp_execute(const struct vmadot_sp *d) {
    uint8_t a[2 * VLENB], b[VLENB], mask[VLENB];
    uint32_t c[2 * VLENB / 4];
    vreg_spill(d->vs1, a);
    vreg_spill(d->vs1 + 1, a + VLENB);
    vreg_spill(d->vs2, b);
    vreg_spill(d->mask, mask);
    vreg_spill(d->vd, c);
    vreg_spill(d->vd + 1, c + VLENB / 4);

    int32_t (*elem)(const uint8_t *, unsigned, int) = d->int4 ? nibble_elem : byte_elem;
    unsigned a_len = d->int4 ? 64 : 32; /* A's (logical) k per row: {vs1, vs1+1} holds 8 such rows */
    unsigned b_len = a_len / 2;         /* B's stored values per column: vs2 holds 8 columns */
    unsigned groups = a_len / 4;        /* one mask nibble per group of four k */
    unsigned segment = d->imm2 * TILE * groups; /* first nibble of the segment imm2 selects */
    for (unsigned i = 0; i < TILE; i++) {
        for (unsigned j = 0; j < TILE; j++) {
            uint32_t acc = c[i * TILE + j];
            for (unsigned g = 0; g < groups; g++) {
                unsigned pick = SP_PICK[mask_nibble(mask, segment + j * groups + g)];
                if (!pick) /* not one of the six patterns: no contribution (§5.3.3) */
                    continue;
                unsigned lo = SP_LO(pick), hi = SP_HI(pick);
                unsigned a_row = i * a_len + 4 * g, b_col = j * b_len + 2 * g;
                acc += (uint32_t)(elem(a, a_row + lo, d->a_signed) * elem(b, b_col, d->b_signed));
                acc += (uint32_t)(elem(a, a_row + hi, d->a_signed) * elem(b, b_col + 1, d->b_signed));
            }
            c[i * TILE + j] = acc;
        }
    }
    vreg_fill(d->vd, c);
    vreg_fill(d->vd + 1, c + VLENB / 4);
}

/* Decode smt.vfwmadot / vfwmadot1/2/3 (spec §8.5): [31:25] 1001111, vs2, vs1, [14:12] 100 (base) or 101, 110,
 * 111 (slide 1-3), vd, custom-1. vd and (slides) vs1 are taken whole: vfwmadot_registers_why refuses odd ones.
 * 0 for anything else, [14:12] 0xx included. */
static int vfwmadot_decode(uint32_t w, struct vfwmadot *d) {
    if ((w & 0x7f) != 0x2b || w >> 25 != 0x4f || !(w >> 14 & 1))
        return 0;
    d->vd = w >> 7 & 31;
    d->vs1 = w >> 15 & 31;
    d->vs2 = w >> 20 & 31;
    d->slide = w >> 12 & 3;
    return 1;
}

/* §6.1.5, §6.2.4, §8.5: vd even, vs1 even for the slides (A is the pair vs1, vs1+1), and the pair vd, vd+1 off
 * every source register. NULL if legal, else why not (one line). */
static const char *vfwmadot_registers_why(const struct vfwmadot *d) {
    if (d->vd & 1)
        return "vd of vfwmadot must be even (C is the pair vd, vd+1)\n";
    if (d->slide && (d->vs1 & 1))
        return "vs1 of vfwmadot1/2/3 must be even (A is the pair vs1, vs1+1)\n";
    unsigned a_last = d->slide ? d->vs1 + 1 : d->vs1;
    int a_overlaps = d->vs1 <= d->vd + 1 && d->vd <= a_last;
    if (a_overlaps || d->vs2 == d->vd || d->vs2 == d->vd + 1)
        return "the destination pair vd, vd+1 of vfwmadot overlaps a source register\n";
    return NULL;
}

/* ---- FP16 arithmetic in integers (the handler must leave the interrupted code's f registers and fcsr
 * alone, and GCC 12 has no _Float16 for RISC-V). Every step computes its exact result as
 * (-1)^neg * mag * 2^exp and rounds it once to FP16, to nearest with ties to even. */

#define FP16_CANONICAL_NAN 0x7e00u /* RISC-V's canonical NaN: the F/Zfh result for any NaN */
#define FP16_INF 0x7c00u

static int fp16_is_nan(uint16_t h) { return (h & 0x7fff) > FP16_INF; }
static int fp16_is_inf(uint16_t h) { return (h & 0x7fff) == FP16_INF; }

/* A finite FP16 as magnitude and exponent: value = mag * 2^exp (subnormals: exponent field 0). */
static void fp16_split(uint16_t h, uint64_t *mag, int *exp) {
    unsigned field = h >> 10 & 31, frac = h & 0x3ff;
    *mag = field ? frac | 0x400 : frac;
    *exp = field ? (int)field - 25 : -24;
}

/* Round (-1)^neg * mag * 2^exp to FP16 (RNE; overflow to infinity, gradual underflow). mag < 2^62. */
static uint16_t fp16_round(int neg, uint64_t mag, int exp) {
    uint16_t sign = (uint16_t)(neg ? 0x8000 : 0);
    if (mag == 0)
        return sign;
    int top = 63 - __builtin_clzll(mag);     /* value in [2^(top+exp), 2^(top+exp+1)) */
    int e = top + exp < -14 ? -14 : top + exp; /* subnormals share the smallest normal's quantum */
    int quantum = e - 10;                     /* 11 significant bits: the result is r * 2^quantum */
    uint64_t r;
    if (quantum <= exp) {
        r = mag << (exp - quantum); /* exact */
    } else {
        int shift = quantum - exp;
        if (shift > 62) {
            r = 0; /* below half the quantum: mag < 2^62 <= 2^(shift - 1) */
        } else {
            uint64_t rest = mag & ((1ull << shift) - 1), half = 1ull << (shift - 1);
            r = mag >> shift;
            if (rest > half || (rest == half && (r & 1)))
                r++;
        }
    }
    if (r >> 11) { /* rounding carried into the next binade */
        r >>= 1;
        quantum++;
    }
    if (r < 0x400) /* subnormal (quantum is 2^-24) or zero */
        return sign | (uint16_t)r;
    int field = quantum + 25;
    if (field >= 31)
        return sign | FP16_INF;
    return sign | (uint16_t)(field << 10 | (r & 0x3ff));
}

/* (fp16)tmp: |tmp| <= 2^21 here (16 x 255 x 255 for i8), exact before the one rounding. */
static uint16_t fp16_from_int(int32_t tmp) {
    return fp16_round(tmp < 0, tmp < 0 ? (uint64_t)(-(int64_t)tmp) : (uint64_t)tmp, 0);
}

static uint16_t fp16_mul(uint16_t a, uint16_t b) {
    int neg = (a ^ b) >> 15;
    if (fp16_is_nan(a) || fp16_is_nan(b))
        return FP16_CANONICAL_NAN;
    if (fp16_is_inf(a) || fp16_is_inf(b)) {
        if (!(a & 0x7fff) || !(b & 0x7fff)) /* inf x 0 */
            return FP16_CANONICAL_NAN;
        return (uint16_t)(neg << 15 | FP16_INF);
    }
    uint64_t ma, mb;
    int ea, eb;
    fp16_split(a, &ma, &ea);
    fp16_split(b, &mb, &eb);
    return fp16_round(neg, ma * mb, ea + eb); /* the product: 22 bits, exact */
}

static uint16_t fp16_add(uint16_t a, uint16_t b) {
    if (fp16_is_nan(a) || fp16_is_nan(b))
        return FP16_CANONICAL_NAN;
    if (fp16_is_inf(a) || fp16_is_inf(b)) {
        if (fp16_is_inf(a) && fp16_is_inf(b) && (a ^ b) >> 15) /* inf - inf */
            return FP16_CANONICAL_NAN;
        return fp16_is_inf(a) ? a : b;
    }
    /* Both exactly in units of 2^-24 (at most 2^40 of them): the sum is exact in int64. */
    uint64_t ma, mb;
    int ea, eb;
    fp16_split(a, &ma, &ea);
    fp16_split(b, &mb, &eb);
    int64_t sa = (int64_t)(ma << (ea + 24)), sb = (int64_t)(mb << (eb + 24));
    int64_t sum = (a >> 15 ? -sa : sa) + (b >> 15 ? -sb : sb);
    if (sum == 0) /* exact zero: -0 only for -0 + -0 (IEEE 754, round to nearest) */
        return (uint16_t)(a & b & 0x8000);
    return fp16_round(sum < 0, (uint64_t)(sum < 0 ? -sum : sum), -24);
}

/* One .hp cell, as the spec's pseudocode: vd[p] += (fp16)tmp * scale, each operation rounded to FP16. */
static uint16_t hp_cell(uint16_t acc, int32_t tmp, uint16_t scale) {
    return fp16_add(acc, fp16_mul(fp16_from_int(tmp), scale));
}

static void vmadot_hp_execute(const struct vmadot_hp *d) {
    uint8_t a[VLENB], b[VLENB];
    uint16_t scales[VLENB / 2], c[VLENB / 2];
    vreg_spill(d->vs1, a);
    vreg_spill(d->vs2, b);
    vreg_spill(d->scale, scales);
    vreg_spill(d->vd, c);

    int32_t (*elem)(const uint8_t *, unsigned, int) = d->int4 ? nibble_elem : byte_elem;
    unsigned k_len = d->int4 ? 32 : 16;
    const uint16_t *group = scales + d->imm3 * TILE; /* imm3 selects 128 bits: 8 FP16 scales, one per column */
    for (unsigned i = 0; i < TILE; i++) {
        for (unsigned j = 0; j < TILE; j++) {
            int32_t tmp = 0; /* |tmp| <= 16 x 255 x 255: no wrap */
            for (unsigned k = 0; k < k_len; k++)
                tmp += elem(a, i * k_len + k, d->a_signed) * elem(b, j * k_len + k, d->b_signed);
            c[i * TILE + j] = hp_cell(c[i * TILE + j], tmp, group[j]);
        }
    }
    vreg_fill(d->vd, c);
}

/* ---- FP32 accumulation of exact FP16 products (vfwmadot), in integers like the FP16 code above. */

#define FP32_CANONICAL_NAN 0x7fc00000u
#define FP32_INF 0x7f800000u

static int fp32_is_nan(uint32_t f) { return (f & 0x7fffffffu) > FP32_INF; }
static int fp32_is_inf(uint32_t f) { return (f & 0x7fffffffu) == FP32_INF; }

/* A finite FP32 as magnitude and exponent: value = mag * 2^exp (subnormals: exponent field 0). */
static void fp32_split(uint32_t f, uint64_t *mag, int *exp) {
    unsigned field = f >> 23 & 255, frac = f & 0x7fffff;
    *mag = field ? frac | 0x800000u : frac;
    *exp = field ? (int)field - 150 : -149;
}

/* Round (-1)^neg * mag * 2^exp to FP32 (RNE; overflow to infinity, gradual underflow). 0 < mag < 2^63. */
static uint32_t fp32_round(int neg, uint64_t mag, int exp) {
    uint32_t sign = neg ? 0x80000000u : 0;
    int top = 63 - __builtin_clzll(mag);        /* value in [2^(top+exp), 2^(top+exp+1)) */
    int e = top + exp < -126 ? -126 : top + exp; /* subnormals share the smallest normal's quantum */
    int quantum = e - 23;                        /* 24 significant bits: the result is r * 2^quantum */
    uint64_t r;
    if (quantum <= exp) {
        r = mag << (exp - quantum); /* exact */
    } else {
        int shift = quantum - exp;
        if (shift > 63) {
            r = 0; /* below half the quantum: mag < 2^63 <= 2^(shift - 1) */
        } else {
            uint64_t rest = mag & ((1ull << shift) - 1), half = 1ull << (shift - 1);
            r = mag >> shift;
            if (rest > half || (rest == half && (r & 1)))
                r++;
        }
    }
    if (r >> 24) { /* rounding carried into the next binade */
        r >>= 1;
        quantum++;
    }
    if (r < 0x800000u) /* subnormal (quantum is 2^-149) or zero */
        return sign | (uint32_t)r;
    int field = quantum + 150;
    if (field >= 255)
        return sign | FP32_INF;
    return sign | (uint32_t)field << 23 | ((uint32_t)r & 0x7fffff);
}

/* fp32(x + y) for nonzero finite x = (-1)^nx * mx * 2^ex and y likewise, mx, my < 2^25: one rounding of the
 * exact sum. The larger operand is put at bit 61 of a doubled scale; what the other loses below its last bit is
 * kept as a sticky 1 in bit 0, where neither an FP32 result nor a rounding midpoint can lie. */
static uint32_t fp32_sum(int nx, uint64_t mx, int ex, int ny, uint64_t my, int ey) {
    if (63 - __builtin_clzll(my) + ey > 63 - __builtin_clzll(mx) + ex) { /* x the larger in magnitude bound */
        int tn = nx; uint64_t tm = mx; int te = ex;
        nx = ny; mx = my; ex = ey;
        ny = tn; my = tm; ey = te;
    }
    int up = 60 - (63 - __builtin_clzll(mx));
    mx <<= up;
    ex -= up;
    int d = ex - ey; /* d <= 0: y fits exactly (its top is at most bit 60) */
    uint64_t y = 0, lost = 0;
    if (d <= 0) {
        y = my << -d;
    } else if (d < 64) {
        y = my >> d;
        lost = (my & ((1ull << d) - 1)) != 0;
    } else {
        lost = 1;
    }
    int64_t sx = (int64_t)(mx << 1), sy = (int64_t)(y << 1 | lost);
    int64_t sum = (nx ? -sx : sx) + (ny ? -sy : sy);
    if (sum == 0) /* exact cancellation: +0 in round to nearest */
        return 0;
    return fp32_round(sum < 0, (uint64_t)(sum < 0 ? -sum : sum), ex - 1);
}

/* One step of the spec's loop: fp32(acc + (fp32)a * (fp32)b). The product of two FP16 is exact in FP32 (22
 * significant bits, exponents -48..31), so the step rounds once, at the sum. NaN results are canonical. */
static uint32_t fp32_add_fp16_product(uint32_t acc, uint16_t a, uint16_t b) {
    if (fp32_is_nan(acc) || fp16_is_nan(a) || fp16_is_nan(b))
        return FP32_CANONICAL_NAN;
    uint32_t neg = (uint32_t)((a ^ b) >> 15);
    int zero = !(a & 0x7fff) || !(b & 0x7fff);
    if (fp16_is_inf(a) || fp16_is_inf(b)) {
        if (zero || (fp32_is_inf(acc) && acc >> 31 != neg)) /* inf x 0, inf - inf */
            return FP32_CANONICAL_NAN;
        return neg << 31 | FP32_INF;
    }
    if (fp32_is_inf(acc))
        return acc;
    if (zero) /* acc + (+-0): acc, or -0 only for -0 + -0 */
        return acc & 0x7fffffffu ? acc : acc & neg << 31;
    uint64_t ma, mb, mc;
    int ea, eb, ec;
    fp16_split(a, &ma, &ea);
    fp16_split(b, &mb, &eb);
    if (!(acc & 0x7fffffffu))
        return fp32_round((int)neg, ma * mb, ea + eb); /* exact */
    fp32_split(acc, &mc, &ec);
    return fp32_sum((int)(acc >> 31), mc, ec, (int)neg, ma * mb, ea + eb);
}

#define FW_K 8 /* vfwmadot's K: vs1 holds 8 rows of 8 FP16, vs2 8 columns of 8 */

static void vfwmadot_execute(const struct vfwmadot *d) {
    uint16_t a[2 * VLENB / 2], b[VLENB / 2];
    uint32_t c[2 * VLENB / 4];
    vreg_spill(d->vs1, a);
    if (d->slide)
        vreg_spill(d->vs1 + 1, a + VLENB / 2);
    vreg_spill(d->vs2, b);
    vreg_spill(d->vd, c);
    vreg_spill(d->vd + 1, c + VLENB / 4);

    const uint16_t *a_rows = a + d->slide * FW_K; /* slide n: rows n..n+7 of the 16 rows in {vs1, vs1+1} */
    for (unsigned i = 0; i < TILE; i++) {
        for (unsigned j = 0; j < TILE; j++) {
            uint32_t acc = c[i * TILE + j];
            for (unsigned q = 0; q < FW_K; q++) /* the spec's order: one rounded FP32 sum per product */
                acc = fp32_add_fp16_product(acc, a_rows[i * FW_K + q], b[j * FW_K + q]);
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

/* memcpy without libc: the counting plugin (imegen/perf/count) cannot tell libc code the handler runs from
 * libc code a kernel calls, so the per-trap path calls none (volatile: no loop-to-memcpy rewrite). */
static void copy_bytes(uint8_t *dst, const uint8_t *src, unsigned n) {
    for (unsigned i = 0; i < n; i++)
        ((volatile uint8_t *)dst)[i] = src[i];
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
            copy_bytes(plain, stream, chunk);
        else
            copy_bytes(stream, plain, chunk);
    }
    vreg_fill(d->vd, dst);
    vreg_fill(d->vd + 1, dst + VLENB);
}

/* vnpack4 (docs/ime2-isa.md §9.1): pack_len = 32 << imm2 bits of vd per chunk, chunks alternately from vs1
 * and vs2, each the low nibbles of 2 * pack_len bits of its source, byte 2j in bits 3:0 and byte 2j+1 in
 * bits 7:4 of destination byte j. Under every SEW the elements are bytes (llama.cpp issues it under e8 and
 * e16 on int8 codes). */
static void vnpack4_execute(const struct vnpack4 *d) {
    uint8_t src[2 * VLENB], dst[VLENB]; /* src: vs1 then vs2 */
    vreg_spill(d->vs1, src);
    vreg_spill(d->vs2, src + VLENB);
    unsigned out_chunk = 4u << d->imm2; /* bytes of vd per chunk */
    for (unsigned c = 0; c < VLENB / out_chunk; c++) {
        /* chunk c: from vs1 (c even) or vs2 (c odd), that source's chunk c / 2 of 2 * out_chunk bytes */
        const uint8_t *in = src + (c & 1) * VLENB + c / 2 * 2 * out_chunk;
        for (unsigned j = 0; j < out_chunk; j++)
            dst[c * out_chunk + j] = (uint8_t)((in[2 * j] & 15) | (in[2 * j + 1] & 15) << 4);
    }
    vreg_fill(d->vd, dst);
}

static unsigned long emulated_count, emulated_kind[IMEGEN_IME2_KINDS];

unsigned long imegen_ime2_emu_count(void) {
    return __atomic_load_n(&emulated_count, __ATOMIC_RELAXED);
}

unsigned long imegen_ime2_emu_count_kind(int kind) {
    return kind >= 0 && kind < IMEGEN_IME2_KINDS ? __atomic_load_n(&emulated_kind[kind], __ATOMIC_RELAXED) : 0;
}

#define BAD_VTYPE "IME2 needs LMUL 1 and vl = VLMAX at SEW 8, 16 or 32\n"

/* Run `word` on the live registers; NULL if it ran (its kind in *kind), else why it is not run (one line). */
static const char *emulate(uint32_t word, int *kind) {
    struct vpack pk;
    struct vnpack4 np;
    struct vmadot_hp hp;
    struct vmadot_sp sp;
    struct vfwmadot fw;
    struct vmadot d;
    if (vpack_decode(word, &pk)) {
        if (!vtype_allows_pack())
            return "vpack/vupack need LMUL 1 and vl = VLMAX at SEW 8 to 64\n";
        if (!vpack_registers_legal(&pk))
            return "the destination pair vd, vd+1 of vpack/vupack overlaps a source register\n";
        vpack_execute(&pk);
        *kind = !pk.unpack ? IMEGEN_IME2_VPACK : pk.imm2 < 2 ? IMEGEN_IME2_VUPACK_SLOW : IMEGEN_IME2_VUPACK;
    } else if (vnpack4_decode(word, &np)) {
        if (!vtype_allows_pack())
            return "vnpack4 needs LMUL 1 and vl = VLMAX at SEW 8 to 64\n";
        if (!vnpack4_registers_legal(&np))
            return "vd of vnpack4 is a source register\n";
        vnpack4_execute(&np);
        *kind = IMEGEN_IME2_VNPACK4;
    } else if (vmadot_hp_decode(word, &hp)) {
        if (!vtype_allows_ime2())
            return BAD_VTYPE;
        if (!hp_registers_legal(&hp))
            return "vd of vmadot*.hp is vs1, vs2 or the scale register\n";
        vmadot_hp_execute(&hp);
        *kind = IMEGEN_IME2_VMADOT_HP;
    } else if (vmadot_sp_decode(word, &sp)) {
        if (!vtype_allows_ime2())
            return BAD_VTYPE;
        if (!sp_segment_legal(&sp))
            return "imm2 of vmadot*.sp i4 selects a mask segment beyond v0/v1 (0 or 1: 512 bits each)\n";
        if (!sp_registers_legal(&sp))
            return "the destination pair vd, vd+1 of vmadot*.sp overlaps a source register (vs1, vs1+1, vs2 or "
                   "the mask register)\n";
        vmadot_sp_execute(&sp);
        *kind = IMEGEN_IME2_VMADOT_SP;
    } else if (vfwmadot_decode(word, &fw)) {
        if (!vtype_allows_ime2())
            return BAD_VTYPE;
        const char *why = vfwmadot_registers_why(&fw);
        if (why)
            return why;
        vfwmadot_execute(&fw);
        *kind = IMEGEN_IME2_VFWMADOT;
    } else if (vmadot_decode(word, &d)) {
        if (!vtype_allows_ime2())
            return BAD_VTYPE;
        if (!registers_legal(&d))
            return "the destination pair vd, vd+1 overlaps a source register\n";
        vmadot_execute(&d);
        *kind = IMEGEN_IME2_VMADOT;
    } else {
        return "not an IME2 instruction it runs (integer vmadot* i8/i4, vmadotN* i8, vmadot*.sp i8/i4, vmadot*.hp "
               "i8/i4 with FP16 scales, vfwmadot/vfwmadotN with FP16 inputs, vpack.vv, vupack.vv, vnpack4.vv; FP16 "
               "code needs QEMU -cpu rv64,v=true,Zfh=true,vlen=1024)\n";
    }
    return NULL;
}

/* With IMEGEN_IME_HARTS set, only the harts it names have IME2: an illegal instruction elsewhere dies, as on a
 * K3's X100 cores, so a test proves that the code under it never issues one there. */
static int harts_restricted;
static cpu_set_t ime2_harts;

static void on_sigill(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = ctx;
    uintptr_t pc = uc->uc_mcontext.__gregs[REG_PC];
    uint32_t word;
    /* si_code <= 0: sent by kill()/raise(), so pc says nothing about the cause. */
    if (si->si_code <= 0 || !fetch_insn32(pc, &word)) {
        die_honestly(sig);
        return;
    }
    const int hart = harts_restricted ? sched_getcpu() : -1;
    if (harts_restricted && (hart < 0 || hart >= CPU_SETSIZE || !CPU_ISSET(hart, &ime2_harts))) {
        imegen_report_hart_without_ime("imegen IME2 emulator", "an IME2 (or illegal) instruction", hart);
        die_honestly(sig);
        return;
    }
    int kind = 0;
    const char *why = emulate(word, &kind);
    if (why) {
        report_trap("imegen IME2 emulator", word, pc, why);
        die_honestly(sig);
        return;
    }
    __atomic_fetch_add(&emulated_count, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&emulated_kind[kind], 1, __ATOMIC_RELAXED);
    uc->uc_mcontext.__gregs[REG_PC] = pc + 4;
}

void imegen_ime2_emu_install(void) {
    harts_restricted = imegen_install_emulator("imegen IME2 emulator", "IME2", "K3 A100", VLENB, "8-15 or 8,10",
                                               &ime2_harts, on_sigill);
}
