"""The report of `imegen bench --spec SPEC`: the user's kernels in the bench's own count and time tables,
next to the DSL baselines, each kernel as a speedup over each baseline, and per-token figures where the
cases cover the whole Qwen model."""

from __future__ import annotations

from ..baselines.dsl import BASELINES
from ..bench import BenchResult
from ..count.measure import METHOD
from ..workload import DECODE_M, PREFILL_M, QWEN25_05B
from .kernels import kernel_tables, speedup, vtype_note
from .tables import format_table, short_config
from .text import model_text
from .tokens import step_seconds


def shapes_text(res: BenchResult) -> str:
    cases = res.cases
    shapes = ", ".join(dict.fromkeys(f"{c.shape} ({c.N}x{c.K})" for c in cases))
    ms = ", ".join(map(str, sorted({c.M for c in cases})))
    blocks = ", ".join(map(str, sorted({c.block for c in cases})))
    return f"shapes (NxK) {shapes}; M {ms}; block {blocks}"


def speedup_table(res: BenchResult) -> str:
    """Each of the user's kernels as a speedup over each baseline, per case it ran on."""
    head = ["shape", "M", "block", "kernel", "config", *(f"vs {b} (4c | 1c)" for b in BASELINES)]
    body = []
    for c in res.cases:
        for kind in res.subjects:
            if res.has(c, kind):
                mine = res.get(c, kind)
                body.append([c.shape, str(c.M), str(c.block), kind, short_config(mine.spec),
                             *(speedup(mine, res.get(c, b))[0] for b in BASELINES)])
    return format_table(head, body, right={1, 2, *range(5, len(head))})


def per_token_table(res: BenchResult) -> str:
    """Modeled ms per decode token and prefill tokens/s of the Qwen model's MatMulNBits, per kernel and block
    that covers every Qwen shape at those M values; empty when none does."""
    head = ["block", "kernel", "decode ms/tok (4c)", "decode ms/tok (1c)", *(f"pp{M} tok/s (4c)" for M in PREFILL_M)]
    body = []
    for b in sorted({c.block for c in res.cases}):
        for kind in (*res.subjects, *BASELINES):
            decode = [step_seconds(res, b, kind, DECODE_M, cores) for cores in (4, 1)]
            prefill = [step_seconds(res, b, kind, M, 4, lm_head_m=DECODE_M) for M in PREFILL_M]
            if None not in decode and None not in prefill:
                body.append([str(b), kind, *(f"{t * 1e3:.1f}" for t in decode),
                             *(f"{M / t:.1f}" for M, t in zip(PREFILL_M, prefill))])
    return format_table(head, body, right={0, *range(2, len(head))}) if body else ""


def spec_report(res: BenchResult) -> str:
    user = res.user
    parts = [f"imegen bench --spec {user.source}: {len(user.specs)} kernel(s) of the spec ({', '.join(user.names)}) next "
             f"to the baselines {', '.join(BASELINES)} (int4 asymmetric)" + (" (--quick subset)" if res.quick else ""),
             f"Cases: {shapes_text(res)}; each kernel on the cases of its own block.",
             "METHOD: " + METHOD,
             model_text(),
             "",
             *kernel_tables(res),
             "",
             "Each kernel as a speedup over each baseline (baseline modeled time / kernel modeled time; "
             "'DRAM tie' = both DRAM-bound on 4 cores within 2%):",
             speedup_table(res),
             "",
             vtype_note(res)]
    tokens = per_token_table(res)
    parts += ["", (f"{QWEN25_05B.name} per token, MatMulNBits only (attention, norms, embeddings not modeled; prefill's LM "
                   "head at M = 1), MODELED:\n" + tokens) if tokens else
              f"(per-token figures need every {QWEN25_05B.name} shape at M = {DECODE_M}, "
              f"{', '.join(map(str, PREFILL_M))}: run without --quick, --shape and --m)"]
    if user.skipped:
        parts += ["", "Not benched: " + "; ".join(f"{name} ({why})" for name, why in user.skipped)]
    return "\n".join(parts)
