"""The register map of an IME tile's asm statement (non-staged kernels): accumulator pairs, fp32
accumulators, A tiles and B runs allocated upwards from v0; the fold's temporaries lie above them."""

from __future__ import annotations

from dataclasses import dataclass

from ...spec import KernelSpec
from ..base import VECTOR_REGISTERS
from .rules import fp32_acc_in_registers, register_budget, zero_points_in_b

Grid = tuple[tuple[int, ...], ...]  # [mi][ni] -> first register of a pair


@dataclass(frozen=True)
class Shape:
    """The tile in vmadot terms, and the planner decisions every part of the asm depends on."""

    ma: int  # 4-row A tiles
    na: int  # 4-column B tiles
    ku: int  # 8-k steps per loop iteration
    gemv: bool  # one live row (tile_m = 1)
    zp_in_b: str | None  # rules.zero_points_in_b
    b_groups: int  # B loads per iteration: one 32-byte load unpacks into two 8-k steps (4-bit)
    a_group: int  # A tiles of one iteration lying back to back in the workspace (0: they do not)
    in_regs: bool  # rules.fp32_acc_in_registers
    by_column: bool  # accumulators grouped by column tile, for folds.column_pair_fold


def tile_shape(spec: KernelSpec) -> Shape:
    ma, na, ku = max(1, spec.tile_m // 4), spec.tile_n // 4, spec.k_unroll
    gemv = spec.tile_m == 1
    zp_in_b = zero_points_in_b(spec)
    in_regs = fp32_acc_in_registers(spec)
    return Shape(ma=ma, na=na, ku=ku, gemv=gemv, zp_in_b=zp_in_b, b_groups=ku // 2 if spec.bits == 4 else ku,
                 a_group=0 if (gemv or spec.abi == "mlas") else ku * ma, in_regs=in_regs,
                 # fp32 accumulators in memory, two row tiles, at most 16 columns: column_pair_fold
                 by_column=not in_regs and bool(zp_in_b) and ma == 2 and spec.tile_n <= 16)


def grouped(first: int, n: int) -> bool:
    """Is v{first}.. an aligned register group of n (one LMUL-n instruction)?"""
    return n in (2, 4, 8) and first % n == 0


@dataclass(frozen=True)
class Registers:
    used: int  # v0..v(used - 1): what the loop keeps
    n_regs: int  # with the fold's temporaries above them
    acc: Grid  # int32 accumulator pairs
    facc: Grid  # fp32 accumulator pairs (fp32 accumulators in registers; else empty)
    a_reg: list  # gemv: [register per 4 k-steps]; else [k-step][mi]
    b_reg: list[list[int]]  # [group][ni]: raw B (4-bit: its high nibbles)
    b_lo: list[list[int]] | None  # [group][ni]: low nibbles (4-bit)
    zpb: int | None  # the spread zero points' run (asymmetric zero points in B)
    paired_b: bool  # each group's raw and low runs are one aligned run of 2 na: `B - zp` is one instruction


class _Upwards:
    """Takes registers upwards from v0; with `aligned`, a power-of-two run of up to 8 registers
    loaded or unpacked together starts at a multiple of its size (one LMUL > 1 instruction)."""

    def __init__(self, aligned: bool):
        self.aligned, self.next = aligned, 0

    def take(self, n: int, group: bool = False) -> int:
        if self.aligned and group and n in (2, 4, 8):
            self.next = -(-self.next // n) * n
        first, self.next = self.next, self.next + n
        return first


def _accumulators(s: Shape, regs: _Upwards) -> tuple[Grid, Grid]:
    if s.by_column:  # [ni][mi]: a column tile's two row-tile pairs side by side (an LMUL-4 group)
        cols = [tuple(regs.take(2) for _ in range(s.ma)) for _ in range(s.na)]
        acc = tuple(tuple(cols[ni][mi] for ni in range(s.na)) for mi in range(s.ma))
    else:
        acc = tuple(tuple(regs.take(2) for _ in range(s.na)) for _ in range(s.ma))
    facc = tuple(tuple(regs.take(2) for _ in range(s.na)) for _ in range(s.ma)) if s.in_regs else ()
    return acc, facc


def _a_registers(s: Shape, regs: _Upwards) -> list:
    if s.gemv:  # one A register (plus its odd partner, read by slides) feeds 4 k-steps
        return [regs.take(1 if s.ku == 1 else 2) for _ in range(-(-s.ku // 4))]
    first = regs.take(s.ku * s.ma, group=s.a_group > 0)
    return [[first + k * s.ma + mi for mi in range(s.ma)] for k in range(s.ku)]


def _allocate_paired(s: Shape, regs: _Upwards) -> tuple[Grid, Grid, list, list[int]]:
    """4-bit gemm: each group's raw and low-nibble runs as one aligned run of 2 na registers, allocated
    before the A tiles; asymmetric kernels keep their spread zero points twice over (2 na).
    runs = [raw 0, low 0, raw 1, low 1, ..., zero points]."""
    acc, facc = _accumulators(s, regs)
    pairs = [regs.take(2 * s.na, group=True) for _ in range(s.b_groups)]
    runs = [r for first in pairs for r in (first, first + s.na)]
    a_reg = _a_registers(s, regs)
    if s.zp_in_b == "asymmetric":
        runs.append(regs.take(2 * s.na, group=True))
    return acc, facc, a_reg, runs


def _allocate_runs(spec: KernelSpec, s: Shape, regs: _Upwards) -> tuple[Grid, Grid, list, list[int]]:
    """B runs of na registers after the A tiles: raw 0, raw 1, ..., low 0, low 1, ..., zero points;
    returned as runs = [raw 0, low 0, raw 1, low 1, ..., zero points]."""
    acc, facc = _accumulators(s, regs)
    a_reg = _a_registers(s, regs)
    count = s.b_groups * (2 if spec.bits == 4 else 1) + (s.zp_in_b == "asymmetric")
    runs = [regs.take(s.na, group=True) for _ in range(count)]
    if spec.bits == 4:
        runs = [r for g in range(s.b_groups) for r in (runs[g], runs[s.b_groups + g])] + runs[2 * s.b_groups:]
    return acc, facc, a_reg, runs


def _strategies(s: Shape) -> list[tuple[bool, bool]]:
    """(aligned, paired B) in the order tried: the first whose registers fit is taken."""
    can_pair = bool(s.zp_in_b) and 2 * s.na in (2, 4, 8)
    return [(True, True)] * can_pair + [(True, False), (False, False)]


def allocate(spec: KernelSpec, s: Shape) -> Registers:
    budget = register_budget(spec)
    fold_regs = budget["fold temporaries"]  # loop and fold both allocate upwards from v0
    for aligned, paired in _strategies(s):
        regs = _Upwards(aligned)
        acc, facc, a_reg, runs = _allocate_paired(s, regs) if paired else _allocate_runs(spec, s, regs)
        if regs.next + fold_regs <= VECTOR_REGISTERS:
            break
    used = regs.next
    assert sum(budget.values()) <= used + fold_regs <= VECTOR_REGISTERS, "budget and allocation disagree"
    if spec.bits == 4:
        b_reg = [[runs[2 * g] + ni for ni in range(s.na)] for g in range(s.b_groups)]
        b_lo = [[runs[2 * g + 1] + ni for ni in range(s.na)] for g in range(s.b_groups)]
    else:
        b_reg, b_lo = [[runs[g] + ni for ni in range(s.na)] for g in range(s.b_groups)], None
    zpb = runs[-1] if s.zp_in_b == "asymmetric" else None
    # a paired zero-point run is aligned to 2 na, so it is a group of na too
    assert not (paired and zpb is not None) or grouped(zpb, s.na) or s.na == 1
    return Registers(used=used, n_regs=used + fold_regs, acc=acc, facc=facc, a_reg=a_reg, b_reg=b_reg, b_lo=b_lo,
                     zpb=zpb, paired_b=paired)
