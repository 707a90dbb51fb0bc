"""The frame around an IME tile's blocks when one asm statement runs the whole K range (fp32
accumulators in registers, or gemv's row group): zero them and load the tables (tile_start), step the
block pointers and branch back (block_end), store them (tile_end)."""

from __future__ import annotations

from dataclasses import dataclass

from ...spec import KernelSpec
from .asm import AsmOp, tile_end_ops
from .registers import Grid, Registers, Shape
from .rules import gemv_fold_lmul


@dataclass(frozen=True)
class Frame:
    tile_start: tuple[AsmOp, ...] = ()
    block_end: tuple[AsmOp, ...] = ()
    tile_end: tuple[AsmOp, ...] = ()
    facc: Grid = ()  # the registers holding the fp32 accumulators (ImePlan.facc_regs)
    direct_store: bool = False  # whole tiles stored to C by the asm


def _block_label(iterations: int, unrolled: bool) -> tuple[AsmOp, ...]:
    return (AsmOp("label", "2:", "each block"), *(() if unrolled else (AsmOp("li", f"li %[n], {iterations}"),)))


def _next_block(zero_points: bool, *a_steps: AsmOp) -> tuple[AsmOp, ...]:
    return (AsmOp("add", "add %[b], %[b], %[bnext]", "next block's B tiles"),
            AsmOp("add", "add %[sb], %[sb], %[sbs]", "next block's B scales"),
            *((AsmOp("add", "add %[zp], %[zp], %[zps]", "next block's zero points"),) if zero_points else ()),
            *a_steps, AsmOp("addi", "addi %[k], %[k], -1"), AsmOp("bnez", "bnez %[k], 2b"))


def tile_frame(spec: KernelSpec, s: Shape, r: Registers, table_loads: tuple[AsmOp, ...], iterations: int,
               unrolled: bool) -> Frame:
    """fp32 accumulators in registers. A tiles of consecutive blocks lie back to back (the loop leaves
    %[a] at the next block's); the B data pointer jumps from where the loop left it to the next chunk's."""
    direct_store = not spec.bias and s.ma * s.na >= 2
    start = (AsmOp("vset", "vsetivli zero, 16, e32, m2, ta, ma"),
             *(AsmOp("vmv", f"vmv.v.i v{reg}, 0", "fp32 accumulators") for row in r.facc for reg in row), *table_loads,
             *_block_label(iterations, unrolled))
    end = _next_block(s.zp_in_b == "asymmetric", AsmOp("addi", "addi %[sa], %[sa], 4", "next block's A scales"))
    return Frame(start, end, tile_end_ops(r.acc, r.facc, direct_store), r.facc, direct_store)


def gemv_frame(spec: KernelSpec, facc: int, iterations: int, unrolled: bool) -> Frame:
    """gemv's row of fp32 accumulators in one e32 group. The loop leaves %[a] at the next block's A; the B
    data, scales and zero points of the next block lie a constant stride on; A's scales and sums are one word on."""
    g, lanes = gemv_fold_lmul(spec.tile_n), spec.tile_n
    vset = AsmOp("vset", f"vsetivli zero, {lanes}, e32, m{g}, ta, ma" if lanes < 32 else f"vsetvli t0, zero, e32, m{g}, ta, ma")
    start = (vset, AsmOp("vmv", f"vmv.v.i v{facc}, 0", "fp32 accumulators of the row"), *_block_label(iterations, unrolled))
    end = _next_block(spec.zero_point == "asymmetric", AsmOp("addi", "addi %[sa], %[sa], 4", "next block's A scale"),
                      AsmOp("addi", "addi %[as], %[as], 4", "next block's A sum"))
    return Frame(start, end, (vset, AsmOp("vse32", f"vse32.v v{facc}, (%[facc])", "the row, for the C epilogue")), ((facc,),))
