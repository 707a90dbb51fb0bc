/* SIGILL trap-and-emulate for SpacemiT IME2's matrix instructions (the K3's A100 cores) under QEMU user mode.
 *
 * Upstream QEMU has no IME, so a vmadot word raises SIGILL. The handler installed here decodes it,
 * performs the 8x16x8 int8 (or 8x32x8 int4) -> int32 multiply-accumulate on the live vector registers
 * and resumes after the instruction. It also runs the 4:2 sparse vmadot*.sp forms, the block-scaled vmadot*.hp
 * forms (int8/int4 dot products times FP16 scales, accumulated in FP16), vfwmadot / vfwmadot1/2/3 (FP16 x FP16
 * accumulated in FP32; FP16 only, BF16 needs MCPM.BF16) and the layout instructions vpack.vv / vupack.vv /
 * vnpack4.vv. Requires VLEN = 1024 (the A100 geometry). Any other illegal instruction, including IME2 forms it
 * does not run (vnpack, vnspack, vnspack4), still kills the program with SIGILL (docs/ime2-isa.md §6).
 */
#ifndef IMEGEN_IME2_EMU_H
#define IMEGEN_IME2_EMU_H

#ifdef __cplusplus
extern "C" {
#endif

/* Install the SIGILL handler. Exits with status 3 if VLEN != 1024. */
void imegen_ime2_emu_install(void);

/* Number of IME2 instructions emulated so far. */
unsigned long imegen_ime2_emu_count(void);

/* The same by kind, for cost models that charge them differently (LLVM's A100 schedule does). */
enum imegen_ime2_kind {
    IMEGEN_IME2_VMADOT,      /* integer vmadot* / vmadotN* (i8, i4) */
    IMEGEN_IME2_VMADOT_HP,   /* vmadot*.hp */
    IMEGEN_IME2_VPACK,       /* vpack.vv */
    IMEGEN_IME2_VUPACK_SLOW, /* vupack.vv with imm2 0 or 1 */
    IMEGEN_IME2_VUPACK,      /* vupack.vv with imm2 2 or 3 */
    IMEGEN_IME2_VNPACK4,     /* vnpack4.vv */
    IMEGEN_IME2_VMADOT_SP,   /* vmadot*.sp (4:2 sparse) */
    IMEGEN_IME2_VFWMADOT,    /* vfwmadot, vfwmadot1/2/3 */
    IMEGEN_IME2_KINDS
};
unsigned long imegen_ime2_emu_count_kind(int kind);

#ifdef __cplusplus
}
#endif

#endif /* IMEGEN_IME2_EMU_H */
