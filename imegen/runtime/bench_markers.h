/*
 * The markers imegen's counting plugin snapshots its counters at (imegen/perf/insn_count.c, found by
 * symbol name): a driver calls imegen_bench_begin() and imegen_bench_end() around the code to count.
 * Include this header in exactly one translation unit of a driver program: it defines them.
 */
#ifndef IMEGEN_BENCH_MARKERS_H
#define IMEGEN_BENCH_MARKERS_H

void imegen_bench_begin(void);
void imegen_bench_end(void);

/* Distinct bodies, so no pass can fold the two markers into one function. */
__attribute__((noinline)) void imegen_bench_begin(void)
{
    __asm__ volatile("nop" ::: "memory");
}

__attribute__((noinline)) void imegen_bench_end(void)
{
    __asm__ volatile("nop\n\tnop" ::: "memory");
}

#endif
