/* Driver for tests/test_ime2_emulator.py: runs real IME2 words under the SIGILL emulator
 * (imegen/runtime/ime2_emu.c) at VLEN 1024.
 *
 * The test generates "ime2_variants.h" (on the include path) with the asm that carries the .word
 * encodings, so the words come from imegen.targets.ime2.encoding and not from this file:
 *   N_VARIANTS, variants[]  : set a vtype, load C/A/B (and for .hp the scales) into fixed registers,
 *                             execute one or more IME2 words, store the results
 *   N_PROBES, probes[]      : set a vtype, execute one raw word (may be illegal)
 *   vtype_probe(r)          : r = {vl, vtype} before and after one vmadot
 *
 * Modes (argv[1]):
 *   run      stdin: records {int32 variant; int32 c[64]; uint8 a[256]; uint8 b[128]; uint8 s[128]}
 *            stdout: 64 result int32 per record, one line each, then "count N"
 *   vtype    prints "vl0 vtype0 vl1 vtype1 count"
 *   probe K  runs probes[K], prints "survived count"
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ime2_emu.h"

/* GCC 12 has no names for vector registers and never emits vector code itself, so only
 * clang (which may keep values in vector registers across the asm) needs these clobbers. */
#ifdef __clang__
#define VCLOBBERS(...) , __VA_ARGS__
#else
#define VCLOBBERS(...)
#endif

typedef void (*variant_fn)(const void *c, const void *a, const void *b, const void *s, void *out);
typedef void (*probe_fn)(void);

#include "ime2_variants.h"

struct record {
    int32_t variant;
    int32_t c[64]; /* vd || vd+1 */
    uint8_t a[256]; /* vs1 || vs1+1; base forms use the first 128 bytes */
    uint8_t b[128];
    uint8_t s[128]; /* .hp: the scale register v0 or v1 */
};

static int run_records(void) {
    struct record r;
    int32_t out[64];
    while (fread(&r, sizeof r, 1, stdin) == 1) {
        if (r.variant < 0 || r.variant >= N_VARIANTS) {
            fprintf(stderr, "bad variant %d\n", (int)r.variant);
            return 2;
        }
        variants[r.variant](r.c, r.a, r.b, r.s, out);
        for (int i = 0; i < 64; i++)
            printf(i ? " %d" : "%d", (int)out[i]);
        putchar('\n');
    }
    if (ferror(stdin)) {
        perror("stdin");
        return 2;
    }
    printf("count %lu\n", imegen_ime2_emu_count());
    return 0;
}

int main(int argc, char **argv) {
    imegen_ime2_emu_install();
    const char *mode = argc > 1 ? argv[1] : "run";
    if (strcmp(mode, "run") == 0)
        return run_records();
    if (strcmp(mode, "vtype") == 0) {
        unsigned long r[4];
        vtype_probe(r);
        printf("%lu %lu %lu %lu %lu\n", r[0], r[1], r[2], r[3], imegen_ime2_emu_count());
        return 0;
    }
    if (strcmp(mode, "probe") == 0 && argc > 2) {
        int k = atoi(argv[2]);
        if (k < 0 || k >= N_PROBES)
            return 2;
        probes[k]();
        printf("survived %lu\n", imegen_ime2_emu_count());
        return 0;
    }
    fprintf(stderr, "usage: %s run | vtype | probe K\n", argv[0]);
    return 2;
}
