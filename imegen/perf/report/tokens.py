"""Per-token figures: the Qwen model's MatMulNBits per decode token and per prefill, from the per-case
modeled times (MatMulNBits only: attention, norms and embeddings are not modeled)."""

from __future__ import annotations

from dataclasses import dataclass

from ..bench import KINDS, BenchResult
from ..model import x60
from ..search.evaluate import Evaluation
from ..workload import DECODE_M, PREFILL_M, PUBLISHED, PUBLISHED_PP512_TPS, QWEN25_05B, shapes, weights_per_token
from .tables import format_table


@dataclass(frozen=True)
class TokenSummary:
    block: int
    decode_ms: dict[str, float]  # kind -> ms/token on 4 cores (MatMulNBits only)
    decode_ms_1core: dict[str, float]
    limit_effective_ms: float
    limit_theoretical_ms: float
    prefill_tps: dict[int, dict[str, float]]  # M -> kind -> tokens/s


def pick_modeled(ev: Evaluation, cores: int) -> x60.Modeled:
    return ev.four_cores if cores > 1 else ev.one_core


def pick_measured(ev: Evaluation, cores: int) -> x60.Modeled:
    """The LLVM-measured-occupancy sensitivity (Evaluation.measured)."""
    return ev.measured[1 if cores > 1 else 0]


def step_seconds(res: BenchResult, block: int, kind: str, M: int, cores: int, lm_head_m: int | None = None,
                 pick=pick_modeled) -> float | None:
    """Seconds of one M-token step of the Qwen model's MatMulNBits on kind's kernels at block (the LM head
    at lm_head_m rows if given: logits of the last token only); None without every shape at M."""
    t = 0.0
    for s in shapes():
        m = lm_head_m if (s.name == "lm_head" and lm_head_m is not None) else M
        c = next((c for c in res.cases if c.shape == s.name and c.M == m and c.block == block), None)
        if c is None or not res.has(c, kind):
            return None
        t += s.per_token * pick(res.get(c, kind), cores).time_s
    return t


def token_summaries(res: BenchResult, p: x60.X60Params = x60.X60, pick=pick_modeled) -> list[TokenSummary]:
    if res.quick:
        return []
    out = []
    for b in sorted({c.block for c in res.cases}):
        def total(M: int, kind: str, cores: int, lm_head_m: int | None = None) -> float:
            return step_seconds(res, b, kind, M, cores, lm_head_m, pick)

        decode = {k: total(DECODE_M, k, 4) * 1e3 for k in KINDS}
        decode1 = {k: total(DECODE_M, k, 1) * 1e3 for k in KINDS}
        need = sum(s.per_token * x60.compulsory_bytes(DECODE_M, s.N, s.K, b) for s in shapes())
        prefill = {M: {k: M / total(M, k, 4, lm_head_m=DECODE_M) for k in KINDS} for M in PREFILL_M}
        out.append(TokenSummary(b, decode, decode1, need / p.dram_effective * 1e3, need / p.dram_theoretical * 1e3,
                                prefill))
    return out


def summary_text(res: BenchResult, p: x60.X60Params = x60.X60) -> str:
    sums = token_summaries(res, p)
    if not sums:
        return "(per-token figures need every shape: run without --quick)"
    lines = [f"{QWEN25_05B.name} per token, MatMulNBits only ({weights_per_token() / 1e6:.1f} M int4 weights; "
             f"attention, norms, embeddings not modeled). MODELED times, 4 IME cores:"]
    head = ["block", *[f"{k} ms/tok" for k in KINDS], "mem limit @5.24 GB/s", "@10.66 GB/s",
            *[f"{k} pp{M} tok/s" for M in PREFILL_M for k in KINDS]]
    body = [[str(s.block), *[f"{s.decode_ms[k]:.1f}" for k in KINDS], f"{s.limit_effective_ms:.1f}",
             f"{s.limit_theoretical_ms:.1f}", *[f"{s.prefill_tps[M][k]:.1f}" for M in PREFILL_M for k in KINDS]]
            for s in sums]
    lines.append(format_table(head, body, right=set(range(len(head)))))
    lines.append("1 core: " + "; ".join(f"block {s.block}: " + ", ".join(f"{k} {s.decode_ms_1core[k]:.1f}" for k in KINDS)
                                        for s in sums) + " ms/token")
    lines.append("Published, whole model on K1 with 4 threads (measured by others, not by imegen): "
                 + "; ".join(f"{k}: {v:.1f} ms/token" for k, v in PUBLISHED.items())
                 + f"; llama.cpp Q4_0 pp512 {PUBLISHED_PP512_TPS} tok/s.")
    return "\n".join(lines)
