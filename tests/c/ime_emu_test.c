/* Driver for tests/test_ime_emulator.py: runs real vmadot words under the SIGILL emulator.
 *
 * The test generates "ime_variants.h" (on the include path) with the asm that carries the
 * .word encodings, so the words come from imegen.targets.ime.encoding and not from this file:
 *   N_VARIANTS, variants[]  : load C/A/B into fixed registers, execute one vmadot, store C
 *   N_PROBES, probes[]      : set a vtype, execute one raw word (may be illegal)
 *   vtype_probe(r)          : r = {vl, vtype} before and after one vmadot
 *
 * Modes (argv[1]):
 *   run      stdin: records {int32 variant; int32 c[16]; uint8 a[64]; uint8 b[32]}
 *            stdout: 16 result int32 per record, one line each, then "count N"
 *   vtype    prints "vl0 vtype0 vl1 vtype1 count"
 *   probe K  runs probes[K], prints "survived count"
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ime_emu.h"

/* GCC 12 has no names for vector registers and never emits vector code itself, so only
 * clang (which may keep values in vector registers across the asm) needs these clobbers. */
#ifdef __clang__
#define VCLOBBERS(...) , __VA_ARGS__
#else
#define VCLOBBERS(...)
#endif

typedef void (*variant_fn)(const void *c, const void *a, const void *b, void *out);
typedef void (*probe_fn)(void);

#include "ime_variants.h"

struct record {
    int32_t variant;
    int32_t c[16];
    uint8_t a[64]; /* vs1 || vs1+1; base forms use the first 32 bytes */
    uint8_t b[32];
};

static int run_records(void) {
    struct record r;
    int32_t out[16];
    while (fread(&r, sizeof r, 1, stdin) == 1) {
        if (r.variant < 0 || r.variant >= N_VARIANTS) {
            fprintf(stderr, "bad variant %d\n", (int)r.variant);
            return 2;
        }
        variants[r.variant](r.c, r.a, r.b, out);
        for (int i = 0; i < 16; i++)
            printf(i ? " %d" : "%d", (int)out[i]);
        putchar('\n');
    }
    if (ferror(stdin)) {
        perror("stdin");
        return 2;
    }
    printf("count %lu\n", imegen_ime_emu_count());
    return 0;
}

int main(int argc, char **argv) {
    imegen_ime_emu_install();
    const char *mode = argc > 1 ? argv[1] : "run";
    if (strcmp(mode, "run") == 0)
        return run_records();
    if (strcmp(mode, "vtype") == 0) {
        unsigned long r[4];
        vtype_probe(r);
        printf("%lu %lu %lu %lu %lu\n", r[0], r[1], r[2], r[3], imegen_ime_emu_count());
        return 0;
    }
    if (strcmp(mode, "probe") == 0 && argc > 2) {
        int k = atoi(argv[2]);
        if (k < 0 || k >= N_PROBES)
            return 2;
        probes[k]();
        printf("survived %lu\n", imegen_ime_emu_count());
        return 0;
    }
    fprintf(stderr, "usage: %s run | vtype | probe K\n", argv[0]);
    return 2;
}
