"""Which block fold an IME tile (non-staged kernels) runs after its k loop, and the index tables that
stay in registers for the whole tile when the fold keeps them there (folds.py writes the folds)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...spec import KernelSpec
from .asm import AsmOp
from .folds import column_pair_fold, gemv_facc_group, gemv_fold, ime_fold, paired_column_fold
from .registers import Registers, Shape


@dataclass(frozen=True)
class Fold:
    ops: tuple[AsmOp, ...]
    table_loads: tuple[AsmOp, ...] = ()  # index tables loaded once per tile (fp32 accumulators in registers)
    gemv_facc: int | None = None  # gemv: the first register of the row's fp32 accumulators, when they fit


def choose_fold(spec: KernelSpec, s: Shape, r: Registers) -> Fold:
    if s.by_column:
        return Fold(column_pair_fold(spec, r.acc))
    t4 = -(-r.used // 4) * 4
    if r.facc and s.na == 2 and s.ma <= 2 and t4 + 4 <= 32:
        return Fold(paired_column_fold(spec, r.acc, r.facc, t4),
                    (AsmOp("vle16", f"vl4re16.v v{t4}, (%[idx16])", "e16 index tables: lane -> row, lane -> column, for every block"),))
    if s.gemv:
        # the row's fp32 accumulators (one e32 group of TN lanes) in registers above the loop's and the
        # fold's, when they fit: one asm statement then runs all blocks (as for gemm tiles)
        facc = gemv_facc_group(spec, r.acc[0], r.used)
        return Fold(gemv_fold(spec, r.acc[0], facc), gemv_facc=facc)
    return _general_fold(spec, r)


def _general_fold(spec: KernelSpec, r: Registers) -> Fold:
    """ime_fold. With the fp32 accumulators in registers, two register pairs the loop leaves free keep the
    fold's lane -> row and lane -> column index tables for the whole tile (loaded once, not per block)."""
    tables = None
    if r.facc and r.used <= 28:
        first = -(-r.used // 2) * 2
        tables = (first, first + 2) if first + 4 <= 32 else None
    ops = ime_fold(spec, r.acc, r.facc, tables)
    if not tables or not any(re.search(rf"\bv{tables[0]}\b", op.text) for op in ops):
        return Fold(ops)  # the general fold loads its own
    return Fold(ops, (AsmOp("vle32", f"vle32.v v{tables[1]}, (%[idx])", "lane -> column q, for every block"),
                      AsmOp("addi", "addi t1, %[idx], 64"), AsmOp("vle32", f"vle32.v v{tables[0]}, (t1)", "lane -> row r, for every block")))
