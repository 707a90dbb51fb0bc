/* Guard zones of the test drivers (driver.c.j2, mlas_driver.c): IMEGEN_GUARD poisoned bytes after every
 * buffer a kernel call writes. A byte changed there ends the run (exit status 2) with the reason on
 * stderr; check reports it as a failed row. */
#ifndef IMEGEN_GUARD_H
#define IMEGEN_GUARD_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IMEGEN_GUARD 64
#define IMEGEN_POISON 0xa5

static inline void imegen_guard_fail(const char *what)
{
    fprintf(stderr, "driver: %s\n", what);
    exit(2);
}

/* `bytes` then the guard, all poisoned (a kernel reading what no call wrote sees garbage), `align`-aligned. */
static inline void *imegen_poisoned(size_t align, size_t bytes)
{
    void *p = aligned_alloc(align, (bytes + IMEGEN_GUARD + align - 1) / align * align);
    if (!p)
        imegen_guard_fail("out of memory");
    return memset(p, IMEGEN_POISON, bytes + IMEGEN_GUARD);
}

static inline void imegen_check_guard(const void *buf, size_t bytes, const char *what)
{
    for (size_t i = 0; i < IMEGEN_GUARD; i++)
        if (((const unsigned char *)buf)[bytes + i] != IMEGEN_POISON)
            imegen_guard_fail(what);
}

/* C of M rows `ldc` floats apart, zeroed, with a guard past the last row (imegen_check_c). */
static inline float *imegen_guarded_c(size_t M, size_t ldc)
{
    float *C = calloc(M * ldc + IMEGEN_GUARD / sizeof(float), sizeof(float));
    if (!C)
        imegen_guard_fail("out of memory");
    return C;
}

/* C's elements outside M x N (each row's ldc padding, the guard past the last row) stay zero. */
static inline void imegen_check_c(const float *C, size_t M, size_t N, size_t ldc, const char *what)
{
    for (size_t m = 0; m < M; m++)
        for (size_t j = N; j < ldc; j++)
            if (C[m * ldc + j] != 0.0f)
                imegen_guard_fail(what);
    for (size_t i = 0; i < IMEGEN_GUARD / sizeof(float); i++)
        if (C[M * ldc + i] != 0.0f)
            imegen_guard_fail(what);
}

#endif
