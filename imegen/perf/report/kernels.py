"""Per-kernel tables: instruction counts, modeled times, and the tuned config's speedup over each baseline."""

from __future__ import annotations

from ..bench import KINDS, BenchResult
from ..model import x60
from ..search.evaluate import Evaluation
from ..workload import DECODE_M
from .tables import format_table, millions, short_config


def counts_table(res: BenchResult) -> str:
    head = ["shape", "M", "block", "kernel", "config", *x60.GROUPS, "total", "libc", "vec MB"]
    body = []
    for r in res.rows:
        g = x60.group_totals(r.ev.counts)
        cls = x60.class_totals(r.ev.counts, tags=("callee",))
        vec_bytes = sum(x60.mem_stat(r.ev.counts, c, "bytes") for c in ("vload", "vstore", "vlsx"))
        body.append([r.case.shape, str(r.case.M), str(r.case.block), r.kind, short_config(r.ev.spec),
                     *(millions(g[k]) for k in x60.GROUPS), millions(sum(g.values())), millions(sum(cls.values())),
                     millions(vec_bytes)])
    return format_table(head, body, right={1, 2, *range(5, len(head))})


def time_table(res: BenchResult) -> str:
    head = ["shape", "M", "block", "kernel", "1 core ms", "bound", "4 cores ms", "bound", "DRAM MB",
            "roofline ms", "x roofline", "GOPS"]
    body = []
    for r in res.rows:
        one, four = r.ev.one_core, r.ev.four_cores
        body.append([r.case.shape, str(r.case.M), str(r.case.block), r.kind, f"{one.time_s * 1e3:.4f}", one.bound,
                     f"{four.time_s * 1e3:.4f}", four.bound, f"{four.dram_bytes / 1e6:.3f}",
                     f"{four.roofline_s * 1e3:.4f} {four.roofline_bound[:3]}", f"{four.efficiency:.2f}",
                     f"{four.gops:.1f}"])
    return format_table(head, body, right={1, 2, 4, 6, 8, 9, 10, 11})


def dram_tie(best: Evaluation, other: Evaluation) -> bool:
    """Both DRAM-bound on 4 cores and within 2%: the difference is bytes of A workspace, not kernel quality."""
    a, b = best.four_cores, other.four_cores
    return a.bound == "dram" and b.bound == "dram" and abs(b.time_s / a.time_s - 1) < 0.02


def speedup(mine: Evaluation, baseline: Evaluation) -> tuple[str, bool, float, float]:
    """(the table cell, DRAM tie?, speedup on 4 cores, on 1 core): baseline modeled time / mine."""
    r4, r1 = baseline.four_cores.time_s / mine.four_cores.time_s, baseline.one_core.time_s / mine.one_core.time_s
    tie = dram_tie(mine, baseline)
    return f"{r4:.2f}x{' (DRAM tie)' if tie else ''} | {r1:.2f}x", tie, r4, r1


def ratio_table(res: BenchResult) -> tuple[str, list[str]]:
    """imegen's best as a speedup over each baseline, and notes on the cases it does not clearly win."""
    head = ["shape", "M", "block", "imegen config", "vs llama-4x16 (4c | 1c)", "vs rvv-fp32 (4c | 1c)"]
    body, ties, losses = [], {k: [] for k in KINDS[1:]}, []
    for c in res.cases:
        best = res.get(c, "imegen")
        cells = []
        for kind in KINDS[1:]:
            b = res.get(c, kind)
            cell, tie, r4, r1 = speedup(best, b)
            cells.append(cell)
            if tie:
                ties[kind].append((c, r1))
            elif r4 <= 1.0:
                losses.append(f"{c.label}: imegen {best.four_cores.time_s * 1e3:.4f} ms vs {kind} "
                              f"{b.four_cores.time_s * 1e3:.4f} ms on 4 cores")
        body.append([c.shape, str(c.M), str(c.block), short_config(best.spec), *cells])
    notes = []
    for kind, items in ties.items():
        if items:
            r1 = [r for _, r in items]
            notes.append(f"DRAM tie with {kind} ({len(items)} cases: " + ", ".join(f"{c.shape} M={c.M} b{c.block}" for c, _ in items)
                         + f"): on 4 cores both are DRAM-bound in the model and move the same bytes within 2%; "
                           f"on 1 core imegen is {min(r1):.2f}x-{max(r1):.2f}x faster.")
    if any(c.M == DECODE_M for items in ties.values() for c, _ in items):
        notes.append("Why decode ties: decode streams the weights once, and a tie means the tuned config stores them in "
                     "the baseline's bytes (same scale type, one zero-point byte per column and block); once DRAM binds, "
                     "no tile config can be faster in this model.")
    if any(c.M != DECODE_M for items in ties.values() for c, _ in items):
        notes.append("Why a prefill case ties: with few output columns (k/v: N = 128) the DRAM bytes are dominated by "
                     "reading A (fp32) and writing C, which every kernel moves exactly once; the weight bytes that tiles "
                     "and scale formats change are a small part, so once DRAM binds the kernels tie in this model.")
    notes += [f"baseline faster: {x}" for x in losses]
    return format_table(head, body, right={1, 2, 4, 5}), notes


def kernel_tables(res: BenchResult) -> list[str]:
    """The instruction-count and modeled-time tables of every row, with their headings."""
    return ["Instruction counts (MEASURED under QEMU and extrapolated; one matmul call, whole shape, one core; millions; "
            "'libc' = part of the total in libc/libm called by the kernel; 'vec MB' = bytes accessed by vector loads/stores):",
            counts_table(res),
            "",
            "Modeled time (MODELED from the counts and bytes above):",
            time_table(res)]


def vtype_note(res: BenchResult) -> str:
    """Whether the plugin decoded every vtype the rows ran under (a register-operand vsetvl it cannot)."""
    unknown = [r for r in res.rows if r.ev.counts.get("vtype_unknown", 0)]
    if not unknown:
        return "vtype: every vector instruction ran under a vtype the plugin decoded (no register-operand vsetvl)."
    return (f"WARNING: {len(unknown)} rows executed vsetvl with a register vtype; the plugin assumed "
            "LMUL = 1 after it, so their vector occupancy is approximate.")
