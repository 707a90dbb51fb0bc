"""The IME asm statement's vocabulary, shared by the planner's modules: one instruction (AsmOp), the
plan of a tile's asm statement (ImePlan), the vtype tracker the folds append through (Vtype) and the
sequences both the plain and the staged kernels use (accumulators zeroed, the tile's end).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base import lmul_name  # noqa: F401 (the folds' and the planner's too)


# Blocks of at most this many loop iterations run the body repeated instead of a counted loop.
MAX_UNROLLED_ITERATIONS = 4


@dataclass(frozen=True)
class AsmOp:
    kind: str  # vle8 | vlse64 | vset | addi | add | vand | vsrl | vmadot
    text: str  # the assembly, registers resolved
    comment: str = ""


@dataclass(frozen=True)
class ImePlan:
    ma: int  # vmadot tiles down the output tile (A tiles)
    na: int  # vmadot tiles across (B tiles)
    acc_regs: tuple[tuple[int, ...], ...]  # [mi][ni] -> even vd of the int32 accumulator pair
    prologue: tuple[AsmOp, ...]  # per block, before the loop (zero points spread for the B unpack)
    body: tuple[AsmOp, ...]  # one inner-loop iteration: k_unroll 8-k steps
    iterations_per_block: int
    a_bytes_per_iteration: int
    b_stride: int  # bytes between consecutive 8-k (8-bit) or 16-k (4-bit) groups of a panel
    b_walk: int  # bytes the loop advances the B pointer per block
    clobbers: tuple[str, ...]
    vmadots_per_tile_block: int
    fold: tuple[AsmOp, ...]  # after the loop: acc pairs -> fp32, zero-point fix, scale, add into facc
    facc_floats: int  # the tile's fp32 accumulators in memory (gemv: TN results, then TN dots of the block)
    facc_at: str  # C expr in i, j: where output (i, j) accumulates
    # fp32 accumulators in registers (rules.fp32_acc_in_registers): [mi][ni] -> even register pair (gemv,
    # gemv_facc_group: ((first register of the row's e32 group,),)); then
    # one asm statement loops over all blocks: tile_start (zero them, outer label), per block the
    # prologue/loop/fold, block_end (advance the block pointers, branch back), tile_end (store them
    # to facc for the C epilogue). Empty when the accumulators live in memory (one asm per block).
    facc_regs: tuple[tuple[int, ...], ...] = ()
    tile_start: tuple[AsmOp, ...] = ()
    block_end: tuple[AsmOp, ...] = ()
    tile_end: tuple[AsmOp, ...] = ()

    acc_zero: tuple[AsmOp, ...] = ()  # per block: the int32 accumulators = 0, one vmv per LMUL-8 group
    direct_store: bool = False  # whole tiles are stored to C by the asm (tile_end), edge tiles via facc
    index16: tuple[int, ...] = ()  # the e16 index tables of paired_column_fold, when it is used
    unrolled: bool = False  # few iterations per block: the body is repeated, no loop counter or branch
    entry_vset: bool = True  # the body relies on entering at e8, m1 (else it sets vtype itself first)
    # stage_b = m_block (staged_ime_plan): `stage` is the asm that writes an N tile's staged B (every
    # block: its unpacked B - zp tiles, then its B scales spread over the fold's lanes, stage_block_bytes
    # in all) for the tiles of an M block; stage_index its lane -> column table (e16).
    stage: tuple[AsmOp, ...] = ()
    stage_block_bytes: int = 0
    stage_index: tuple[int, ...] = ()
    # A whole tile's asm statement that the target lays out itself (ime2's `.hp` gemv: super-blocks of blocks,
    # then the rest), printed as it is; the fields above then only describe it (vmadots_per_tile_block, ...).
    program: tuple[AsmOp, ...] = ()
    # The vmadot tile's geometry in the A workspace: k values per step and bytes per A tile (the K1's 4 rows
    # x 8 k; target ime2 fills its own, 8 rows x 16 k), which templates/prepare_a_int8.c.j2's qa_tile walks.
    k_step: int = 8
    a_tile_bytes: int = 32

    @property
    def whole_k(self) -> bool:
        return bool(self.facc_regs)

    @property
    def entry(self) -> tuple[AsmOp, ...]:
        """What the asm runs before the loop when the body relies on e8, m1 (entry_vset)."""
        return (AsmOp("vset", "vsetvli t0, zero, e8, m1, ta, ma", "vmadot runs at e8, LMUL=1, vl=32"),) if self.entry_vset else ()

    @property
    def staged(self) -> bool:
        return bool(self.stage)

    def uses(self, operand: str) -> bool:
        """Does any instruction of the asm statement name %[operand]?"""
        ops = (*self.tile_start, *self.acc_zero, *self.prologue, *self.body, *self.fold, *self.block_end, *self.tile_end)
        return any(f"%[{operand}]" in op.text for op in ops)


def gathers_per_register(ops: tuple[AsmOp, ...]) -> bool:
    """Does every vrgather of ops run at LMUL 1 (spread = per_register)?"""
    lmul = "m1"
    for op in ops:
        if op.kind == "vset":
            lmul = op.text.split(",")[3].strip()  # vset{i}vli rd, avl, eSEW, mLMUL, ...
        elif op.kind == "vrgather" and lmul != "m1":
            return False
    return True


def tile_end_ops(acc: tuple[tuple[int, ...], ...], facc: tuple[tuple[int, ...], ...], direct_store: bool) -> tuple[AsmOp, ...]:
    """After the last block: the fp32 accumulator pairs to facc (for the C epilogue), or with
    `direct_store` whole tiles straight to C and edge tiles to facc."""
    na = len(acc[0])
    to_facc = (AsmOp("vset", "vsetivli zero, 16, e32, m2, ta, ma"),
               *(op for mi, row in enumerate(facc) for ni, r in enumerate(row)
                 for op in (AsmOp("addi", f"addi t1, %[facc], {(mi * na + ni) * 64}"), AsmOp("vse32", f"vse32.v v{r}, (t1)"))))
    if direct_store:
        # A whole tile (no bias, C 8-byte aligned) goes straight to C: one indexed store per accumulator
        # pair at SEW 64, each element two floats of a tile row (lanes 4r + 2h, 4r + 2h + 1) at byte offset
        # r * ldc * 4 + 8h of element 2r + h, built in the dead int32 accumulators. Half the elements of a
        # per-float store: the model charges indexed stores by the element, LLVM's X60 schedule by VLMAX.
        T, Q = acc[0][0], acc[0][1] if na > 1 else acc[1][0]
        to_c = [AsmOp("vset", "vsetivli zero, 8, e64, m2, ta, ma"), AsmOp("vid", f"vid.v v{T}", "element 2r + h"),
                AsmOp("vsrl", f"vsrl.vi v{Q}, v{T}, 1", "row r"), AsmOp("vmul", f"vmul.vx v{Q}, v{Q}, %[ldc4]", "r * ldc * 4"),
                AsmOp("vand", f"vand.vi v{T}, v{T}, 1", "half h"), AsmOp("vsll", f"vsll.vi v{T}, v{T}, 3", "8h"),
                AsmOp("vadd", f"vadd.vv v{T}, v{T}, v{Q}", "byte offsets in C"),
                AsmOp("slli", "slli t2, %[ldc4], 2", "4 rows of C"), AsmOp("mv", "mv t0, %[c]")]
        for mi, row in enumerate(facc):
            if mi:
                to_c.append(AsmOp("add", "add t0, t0, t2"))
            for ni, r in enumerate(row):
                to_c += [AsmOp("addi", f"addi t1, t0, {16 * ni}"),
                         AsmOp("vsuxei64", f"vsuxei64.v v{r}, (t1), v{T}", f"C rows {4 * mi}.., cols {4 * ni}..")]
        return (AsmOp("beqz", "beqz %[full], 3f", "an edge tile: via facc"),
                *to_c, AsmOp("j", "j 4f"), AsmOp("label", "3:"), *to_facc, AsmOp("label", "4:"))
    return to_facc


def zero_accumulators(n_regs: int, on_vfp: bool, halves: bool = False) -> tuple[AsmOp, ...]:
    """The int32 accumulators = 0, one instruction per LMUL-8 group. `on_vfp` (the gemm folds leave
    ft1 alone): as +0.0f splats, whose bits are 0, so the FP unit does it while the integer unit
    unpacks B. `halves`: each group's first half on the integer unit, its second on the FP unit (the
    staged fold with per-register spreads, whose FP unit is as busy as its load unit and whose integer
    unit idles: LLVM's X60 schedule charges vfmv.v.f and vmv.v.i at LMUL 8 16 cycles each,
    docs/ime-isa.md §7; its LMUL-4 gathers keep the integer unit busy, so there they stay on the FP unit)."""
    ops: list[AsmOp] = [AsmOp("fmv", "fmv.w.x ft1, zero", "+0.0f")] if on_vfp else []
    vt = Vtype(ops)
    for first, g in acc_groups(n_regs):
        parts = ((first, g // 2, False), (first + g // 2, g // 2, True)) if halves and g > 1 else ((first, g, on_vfp),)
        for r, n, fp in parts:
            vt(None, "e32", f"m{n}")
            what = f"int32 accumulators v{r}-v{r + n - 1}"
            ops.append(AsmOp("vfmv", f"vfmv.v.f v{r}, ft1", what) if fp else AsmOp("vmv", f"vmv.v.i v{r}, 0", what))
    return tuple(ops)


def acc_groups(n_regs: int) -> list[tuple[int, int]]:
    """v0..v(n_regs - 1) as aligned power-of-two register groups of at most 8: (first, LMUL)."""
    groups, r = [], 0
    while r < n_regs:
        g = 8
        while g > n_regs - r or r % g:
            g //= 2
        groups.append((r, g))
        r += g
    return groups


class Vtype:
    """Appends a vsetvli/vsetivli only when the (vl, SEW, LMUL) asked for differs from the current one."""

    def __init__(self, ops: list[AsmOp]):
        self.ops, self.now = ops, None

    def __call__(self, vl: int | None, sew: str, lmul: str) -> None:
        if (vl, sew, lmul) != self.now:
            text = f"vsetvli t0, zero, {sew}, {lmul}, ta, ma" if vl is None else f"vsetivli zero, {vl}, {sew}, {lmul}, ta, ma"
            self.ops.append(AsmOp("vset", text))
            self.now = (vl, sew, lmul)
