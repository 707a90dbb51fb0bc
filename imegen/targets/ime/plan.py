"""The IME tile's asm statement: registers, the k loop (zero-point prologue, A/B loads, B unpacking,
vmadots), the block fold and the block/tile frame around them."""

from __future__ import annotations

import re

from ...spec import KernelSpec
from .asm import MAX_UNROLLED_ITERATIONS, AsmOp, ImePlan, gathers_per_register, lmul_name, tile_end_ops, zero_accumulators
from .encoding import encode_vmadot, mnemonic
from .folds import (PAIRED_FOLD_INDEX, PER_REGISTER_FOLD_INDEX, column_pair_fold, gemv_facc_group, gemv_fold, ime_fold,
                    paired_column_fold)
from .rules import fp32_acc_in_registers, gemv_fold_lmul, register_budget, staged, zero_points_in_b
from .staged import staged_ime_plan

# A int8 signed x B raw unsigned codes, zero points folded in the epilogue (8-bit, and 4-bit gemv);
# signed x signed when 4-bit gemm kernels subtract the zero points from the unpacked B (rules.zero_points_in_b)
# and for 8-bit MLAS kernels, which store B as signed q - 128 and fold zero points through MLAS's block
# sums (plan.KernelPlan.blksum).
IME_SIGNEDNESS = {False: "su", True: "ss"}


