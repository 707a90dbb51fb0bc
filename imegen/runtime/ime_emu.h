/* SIGILL trap-and-emulate for SpacemiT K1 IME (vmadot*) under QEMU user mode.
 *
 * Upstream QEMU has no IME, so a vmadot word raises SIGILL. The handler installed here decodes it,
 * performs the 4x8x4 int8 -> int32 multiply-accumulate on the live vector registers, and resumes
 * after the instruction. Requires VLEN = 256 (the K1 geometry); any other illegal instruction
 * still kills the program with SIGILL.
 */
#ifndef IMEGEN_IME_EMU_H
#define IMEGEN_IME_EMU_H

#ifdef __cplusplus
extern "C" {
#endif

/* Install the SIGILL handler. Exits with status 3 if VLEN != 256. */
void imegen_ime_emu_install(void);

/* Number of IME instructions emulated so far. */
unsigned long imegen_ime_emu_count(void);

#ifdef __cplusplus
}
#endif

#endif /* IMEGEN_IME_EMU_H */
