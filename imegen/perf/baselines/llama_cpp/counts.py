"""Per-thread counts of llama.cpp's loop at full shapes. Threads run one after another in one process
(phase 1 for every thread, then phase 2); a thread count's per-core figure is max over threads of
phase 1 plus max of phase 2 (ggml_barrier sits between them). Full shapes are not run (every vmadot
traps): phase 1 is run at the full shape, and phase 2 is the sum over the thread's tasks of the task
cost, which is bilinear in 4-row groups and 16-column blocks (M4 path) or linear in 16-column blocks
(M = 1), measured at 2 x 2 (2) small tasks with the full K. tests/test_llama_real.py checks this
against direct runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from ...model import x60
from .build import build, run_driver


def split(nth: int, M: int, N: int) -> tuple[int, int, int, int]:
    """ime.cpp's task split (llama_loop.cpp llama_split): (m_stride, n_stride, tasks_m, tasks)."""
    m_stride = M if N // M > 64 else 16
    m_blocked = -(-M // m_stride)
    max_n = -(-(N * m_blocked) // nth)
    n_stride = min(N, -(-max_n // 16) * 16) if max_n < N else N
    tasks_m = -(-M // m_stride)
    return m_stride, n_stride, tasks_m, tasks_m * -(-N // n_stride)


def thread_tasks(nth: int, ith: int, M: int, N: int) -> list[tuple[int, int]]:
    """(m_count, n_count) of each task thread `ith` runs in phase 2."""
    ms, ns, tm, tasks = split(nth, M, N)
    per = -(-tasks // nth)
    out = []
    for t in range(ith * per, min((ith + 1) * per, tasks)):
        m0, n0 = (t % tm) * ms, (t // tm) * ns
        out.append((min(M - m0, ms), min(N - n0, ns)))
    return out


def add_counts(a: dict, b: dict, s: float = 1.0) -> dict:
    """a + s * b, counter by counter."""
    return {k: a.get(k, 0) + s * b.get(k, 0) for k in set(a) | set(b)}


class RunCache:
    """Results of a counting executable's runs by their arguments, kept in counts.json beside it (a build's cache
    entry: a rebuilt executable starts empty), rewritten atomically after each new run."""

    def __init__(self, exe: Path):
        self.file = exe.parent / "counts.json"
        try:
            self.runs = json.loads(self.file.read_text())
        except (OSError, ValueError):
            self.runs = {}

    def get(self, key: str, run: Callable[[], object]):
        if key not in self.runs:
            self.runs[key] = run()
            tmp = self.file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.runs, sort_keys=True))
            tmp.replace(self.file)
        return self.runs[key]


class Counter:
    """Per-thread counts of llama.cpp's loop at full shapes (see the module docstring); cached on disk."""

    def __init__(self, log=None):
        self.b = build(log)
        self.cache = RunCache(self.b.exe)
        self.log = log

    def _regions(self, args: list[str]) -> list[dict]:
        return self.cache.get(" ".join(args), lambda: run_driver(self.b, args)[0])

    def task(self, K: int, mc: int, nc: int) -> dict:
        """Cost of one task of mc rows x nc columns: measured at 1-2 row groups x 1-2 column blocks."""
        def at(m: int, n: int) -> dict:
            return self._regions(["task", str(m), str(n), str(K), str(m), str(n)])[0]

        if mc == 1:
            c1, c2 = at(1, 16), at(1, 32)
            return add_counts(c1, add_counts(c2, c1, -1), nc // 16 - 1)
        g, nb = mc // 4, nc // 16
        if mc % 4:
            raise ValueError("llama.cpp counts: M > 1 must be a multiple of 4 here")
        f00, f10, f01, f11 = at(4, 16), at(8, 16), at(4, 32), at(8, 32)
        dm, dn = add_counts(f10, f00, -1), add_counts(f01, f00, -1)
        dmn = add_counts(add_counts(f11, f10, -1), dn, -1)
        return add_counts(add_counts(add_counts(f00, dm, g - 1), dn, nb - 1), dmn, (g - 1) * (nb - 1))

    def per_thread(self, M: int, N: int, K: int, nth: int) -> tuple[list[dict], list[dict]]:
        quant = self._regions(["quant", str(M), str(N), str(K), str(nth)])
        gemm = []
        for ith in range(nth):
            c: dict = {}
            for mc, nc in thread_tasks(nth, ith, M, N):
                c = add_counts(c, self.task(K, mc, nc))
            gemm.append(c)
        return quant, gemm

    def direct(self, M: int, N: int, K: int, nth: int) -> tuple[list[dict], list[dict]]:
        regions = self._regions(["full", str(M), str(N), str(K), str(nth)])
        return regions[:nth], regions[nth:]

    def per_core(self, M: int, N: int, K: int, nth: int) -> dict:
        """The busiest thread's counts: max over threads of phase 1 + max of phase 2 (by total instructions)."""
        quant, gemm = self.per_thread(M, N, K, nth)
        return add_counts(max(quant, key=x60.total_instructions), max(gemm, key=x60.total_instructions))
