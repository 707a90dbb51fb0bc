/* SIGILL trap-and-emulate for SpacemiT K1 IME vmadot* (see ime_emu.h).
 *
 * Build this file WITHOUT the V extension (-march=rv64gc): the handler runs while the
 * interrupted code's vector registers are live, and under QEMU user mode they are neither
 * saved nor restored around the signal. Compiled without V, the C code cannot touch them;
 * the only vector instructions are the explicit whole-register spills/fills of trap.h, which
 * also leave vl and vtype alone.
 *
 * Semantics (docs/ime-isa.md §2): C[4x4] int32 (rows 0-1 in vd, rows 2-3 in vd+1)
 * += A[4x8] x B^T, A = vs1 bytes row-major (slide n: rows n..n+3 of the 8x8 stack
 * {vs1, vs1+1}), B^T = vs2 bytes (byte j*8+k is B[k][j]). Accumulation wraps mod 2^32.
 */
#define _GNU_SOURCE /* REG_PC and the ucontext_t register names */
#include "ime_emu.h"
#include "harts.h"
#include "trap.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#define VLENB 32 /* K1: VLEN = 256 bits */

struct vmadot {
    unsigned vd, vs1, vs2, slide;
    int a_signed, b_signed;
};

/* Decode a K1 vmadot word (LLVM RISCVInstrInfoXSpacemiT.td); 0 if it is anything else. */
static int vmadot_decode(uint32_t w, struct vmadot *d) {
    unsigned funct7 = w >> 25;
    if ((w & 0x7f) != 0x2b || (w >> 7 & 1)) /* custom-1, vd even */
        return 0;
    if (funct7 == 0x71) { /* base: bit 14 reserved */
        if (w >> 14 & 1)
            return 0;
        d->vs1 = w >> 15 & 31;
        d->slide = 0;
    } else if (funct7 == 0x73) { /* slide: vs1[4:1] in [19:16], slide-1 in [15:14] */
        unsigned funct2 = w >> 14 & 3;
        if (funct2 == 3)
            return 0;
        d->vs1 = (w >> 16 & 15) << 1;
        d->slide = funct2 + 1;
    } else {
        return 0;
    }
    d->vd = w >> 7 & 31;
    d->vs2 = w >> 20 & 31;
    d->a_signed = w >> 13 & 1; /* sg: 00 uu, 01 us, 10 su, 11 ss (A, B) */
    d->b_signed = w >> 12 & 1;
    return 1;
}

/* The IME spec selects the multiply-accumulate unit from vl x SEW and LMUL must be 1; any
 * other combination must raise illegal instruction (docs/ime-isa.md §5). The K1 has one unit,
 * the 4x4x8 int8 one: SEW = 8 with vl x SEW = VLEN (vl = 32 at VLEN 256). Emulating a vmadot
 * issued under e.g. e8 with vl = 16, e16, or e32,m2 would hide a bug real hardware traps on. */
static int vtype_allows_ime(void) {
    unsigned long vtype, vl;
    __asm__ volatile(WITH_V("csrr %0, vtype") : "=r"(vtype));
    __asm__ volatile(WITH_V("csrr %0, vl") : "=r"(vl));
    int vill = (int)(vtype >> (8 * sizeof vtype - 1));
    unsigned long vsew = vtype >> 3 & 7, vlmul = vtype & 7;
    return !vill && vlmul == 0 /* LMUL = 1 */ && vsew == 0 /* SEW = 8 */ && vl == VLENB;
}

static int32_t elem(uint8_t byte, int is_signed) {
    return is_signed ? (int8_t)byte : byte;
}

static void vmadot_execute(const struct vmadot *d) {
    /* Spill every source before writing vd: results are then defined even for overlapping
     * registers, which the assembler rejects but the hardware need not check. */
    uint8_t a[2 * VLENB], b[VLENB];
    uint32_t c[2 * VLENB / 4];
    vreg_spill(d->vs1, a);
    if (d->slide)
        vreg_spill(d->vs1 + 1, a + VLENB);
    vreg_spill(d->vs2, b);
    vreg_spill(d->vd, c);
    vreg_spill(d->vd + 1, c + VLENB / 4);

    const uint8_t *arow0 = a + 8 * d->slide;
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++) {
            uint32_t acc = c[i * 4 + j];
            for (int k = 0; k < 8; k++) /* |product| <= 255*255: exact in int32; sum wraps */
                acc += (uint32_t)(elem(arow0[i * 8 + k], d->a_signed) *
                                  elem(b[j * 8 + k], d->b_signed));
            c[i * 4 + j] = acc;
        }
    }

    vreg_fill(d->vd, c);
    vreg_fill(d->vd + 1, c + VLENB / 4);
}

static unsigned long emulated_count;

/* With IMEGEN_IME_HARTS set, only the harts it names have IME: a vmadot elsewhere dies by SIGILL, as
 * on a K1's cores 4-7, so a test proves that the code under it never runs one there. */
static int harts_restricted;
static cpu_set_t ime_harts;

unsigned long imegen_ime_emu_count(void) {
    return __atomic_load_n(&emulated_count, __ATOMIC_RELAXED);
}

static void on_sigill(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = ctx;
    uintptr_t pc = uc->uc_mcontext.__gregs[REG_PC];
    uint32_t word;
    struct vmadot d;
    /* si_code <= 0: sent by kill()/raise(), so pc says nothing about the cause. */
    int hart = harts_restricted ? sched_getcpu() : -1;
    int no_ime_here = harts_restricted && (hart < 0 || hart >= CPU_SETSIZE || !CPU_ISSET(hart, &ime_harts));
    if (si->si_code <= 0 || !fetch_insn32(pc, &word) || !vmadot_decode(word, &d) ||
        !vtype_allows_ime() || no_ime_here) {
        if (si->si_code > 0 && no_ime_here && fetch_insn32(pc, &word) && vmadot_decode(word, &d))
            imegen_report_hart_without_ime("imegen IME emulator", "vmadot", hart);
        else if (si->si_code > 0 && fetch_insn32(pc, &word))
            report_trap("imegen IME emulator", word, pc, "not an IME instruction it runs (IME: vsetvli e8 m1 first; "
                        "fp16: QEMU -cpu rv64,v=true,Zfh=true,vlen=256)\n");
        die_honestly(sig); /* not ours */
        return;
    }
    vmadot_execute(&d);
    __atomic_fetch_add(&emulated_count, 1, __ATOMIC_RELAXED);
    uc->uc_mcontext.__gregs[REG_PC] = pc + 4;
}

void imegen_ime_emu_install(void) {
    harts_restricted = imegen_install_emulator("imegen IME emulator", "IME", "K1", VLENB, "0-3 or 0,2",
                                               &ime_harts, on_sigill);
}
