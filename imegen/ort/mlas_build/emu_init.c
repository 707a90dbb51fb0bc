/* Linked into onnxruntime_mlas_test in emulation builds: installs imegen's IME trap-and-emulate
 * runtime before ORT's test main runs (only where IME's geometry exists, VLEN = 256), and reports
 * at exit how many IME instructions were emulated, so a run proves imegen's IME kernels ran. */
#include <stdio.h>

#include "../../runtime/ime_emu.h"

static int installed;

__attribute__((constructor)) static void imegen_emu_init(void)
{
    unsigned long vlenb;
    __asm__ volatile(".option push\n.option arch, +v\ncsrr %0, vlenb\n.option pop" : "=r"(vlenb));
    if (vlenb == 32) {
        imegen_ime_emu_install();
        installed = 1;
    }
}

__attribute__((destructor)) static void imegen_emu_report(void)
{
    fprintf(stderr, "imegen IME emulator: %lu vmadot emulated%s\n", imegen_ime_emu_count(),
            installed ? "" : " (not installed: VLEN != 256)");
}
