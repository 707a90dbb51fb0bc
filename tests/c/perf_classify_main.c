/* Driver for perf_classify_kernel.c: one call between the bench markers, two outside them. */
#include <stdint.h>

#include "ime_emu.h"

#include "bench_markers.h"

void tk_kernel(void *buf);

static _Alignas(64) uint8_t buf[256];

int main(void)
{
    imegen_ime_emu_install();
    imegen_bench_begin();
    tk_kernel(buf);
    imegen_bench_end();
    tk_kernel(buf);
    tk_kernel(buf);
    return 0;
}