def ime_plan(spec: KernelSpec, L) -> ImePlan:
    """The asm statement of a tile (L: the kernel's packed-B layout, plan.PackLayout)."""
    if staged(spec):
        return staged_ime_plan(spec)
    ma, na, ku = max(1, spec.tile_m // 4), spec.tile_n // 4, spec.k_unroll
    gemv = spec.tile_m == 1
    zp_in_b = zero_points_in_b(spec)
    budget = register_budget(spec)
    fold_regs = budget["fold temporaries"]
    b_groups = ku // 2 if spec.bits == 4 else ku
    a_group = 0 if (gemv or spec.abi == "mlas") else ku * ma  # the A tiles of one iteration lie back to back
    in_regs = fp32_acc_in_registers(spec)
    # fp32 accumulators in memory, two row tiles, at most 16 columns: column_pair_fold, on
    # accumulators (and fp32 accumulators in memory) grouped by column tile.
    by_column = not in_regs and bool(zp_in_b) and ma == 2 and spec.tile_n <= 16

    def allocate(aligned: bool, pair_b: bool = False):
        """Registers upwards from v0; a power-of-two run of up to 8 registers loaded or unpacked
        together is aligned to its size (one LMUL > 1 instruction) when `aligned`. With `pair_b`
        (4-bit gemm) each group's raw and low-nibble runs form one aligned run of 2 na registers,
        allocated before the A tiles, and asymmetric kernels keep their spread zero points twice
        over, so that `B - zp` is one instruction per group."""
        next_reg = 0

        def take(n: int, group: bool = False) -> int:
            nonlocal next_reg
            if aligned and group and n in (2, 4, 8):
                next_reg = -(-next_reg // n) * n
            first, next_reg = next_reg, next_reg + n
            return first

        if by_column:  # [ni][mi]: a column tile's two row-tile pairs side by side (an LMUL-4 group)
            cols = [tuple(take(2) for _ in range(ma)) for _ in range(na)]
            acc = tuple(tuple(cols[ni][mi] for ni in range(na)) for mi in range(ma))
        else:
            acc = tuple(tuple(take(2) for _ in range(na)) for _ in range(ma))
        facc = tuple(tuple(take(2) for _ in range(na)) for _ in range(ma)) if in_regs else ()
        if pair_b:  # runs = [raw 0, low 0, raw 1, low 1, ..., zero points (2 na)]
            pairs = [take(2 * na, group=True) for _ in range(b_groups)]
            runs = [r for first in pairs for r in (first, first + na)]
        if gemv:  # one A register (plus its odd partner, read by slides) feeds 4 k-steps
            a_reg = [take(1 if ku == 1 else 2) for _ in range(-(-ku // 4))]
        else:
            first = take(ku * ma, group=a_group > 0)
            a_reg = [[first + s * ma + mi for mi in range(ma)] for s in range(ku)]
        if pair_b:
            if zp_in_b == "asymmetric":
                runs.append(take(2 * na, group=True))
        else:  # runs = [raw 0, raw 1, ..., low 0, low 1, ..., zero points]
            runs = [take(na, group=True) for _ in range(b_groups * (2 if spec.bits == 4 else 1) + (zp_in_b == "asymmetric"))]
            if spec.bits == 4:
                runs = [r for g in range(b_groups) for r in (runs[g], runs[b_groups + g])] + runs[2 * b_groups:]
        return next_reg, acc, facc, a_reg, runs

    can_pair = bool(zp_in_b) and 2 * na in (2, 4, 8)
    for aligned, pair_b in ((True, True), (True, False), (False, False)):
        if pair_b and not can_pair:
            continue
        used, acc, facc, a_reg, runs = allocate(aligned, pair_b)
        if used + fold_regs <= 32:
            break
    paired_b = aligned and pair_b
    assert used + fold_regs <= 32 and used + fold_regs >= sum(budget.values()), "budget and allocation disagree"
    n_regs = used + fold_regs  # loop and fold both allocate upwards from v0
    grouped = lambda first, n: n in (2, 4, 8) and first % n == 0  # noqa: E731
    if spec.bits == 4:
        b_reg = [[runs[2 * g] + ni for ni in range(na)] for g in range(b_groups)]
        b_lo = [[runs[2 * g + 1] + ni for ni in range(na)] for g in range(b_groups)]
    else:
        b_reg, b_lo = [[runs[g] + ni for ni in range(na)] for g in range(b_groups)], None
    zpb = runs[-1] if zp_in_b == "asymmetric" else None

    ops: list[AsmOp] = []
    lmul_now: int | None = 1  # the template enters the loop at e8, m1; every iteration ends there

    def at_lmul(lmul: int | None) -> None:
        """vsetvli e8 (vl = VLMAX) at `lmul` unless already there; None: something else was set."""
        nonlocal lmul_now
        if lmul is not None and lmul != lmul_now:
            ops.append(AsmOp("vset", f"vsetvli t0, zero, e8, {lmul_name(lmul)}, ta, ma"))
        lmul_now = lmul

    def load(reg: int, ptr: str, offset: int, what: str):
        if offset:
            ops.append(AsmOp("addi", f"addi t1, {ptr}, {offset}"))
            ops.append(AsmOp("vle8", f"vle8.v v{reg}, (t1)", what))
        else:
            ops.append(AsmOp("vle8", f"vle8.v v{reg}, ({ptr})", what))

    # Before the loop: the tile's zero points spread over the unpacked B layout (byte 8c+j of a
    # 4-column B tile is column c), so that `B - zp` is one vsub per register and vmadot runs signed.
    prologue: list[AsmOp] = []
    # Paired runs of a tile of at most 8 columns in imegen's packed B: one stride-0 load reads the tile's
    # TN zero-point bytes twice, so the spread covers raw + low runs without a copy. The load's element is
    # TN bytes: matmul refuses a packed B that is not 8-byte aligned, and every chunk part is a multiple of it.
    twice = (paired_b and zpb is not None and spec.tile_n in (4, 8) and spec.scales != "ort"
             and all(n % spec.tile_n == 0 for n in (L.data_bytes, L.scale_bytes, L.zp_bytes)))
    if zpb is not None:
        raw, idx = b_reg[0][0], b_lo[0][0]
        if twice:
            prologue += [AsmOp("vset", f"vsetivli zero, 2, e{8 * spec.tile_n}, m1, ta, ma"),
                         AsmOp(f"vlse{8 * spec.tile_n}", f"vlse{8 * spec.tile_n}.v v{raw}, (%[zp]), zero", "B zero points of the tile's columns, twice")]
        else:
            vl = f"vsetivli zero, {spec.tile_n}, e8, m1, ta, ma" if spec.tile_n < 32 else "vsetvli t0, zero, e8, m1, ta, ma"
            prologue += [AsmOp("vset", vl), AsmOp("vle8", f"vle8.v v{raw}, (%[zp])", "B zero points of the tile's columns")]
    if paired_b and zpb is not None and not (grouped(zpb, na) or na == 1):
        paired_b = False  # (cannot happen: the run is aligned to 2 na)
    if zpb is not None and grouped(zpb, na) or (zpb is not None and na == 1):
        # Column c's zero point fills bytes 8c..8c+7 of the run: zero-extend each to 64 bits, times 0x0101..01.
        lanes, m = (2 * spec.tile_n, 2 * na) if twice else (spec.tile_n, na)
        vl64 = f"vsetivli zero, {lanes}, e64, m{m}, ta, ma" if lanes < 32 else f"vsetvli t0, zero, e64, m{m}, ta, ma"
        prologue += [AsmOp("vset", vl64), AsmOp("vzext", f"vzext.vf8 v{zpb}, v{raw}", "one column per 64-bit lane"),
                     AsmOp("vmul", f"vmul.vx v{zpb}, v{zpb}, %[rep]", "zero point in all 8 bytes of its column")]
        if paired_b and not twice:
            prologue.append(AsmOp("vmv", f"vmv{na}r.v v{zpb + na}, v{zpb}", "again, next to itself: one vsub per raw + low run"))
    elif zpb is not None:
        prologue.append(AsmOp("vset", "vsetvli t0, zero, e8, m1, ta, ma"))
        for ni in range(na):
            prologue += [AsmOp("addi", f"addi t1, %[zpi], {32 * ni}"), AsmOp("vle8", f"vle8.v v{idx}, (t1)", "byte -> column"),
                         AsmOp("vrgather", f"vrgather.vv v{zpb + ni}, v{raw}, v{idx}", f"zero points, cols {4 * ni}..{4 * ni + 3}")]

    if gemv:
        for q, reg in enumerate(a_reg):
            load(reg, "%[a]", q * 32, f"A row, k-steps {4 * q}..{4 * q + 3}")
    elif spec.abi == "mlas":  # A rows lie lda bytes apart (8-byte aligned): one strided 4 x 8-byte load per tile
        ops.append(AsmOp("vset", "vsetivli zero, 4, e64, m1, ta, ma", "4 rows x 8 bytes"))
        for s in range(ku):
            for mi in range(ma):
                ops.append(AsmOp("addi", f"addi t1, %[a], {s * 8}"))
                ops += [AsmOp("add", "add t1, t1, %[lda4]")] * mi
                ops.append(AsmOp("vlse64", f"vlse64.v v{a_reg[s][mi]}, (t1), %[lda]", f"A rows {4 * mi}..{4 * mi + 3}, k-step {s}"))
        lmul_now = None
    elif grouped(a_reg[0][0], a_group):  # a whole-register load: needs no vtype
        first = a_reg[0][0]
        ops += [AsmOp("vle8", f"vl{a_group}re8.v v{first}, (%[a])", f"A: {ku} k-steps x {ma} tiles, v{first}-v{first + a_group - 1}")]
    else:
        for s in range(ku):
            for mi in range(ma):
                load(a_reg[s][mi], "%[a]", (s * ma + mi) * 32, f"A rows {4 * mi}..{4 * mi + 3}, k-step {s}")
    for g in range(b_groups):
        # one run of na registers when aligned (LMUL na), else register by register
        parts = [(0, na)] if grouped(b_reg[g][0], na) and (b_lo is None or grouped(b_lo[g][0], na)) else [(ni, 1) for ni in range(na)]
        for ni, n in parts:
            raw = b_reg[g][ni]
            what = f"B cols {4 * ni}..{4 * (ni + n) - 1}, group {g}"
            if ni:
                ops.append(AsmOp("addi", f"addi t1, %[b], {ni * 32}"))
            ops.append(AsmOp("vle8", f"vl{n}re8.v v{raw}, ({'t1' if ni else '%[b]'})", what))  # whole registers: no vtype
            if spec.bits == 4:
                at_lmul(n)
                lo = b_lo[g][ni]
                ops.append(AsmOp("vand", f"vand.vi v{lo}, v{raw}, 15", "low nibbles"))
                ops.append(AsmOp("vsrl", f"vsrl.vi v{raw}, v{raw}, 4", "high nibbles"))
                if paired_b:
                    pass  # one instruction over the raw + low run below
                elif zpb is not None:
                    ops += [AsmOp("vsub", f"vsub.vv v{r}, v{r}, v{zpb + ni}", "- zero point") for r in (lo, raw)]
                elif zp_in_b:
                    ops += [AsmOp("vadd", f"vadd.vi v{r}, v{r}, -{1 << (spec.bits - 1)}", "- zero point") for r in (lo, raw)]
        if paired_b:
            at_lmul(2 * na)
            first = b_reg[g][0]
            ops.append(AsmOp("vsub", f"vsub.vv v{first}, v{first}, v{zpb}", "- zero point, high and low nibbles") if zpb is not None
                       else AsmOp("vadd", f"vadd.vi v{first}, v{first}, -{1 << (spec.bits - 1)}", "- zero point, high and low nibbles"))
        ops.append(AsmOp("add", "add %[b], %[b], %[bstride]"))
    at_lmul(1)  # vmadot runs at e8, m1, vl = 32
    sign = IME_SIGNEDNESS[bool(zp_in_b) or spec.zero_point == "blksum"]
    for s in range(ku):
        g, half = (s // 2, s % 2) if spec.bits == 4 else (s, 0)
        for mi in range(ma):
            vs1, slide = (a_reg[s // 4], s % 4) if gemv else (a_reg[s][mi], 0)
            for ni in range(na):
                vs2 = b_reg[g][ni] if (spec.bits == 8 or half) else b_lo[g][ni]
                vd = acc[mi][ni]
                word = encode_vmadot(vd, vs1, vs2, signedness=sign, slide=slide)
                ops.append(AsmOp("vmadot", f".word 0x{word:08x}", f"{mnemonic(sign, slide)} v{vd}, v{vs1}, v{vs2}"))
    a_step = ku * 8 if (gemv or spec.abi == "mlas") else ku * ma * 32
    ops.append(AsmOp("addi", f"addi %[a], %[a], {a_step}"))
    # fp32 accumulators in registers: two register pairs the loop leaves free keep the fold's
    # lane -> row and lane -> column index tables for the whole tile (loaded once, not per block).
    tables: tuple[int, int] | None = None
    table_loads: tuple[AsmOp, ...] = ()
    fold = column_pair_fold(spec, acc) if by_column else None
    t4 = -(-used // 4) * 4
    if fold is None and facc and na == 2 and ma <= 2 and t4 + 4 <= 32:
        fold = paired_column_fold(spec, acc, facc, t4)
        table_loads = (AsmOp("vle16", f"vl4re16.v v{t4}, (%[idx16])", "e16 index tables: lane -> row, lane -> column, for every block"),)
    # gemv: the row's fp32 accumulators (one e32 group of TN lanes) in registers above the loop's
    # and the fold's, when they fit: one asm statement then runs all blocks (as for gemm tiles).
    gemv_facc = gemv_facc_group(spec, acc[0], used) if gemv else None
    if gemv:
        fold = gemv_fold(spec, acc[0], gemv_facc)
    if fold is None:
        if facc and used <= 28:
            first = -(-used // 2) * 2
            tables = (first, first + 2) if first + 4 <= 32 else None
        fold = ime_fold(spec, acc, facc, tables)
        if tables and not any(re.search(rf"\bv{tables[0]}\b", op.text) for op in fold):
            tables = None  # the general fold loads its own
        if tables:
            table_loads = (AsmOp("vle32", f"vle32.v v{tables[1]}, (%[idx])", "lane -> column q, for every block"),
                           AsmOp("addi", "addi t1, %[idx], 64"), AsmOp("vle32", f"vle32.v v{tables[0]}, (t1)", "lane -> row r, for every block"))
    iterations = spec.block // (8 * ku)
    unrolled = iterations <= MAX_UNROLLED_ITERATIONS
    tile_start = block_end = tile_end = ()
    direct_store = bool(facc) and not spec.bias and ma * na >= 2
    if facc:
        pairs = [r for row in facc for r in row]
        loads = table_loads
        tile_start = (AsmOp("vset", "vsetivli zero, 16, e32, m2, ta, ma"),
                      *(AsmOp("vmv", f"vmv.v.i v{r}, 0", "fp32 accumulators") for r in pairs), *loads,
                      AsmOp("label", "2:", "each block"), *(() if unrolled else (AsmOp("li", f"li %[n], {iterations}"),)))
        # A tiles of consecutive blocks lie back to back (the loop leaves %[a] at the next block's);
        # the B data pointer jumps from where the loop left it to the next chunk's.
        block_end = (AsmOp("add", "add %[b], %[b], %[bnext]", "next block's B tiles"),
                     AsmOp("add", "add %[sb], %[sb], %[sbs]", "next block's B scales"),
                     *((AsmOp("add", "add %[zp], %[zp], %[zps]", "next block's zero points"),) if zp_in_b == "asymmetric" else ()),
                     AsmOp("addi", "addi %[sa], %[sa], 4", "next block's A scales"),
                     AsmOp("addi", "addi %[k], %[k], -1"), AsmOp("bnez", "bnez %[k], 2b"))
        tile_end = tile_end_ops(acc, facc, direct_store)
    elif gemv_facc is not None:
        g, lanes = gemv_fold_lmul(spec.tile_n), spec.tile_n
        vset = AsmOp("vset", f"vsetivli zero, {lanes}, e32, m{g}, ta, ma" if lanes < 32 else f"vsetvli t0, zero, e32, m{g}, ta, ma")
        tile_start = (vset, AsmOp("vmv", f"vmv.v.i v{gemv_facc}, 0", "fp32 accumulators of the row"),
                      AsmOp("label", "2:", "each block"), *(() if unrolled else (AsmOp("li", f"li %[n], {iterations}"),)))
        # The loop leaves %[a] at the next block's A; the B data, scales and zero points of the next
        # block lie a constant stride on; A's scales and sums are one word on.
        block_end = (AsmOp("add", "add %[b], %[b], %[bnext]", "next block's B tiles"),
                     AsmOp("add", "add %[sb], %[sb], %[sbs]", "next block's B scales"),
                     *((AsmOp("add", "add %[zp], %[zp], %[zps]", "next block's zero points"),) if spec.zero_point == "asymmetric" else ()),
                     AsmOp("addi", "addi %[sa], %[sa], 4", "next block's A scale"),
                     AsmOp("addi", "addi %[as], %[as], 4", "next block's A sum"),
                     AsmOp("addi", "addi %[k], %[k], -1"), AsmOp("bnez", "bnez %[k], 2b"))
        tile_end = (vset, AsmOp("vse32", f"vse32.v v{gemv_facc}, (%[facc])", "the row, for the C epilogue"))
        facc = ((gemv_facc,),)
    # rules.spread_refusal admits only tiles these folds are written for; another fold would not spread per register
    assert spec.spread == "group" or gathers_per_register(fold), spec.describe()
    return ImePlan(
        ma=ma, na=na, acc_regs=acc, prologue=tuple(prologue), body=tuple(ops), fold=fold,
        iterations_per_block=iterations, a_bytes_per_iteration=a_step,
        b_stride=spec.panel * 8,  # a panel's B tiles for one 16-k (4-bit) or 8-k (8-bit) group
        b_walk=iterations * b_groups * spec.panel * 8,
        clobbers=tuple(f"v{r}" for r in range(max(n_regs, _highest_pair_end(fold), _highest_pair_end(tile_start)))),
        facc_floats=spec.tile_n if gemv else ma * na * 16,
        facc_at="j" if gemv else (f"(j / 4 * {ma} + i / 4) * 16 + i % 4 * 4 + j % 4" if by_column
                                  else f"(i / 4 * {na} + j / 4) * 16 + i % 4 * 4 + j % 4"),
        vmadots_per_tile_block=(spec.block // 8) * ma * na,
        facc_regs=facc, direct_store=direct_store, tile_start=tile_start, block_end=block_end, tile_end=tile_end,
        index16=(PER_REGISTER_FOLD_INDEX if spec.spread == "per_register" else PAIRED_FOLD_INDEX)
        if any("%[idx16]" in op.text for op in tile_start) else (),
        acc_zero=zero_accumulators(2 * ma * na, on_vfp=not gemv), unrolled=unrolled, entry_vset=not _sets_vtype_first(ops),
    )


def _sets_vtype_first(body: list[AsmOp]) -> bool:
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
    regs = [int(r) for op in ops for r in re.findall(r"\bv(\d+)\b", op.text)]
    return min(32, max(regs, default=-4) + 4)
