"""The bench's goals: prefill within PREFILL_GOAL x of the roofline (and what binds where it is not), and
fp16 scales never costing more instructions than fp32 ones."""

from __future__ import annotations

from ...plan import plan_kernel
from ...targets.ime import rules as ime_rules
from ..bench import BenchResult
from ..model import x60
from ..workload import PREFILL_M
from .tables import format_table, millions, short_config

PREFILL_GOAL = 1.5  # prefill (M 128 and 512, every shape but k/v) within 1.5x of the roofline on 4 cores


def prefill_goal_text(res: BenchResult, p: x60.X60Params = x60.X60, measured: bool = False) -> str:
    """How many prefill cells the tuned kernels bring within PREFILL_GOAL x of the roofline, and for each
    other one what binds, its load per vmadot (or its DRAM bytes) against what the goal allows, and a
    floor: the VLS cycles the tile's A and B operand loads (and fp32 accumulator round trips) alone
    take per vmadot, or the fewest DRAM bytes any schedule of the kernel's kind moves (x60.least_dram).
    measured: the same under LLVM's measured occupancies (the sensitivity's times)."""
    cells = [r for r in res.rows if r.kind == "imegen" and r.case.M in PREFILL_M and r.case.shape != "k/v"]
    if not cells or (measured and not all(r.ev.measured for r in cells)):
        return ""
    four = (lambda ev: ev.measured[1]) if measured else (lambda ev: ev.four_cores)  # noqa: E731
    over = [r for r in cells if four(r.ev).efficiency > PREFILL_GOAL]
    view = "under LLVM's measured occupancies" if measured else "under the model"
    lines = [f"Prefill within {PREFILL_GOAL}x of the roofline (M {', '.join(map(str, PREFILL_M))}, every shape but k/v, "
             f"4 cores, MODELED {view}): {len(cells) - len(over)} of {len(cells)} cells."]
    for r in over:
        m, c, s = four(r.ev), r.case, r.ev.spec
        plan = plan_kernel(s)
        where = f"  {c.shape} M {c.M} block {c.block} ({m.efficiency:.2f}x, {short_config(s)}): "
        dram_allowed, floor = PREFILL_GOAL * m.roofline_s * p.dram_effective, x60.least_dram(plan, *c.mnk, p)
        dram = (f"DRAM {m.dram_bytes / 1e6:.1f} MB where {PREFILL_GOAL}x allows {dram_allowed / 1e6:.1f} MB, and no schedule "
                f"of its kind moves fewer than {floor / 1e6:.1f} MB (any K chunks, A's M blocks in the whole L2)")
        if m.bound == "dram":
            lines.append(where + "DRAM-bound: " + dram)
            continue
        vm = m.core.ime * p.vmadot_per_cycle  # vmadots per core
        allowed = PREFILL_GOAL * m.roofline_s * p.clock_hz / vm
        tm, tn = s.tile_m, s.tile_n
        vmadots = tm // 4 * (tn // 4) * s.block // 8
        b_bytes = tn * s.block * (8 if s.stage_b != "tile" else s.bits) // 8  # a staged B is int8
        operand = (tm * s.block + b_bytes + (0 if ime_rules.fp32_acc_in_registers(s) else 2 * 4 * tm * tn)) / (p.dlen // 8)
        busy = getattr(m.core, m.bound)
        lines.append(where + f"{m.bound.replace('_', ' ')} {busy / vm:.2f} cycles per vmadot (VLS {m.core.vls / vm:.2f}) "
                     f"where {PREFILL_GOAL}x allows {allowed:.2f}; the {tm}x{tn} tile's operand loads alone take "
                     f"{operand / vmadots:.2f} VLS cycles per vmadot" + ("; " + dram if floor > dram_allowed else ""))
    return "\n".join(lines)


def scale_precision_text(res: BenchResult) -> str:
    """The goal "fp16 scales never cost more instructions than fp32": per case tuned to fp16 scales, its
    instructions against its twins with fp32 B and A scales, and with fp16 B scales but fp32 A scales
    (scale_twins: each the fewer-instruction of its group and per-register spread forms; MEASURED
    counts, one core, whole shape)."""
    head = ["shape", "M", "block", "tuned config", "scales", "tuned M", "fp32 twin M", "fp16-B fp32-A twin M", "tuned / fp32"]
    body, worse, compared = [], [], 0
    for c in res.cases:
        best = res.tuned.best[c]
        twins = [res.twins.get((c, st)) for st in ("fp32", "fp16")]
        mine = x60.total_instructions(best.counts)
        f32 = x60.total_instructions(twins[0][0].counts) if twins[0] else None
        f16 = x60.total_instructions(twins[1][0].counts) if twins[1] else None
        mark = ["" if t is None or t[1] else "*" for t in twins]
        what = best.spec.scale_type + ("/A fp16" if best.spec.a_scale_type == "fp16" else "")
        if f32 is not None and best.spec.scale_type == "fp16":
            compared += 1
            if mine > f32:
                worse.append(f"{c.label} (+{100 * (mine / f32 - 1):.1f}%)")
        body.append([c.shape, str(c.M), str(c.block), short_config(best.spec), what, millions(mine),
                     millions(f32) + mark[0] if f32 else "-", millions(f16) + mark[1] if f16 else "-", f"{mine / f32:.3f}" if f32 else "-"])
    verdict = (f"fp16-scale tuned configs costing more instructions than their fp32 twin: {len(worse)} of {compared}"
               + (": " + ", ".join(worse) if worse else ""))
    return "\n".join(["Scale precision (instructions MEASURED, millions, one core, whole shape; twins = the tuned config "
                      "with fp32 B and A scales, and with fp16 B scales widened by vfwcvt against fp32 A scales, each the fewer-"
                      "instruction of its group and per-register spread forms; '*' = the tuned config has no such form (8x12 "
                      "staged kernels exist with fp16 A scales only): the fewest-instruction config of that precision the tuner "
                      "measured for the case; '-' = fp32-scale tuned configs, no twin):", format_table(head, body, right={1, 2, 5, 6, 7, 8}), verdict])
