/* Linked into onnxruntime_mlas_test in emulation builds: installs the spec's trap-and-emulate runtime
 * (runtime/NAME.c for -DIMEGEN_EMULATOR=NAME: the K1's IME by default, the K3's IME2 with ime2_emu) before ORT's
 * test main runs, only where its geometry exists (VLEN = IMEGEN_EMULATOR_VLEN), and reports at exit how many
 * matrix instructions were emulated, so a run proves imegen's kernels ran. */
#include <stdio.h>

#ifndef IMEGEN_EMULATOR
#define IMEGEN_EMULATOR ime_emu
#define IMEGEN_EMULATOR_VLEN 256
#endif
#include "../../runtime/emulator.h"

static int installed;

__attribute__((constructor)) static void imegen_emu_init(void)
{
    unsigned long vlenb;
    __asm__ volatile(".option push\n.option arch, +v\ncsrr %0, vlenb\n.option pop" : "=r"(vlenb));
    if (vlenb * 8 == IMEGEN_EMULATOR_VLEN) {
        emulator_install();
        installed = 1;
    }
}

__attribute__((destructor)) static void imegen_emu_report(void)
{
    fprintf(stderr, "imegen IME emulator: %lu vmadot emulated%s\n", emulator_count(),
            installed ? "" : " (not installed: VLEN != " IMEGEN_STR(IMEGEN_EMULATOR_VLEN) ")");
}
