"""The IME tile's asm statement, assembled: registers (registers.py), the k loop (loop.py), the block fold
(fold.py) and the frame around the blocks (frame.py); staged kernels are planned by staged.py."""

from __future__ import annotations

import re

from ...spec import KernelSpec
from .asm import MAX_UNROLLED_ITERATIONS, AsmOp, ImePlan, gathers_per_register, zero_accumulators
from .fold import choose_fold
from .folds import PAIRED_FOLD_INDEX, PER_REGISTER_FOLD_INDEX
from .frame import Frame, gemv_frame, tile_frame
from .loop import a_step, loop_body, zero_point_prologue
from .registers import allocate, tile_shape
from .rules import staged
from .staged import staged_ime_plan


def ime_plan(spec: KernelSpec, pack) -> ImePlan:
    """The asm statement of a tile (pack: the kernel's packed-B layout, plan.PackLayout)."""
    if staged(spec):
        return staged_ime_plan(spec)
    s = tile_shape(spec)
    r = allocate(spec, s)
    body = loop_body(spec, s, r)
    fold = choose_fold(spec, s, r)
    iterations = spec.block // (8 * s.ku)
    unrolled = iterations <= MAX_UNROLLED_ITERATIONS
    if r.facc:
        frame = tile_frame(spec, s, r, fold.table_loads, iterations, unrolled)
    elif fold.gemv_facc is not None:
        frame = gemv_frame(spec, fold.gemv_facc, iterations, unrolled)
    else:
        frame = Frame()
    # rules.spread_refusal admits only tiles these folds are written for; another fold would not spread per register
    assert spec.spread == "group" or gathers_per_register(fold.ops), spec.describe()
    return ImePlan(
        ma=s.ma, na=s.na, acc_regs=r.acc, prologue=zero_point_prologue(spec, s, r, pack), body=body, fold=fold.ops,
        iterations_per_block=iterations, a_bytes_per_iteration=a_step(spec, s),
        b_stride=spec.panel * 8,  # a panel's B tiles for one 16-k (4-bit) or 8-k (8-bit) group
        b_walk=iterations * s.b_groups * spec.panel * 8,
        clobbers=tuple(f"v{x}" for x in range(max(r.n_regs, _highest_pair_end(fold.ops), _highest_pair_end(frame.tile_start)))),
        facc_floats=spec.tile_n if s.gemv else s.ma * s.na * 16, facc_at=_facc_at(s),
        vmadots_per_tile_block=(spec.block // 8) * s.ma * s.na,
        facc_regs=frame.facc, direct_store=frame.direct_store, tile_start=frame.tile_start, block_end=frame.block_end,
        tile_end=frame.tile_end, index16=_index16(spec, frame), acc_zero=zero_accumulators(2 * s.ma * s.na, on_vfp=not s.gemv),
        unrolled=unrolled, entry_vset=not _sets_vtype_first(body),
    )


def _facc_at(s) -> str:
    """C expr in i, j: where output (i, j) accumulates among the tile's fp32 accumulators in memory."""
    if s.gemv:
        return "j"
    if s.by_column:
        return f"(j / 4 * {s.ma} + i / 4) * 16 + i % 4 * 4 + j % 4"
    return f"(i / 4 * {s.na} + j / 4) * 16 + i % 4 * 4 + j % 4"


def _index16(spec: KernelSpec, frame: Frame) -> tuple[int, ...]:
    """The e16 index tables of paired_column_fold, when the tile loads them."""
    if not any("%[idx16]" in op.text for op in frame.tile_start):
        return ()
    return PER_REGISTER_FOLD_INDEX if spec.spread == "per_register" else PAIRED_FOLD_INDEX


def _sets_vtype_first(body: tuple[AsmOp, ...]) -> bool:
    """Does the loop body set vtype before its first instruction that depends on it? (Scalar
    instructions and whole-register loads do not.)"""
    for op in body:
        if op.kind == "vset":
            return True
        if not (op.kind in ("addi", "add") or re.match(r"vl\dre8\.v ", op.text)):
            return False
    return False


def _highest_pair_end(ops: tuple[AsmOp, ...]) -> int:
    """One past the highest vector register the ops may touch: operands above the accumulators
    are at most LMUL-4 groups (a few extra clobbers are harmless)."""
    regs = [int(x) for op in ops for x in re.findall(r"\bv(\d+)\b", op.text)]
    return min(32, max(regs, default=-4) + 4)
