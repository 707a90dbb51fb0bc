"""The sensitivity to LLVM's hardware-measured X60 occupancies (model/occupancy.py): the same counts with
the vector units busy for the measured cycles, and the configs the tuner measured that would win then."""

from __future__ import annotations

from ..baselines.llama_cpp.rows import per_token_s
from ..bench import KINDS, BenchResult, Row
from ..search.evaluate import Evaluation
from ..workload import DECODE_M, PREFILL_M, Case
from .goals import PREFILL_GOAL
from .tables import format_table, short_config
from .tokens import pick_measured, token_summaries


def has_measured(res: BenchResult) -> bool:
    """Were every row and every ranked config counted with the plugin's occupancy kinds?"""
    return all(r.ev.measured for r in res.rows) and all(e.measured for es in res.tuned.ranking.values() for e in es)


def best_under_measured(res: BenchResult) -> dict[Case, Evaluation]:
    """Per case, the config the tuner measured that LLVM's measured occupancies make fastest on 4 cores."""
    return {c: min(res.tuned.ranking.get(c, [res.get(c, "imegen")]), key=lambda e: (e.measured[1].time_s, e.key))
            for c in res.cases}


def with_imegen(res: BenchResult, evs: dict[Case, Evaluation]) -> BenchResult:
    """res with imegen's rows replaced by evs."""
    return BenchResult([Row(r.case, r.kind, evs[r.case]) if r.kind == "imegen" else r for r in res.rows], res.tuned,
                       res.quick, res.llama, res.ort, res.whole)


RANKED_BY = {"model": "ranks by the model above, not by this",
             "measured": "ranks by this, not by the model above",
             "robust": "ranks each config by the slower of this and the model above (tune.RANKINGS)"}


def measured_text(res: BenchResult) -> str:
    """The sensitivity to LLVM's hardware-measured X60 occupancies: the same counts and DRAM model, the
    vector units busy for the measured cycles of each instruction instead of the model's beats; and
    the configs the tuner measured that would be best under them."""
    if not has_measured(res):
        return ""
    lines = ["Sensitivity: LLVM's hardware-measured X60 occupancies (docs/ime-isa.md §7; imegen/perf/model/occupancy.py) "
             "in place of the model's VLS/VIEU/VFP charges, same counts and DRAM bytes, 4 cores, MODELED. The tuner "
             f"{RANKED_BY[res.tuned.by]}; 'best under LLVM occ.' is the best of every config it measured:"]
    alt = best_under_measured(res)
    head = ["shape", "M", "block", "imegen config", "x roofline", "LLVM occ.", "binds", "llama-4x16 LLVM occ.",
            "rvv-fp32 LLVM occ.", "best config under LLVM occ.", "its LLVM occ.", "binds"]
    body = []
    for c in res.cases:
        best, m, a = res.get(c, "imegen"), res.get(c, "imegen").measured[1], alt[c].measured[1]
        body.append([c.shape, str(c.M), str(c.block), short_config(best.spec), f"{best.four_cores.efficiency:.2f}",
                     f"{m.efficiency:.2f}", m.bound, *(f"{res.get(c, k).measured[1].efficiency:.2f}" for k in KINDS[1:]),
                     short_config(alt[c].spec), f"{a.efficiency:.2f}", a.bound])
    lines.append(format_table(head, body, right={1, 2, 4, 5, 7, 8, 10}))
    cells = [c for c in res.cases if c.M in PREFILL_M and c.shape != "k/v"]
    if cells:
        within = lambda evs: sum(evs[c].measured[1].efficiency <= PREFILL_GOAL for c in cells)  # noqa: E731
        lines.append(f"Prefill within {PREFILL_GOAL}x of the roofline under the measured occupancies: the tuned configs "
                     f"{within({c: res.get(c, 'imegen') for c in cells})} of {len(cells)} cells, the best under them "
                     f"{within(alt)} (under the model, the tuned ones: "
                     f"{sum(res.get(c, 'imegen').four_cores.efficiency <= PREFILL_GOAL for c in cells)}).")
    for label, r in (("tuned configs", res), ("best under LLVM occ.", with_imegen(res, alt))):
        sums = token_summaries(r, pick=pick_measured)
        if sums:
            lines.append(f"Per token, MatMulNBits only, 4 cores, measured occupancies, imegen's {label}: " + "; ".join(
                f"block {t.block}: decode " + ", ".join(f"{k} {t.decode_ms[k]:.1f}" for k in KINDS) + " ms/token, pp"
                + ", pp".join(f"{M} " + ", ".join(f"{k} {t.prefill_tps[M][k]:.1f}" for k in KINDS) for M in PREFILL_M)
                + " tok/s" for t in sums))
    if res.llama and not res.quick:
        t1, tp = per_token_s(list(res.llama), DECODE_M), per_token_s(list(res.llama), PREFILL_M[-1])
        if t1 and tp and t1[2] and tp[2]:
            lines.append(f"llama.cpp's real Q4_0 kernels (block 32), measured occupancies: decode {t1[2] * 1e3:.1f} ms/token, "
                         f"pp{PREFILL_M[-1]} {PREFILL_M[-1] / tp[2]:.1f} tok/s.")
    return "\n".join(lines)
