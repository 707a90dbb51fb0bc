/* What the SIGILL trap-and-emulate runtimes share (ime_emu.c for the K1's IME, ime2_emu.c for the K3's IME2):
 * reading the trapped word, moving whole vector registers in and out of memory from C built without V, saying
 * why a word is not run, and dying as the hardware would.
 *
 * Include it from a file built for rv64gc (no V): the handler runs while the interrupted code's vector
 * registers are live, and under QEMU user mode they are neither saved nor restored around the signal. Built
 * without V, the C code cannot touch them; the only vector instructions are the explicit whole-register
 * spills/fills below, which also leave vl and vtype alone. */
#ifndef IMEGEN_TRAP_H
#define IMEGEN_TRAP_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Let the assembler accept one vector instruction although the file is built for rv64gc. */
#define WITH_V(insn) ".option push\n\t.option arch, +v\n\t" insn "\n\t.option pop"

/* Register numbers are part of the instruction, so each register needs its own asm statement. */
#define IMEGEN_VREGS(X)                                                                       \
    X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)  \
    X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27) X(28) X(29)   \
    X(30) X(31)

#define IMEGEN_SPILL_CASE(n)                                                           \
    case n:                                                                            \
        __asm__ volatile(WITH_V("vs1r.v v" #n ", (%0)") : : "r"(buf) : "memory");     \
        break;
#define IMEGEN_FILL_CASE(n)                                                            \
    case n:                                                                            \
        __asm__ volatile(WITH_V("vl1r.v v" #n ", (%0)") : : "r"(buf) : "memory");     \
        break;

/* Vector register `reg` (VLENB bytes) to buf, and back. */
static inline void vreg_spill(unsigned reg, void *buf) {
    switch (reg) { IMEGEN_VREGS(IMEGEN_SPILL_CASE) }
}

static inline void vreg_fill(unsigned reg, const void *buf) {
    switch (reg) { IMEGEN_VREGS(IMEGEN_FILL_CASE) }
}

/* Read the word at pc as two halfwords: pc is only 2-byte aligned, and a 16-bit
 * instruction may end a mapped page. 0 for a compressed instruction. */
static inline int fetch_insn32(uintptr_t pc, uint32_t *word) {
    const volatile uint16_t *p = (const volatile uint16_t *)pc;
    uint16_t lo = p[0];
    if ((lo & 3) != 3) /* compressed instruction */
        return 0;
    *word = lo | (uint32_t)p[1] << 16;
    return 1;
}

/* "WHO: illegal instruction 0x<word> at pc 0x<pc>: WHY", with async-signal-safe write(2) only: the process
 * dies next. `why` ends with its newline. */
static inline void report_trap(const char *who, uint32_t word, uintptr_t pc, const char *why) {
    char msg[] = ": illegal instruction 0x........ at pc 0x................: ";
    char *w = strstr(msg, "0x") + 2, *p = strstr(w, "0x") + 2;
    for (int i = 0; i < 8; i++)
        w[i] = "0123456789abcdef"[(word >> (28 - 4 * i)) & 15];
    for (int i = 0; i < 16; i++)
        p[i] = "0123456789abcdef"[(pc >> (60 - 4 * i)) & 15];
    ssize_t unused = write(2, who, strlen(who));
    unused = write(2, msg, sizeof msg - 1);
    unused = write(2, why, strlen(why));
    (void)unused;
}

/* Not a word the emulator runs: die as the hardware would. The re-raised signal stays blocked until the
 * handler returns, then the default action terminates the process with it. */
static inline void die_honestly(int sig) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

/* Install `on_sigill` as the SIGILL handler of a `who` emulator for `isa` (on `board`) at `vlenb` bytes a register,
 * after checking that this CPU has that VLEN (else exit 3 with the QEMU -cpu to use). The harts the emulator
 * runs on, from IMEGEN_IME_HARTS (harts.h), go to *harts; returns 1 if that names some, 0 if unset; a malformed
 * list exits 3, naming `example` as a valid one. Include harts.h before this file. */
static inline int imegen_install_emulator(const char *who, const char *isa, const char *board, unsigned long vlenb,
                                          const char *example, cpu_set_t *harts,
                                          void (*on_sigill)(int, siginfo_t *, void *)) {
    unsigned long have;
    __asm__ volatile(WITH_V("csrr %0, vlenb") : "=r"(have));
    if (have != vlenb) {
        fprintf(stderr, "%s: %s requires VLEN=%lu (%s), but this CPU has VLEN=%lu; run QEMU with "
                "-cpu rv64,v=true,Zfh=true,vlen=%lu\n", who, isa, vlenb * 8, board, have * 8, vlenb * 8);
        exit(3);
    }
    const int restricted = imegen_emulated_harts(harts);
    if (restricted < 0) {
        fprintf(stderr, "%s: %s=\"%s\" is not a hart list (e.g. %s)\n", who, IMEGEN_IME_HARTS_ENV,
                getenv(IMEGEN_IME_HARTS_ENV), example);
        exit(3);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigill;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGILL, &sa, NULL) != 0) {
        fprintf(stderr, "%s: sigaction(SIGILL) failed\n", who);
        exit(3);
    }
    return restricted;
}

#endif
