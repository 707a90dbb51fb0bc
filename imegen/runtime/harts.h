/* Which harts have SpacemiT IME, and the IMEGEN_IME_HARTS override (shared by the custom-op library
 * and the IME emulator).
 *
 * IMEGEN_IME_HARTS names the harts as a list of numbers and ranges ("0-3", "0,2", "1-2,5"); an empty
 * value or "none" names none. It overrides what the library reads from /proc/cpuinfo, and under QEMU
 * the IME emulator refuses a vmadot on any hart it does not name (the test of the routing). */
#ifndef IMEGEN_HARTS_H
#define IMEGEN_HARTS_H

#ifndef _GNU_SOURCE
#error "define _GNU_SOURCE before any include: harts.h needs cpu_set_t"
#endif
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define IMEGEN_IME_HARTS_ENV "IMEGEN_IME_HARTS"

/* SpacemiT marchids (/proc/cpuinfo; llama.cpp's ggml-cpu/spacemit/ime_env.cpp). The K1 reports its 8 cores as
 * X60, of which cores 0-3 are the IME-capable "A60" ones (that file's rule); an A60 may also report itself. The
 * K3's A100 cores (IME2) report their own marchid beside the X100 ones. */
#define IMEGEN_MARCHID_X60 0x8000000058000001ull
#define IMEGEN_MARCHID_A60 0x8000000041000001ull
#define IMEGEN_MARCHID_A100 0x8000000041000002ull
#define IMEGEN_K1_HARTS 8
#define IMEGEN_K1_IME_HARTS 4

/* Parse a hart list into *set; 0 on success, -1 on a malformed list (then *set is empty). */
static inline int imegen_parse_harts(const char *text, cpu_set_t *set) {
    CPU_ZERO(set);
    if (!text[0] || !strcmp(text, "none")) return 0;
    const char *p = text;
    for (;;) {
        char *end;
        unsigned long lo = strtoul(p, &end, 10), hi = lo;
        if (end == p || *p == '-' || *p == '+') goto bad;
        p = end;
        if (*p == '-') {
            const char *q = p + 1;
            hi = strtoul(q, &end, 10);
            if (end == q || *q == '-' || *q == '+' || hi < lo) goto bad;
            p = end;
        }
        if (hi >= CPU_SETSIZE) goto bad;
        for (unsigned long h = lo; h <= hi; h++) CPU_SET(h, set);
        if (!*p) return 0;
        if (*p++ != ',') goto bad;
    }
bad:
    CPU_ZERO(set);
    return -1;
}

/* The harts a /proc/cpuinfo text names with `marchid` (IMEGEN_MARCHID_A60: IME, with the K1's rule;
 * IMEGEN_MARCHID_A100: IME2), into *set; returns how many harts reported a marchid (0: none did, e.g. under
 * QEMU, so the text says nothing about IME). */
static inline int imegen_harts_from_cpuinfo(FILE *f, cpu_set_t *set, unsigned long long marchid) {
    char line[256];
    long hart = -1;
    int reported = 0, x60_first = 0, x60 = 0, harts = 0;
    CPU_ZERO(set);
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        if (!strncmp(line, "processor", 9)) {
            hart = strtol(colon + 1, NULL, 10), harts++;
        } else if (!strncmp(line, "marchid", 7) && hart >= 0 && hart < CPU_SETSIZE) {
            const unsigned long long id = strtoull(colon + 1, NULL, 16);
            reported++;
            if (id == marchid) CPU_SET(hart, set);
            x60 += id == IMEGEN_MARCHID_X60;
            x60_first += id == IMEGEN_MARCHID_X60 && hart < IMEGEN_K1_IME_HARTS;
        }
    }
    if (marchid == IMEGEN_MARCHID_A60 && harts == IMEGEN_K1_HARTS && x60 == IMEGEN_K1_HARTS &&
        x60_first == IMEGEN_K1_IME_HARTS)
        for (int h = 0; h < IMEGEN_K1_IME_HARTS; h++) CPU_SET(h, set); /* a K1: X60 x 8, IME on cores 0-3 */
    return reported;
}

/* For the emulators' SIGILL handlers (the process dies next): "<who>: <what> on hart N, which IMEGEN_IME_HARTS
 * does not name: no IME there", with async-signal-safe write(2) only. hart < 0: sched_getcpu() failed. */
static inline void imegen_report_hart_without_ime(const char *who, const char *what, int hart) {
    char digits[12], *d = digits + sizeof digits;
    *--d = 0;
    if (hart < 0)
        d = "(unknown)";
    else
        do *--d = (char)('0' + hart % 10); while ((hart /= 10) > 0);
    const char *parts[] = {who, ": ", what, " on hart ", d,
                           ", which " IMEGEN_IME_HARTS_ENV " does not name: no IME there\n"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        ssize_t unused = write(2, parts[i], strlen(parts[i]));
        (void)unused;
    }
}

/* IMEGEN_IME_HARTS for an emulator: 1 and *set when it names harts (a test of the routing: an IME instruction
 * elsewhere must die), 0 when unset (every hart has IME), -1 when malformed. */
static inline int imegen_emulated_harts(cpu_set_t *set) {
    const char *harts = getenv(IMEGEN_IME_HARTS_ENV);
    if (!harts) return 0;
    return imegen_parse_harts(harts, set) ? -1 : 1;
}

#endif
