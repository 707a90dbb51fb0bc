"""stage_b = m_block kernels (rules.staged_b_refusal): an N tile's int4 B unpacked once per M block into the
workspace (the staging asm), and the tile loop and fold that read it.
"""

from __future__ import annotations

from ...spec import KernelSpec
from .asm import MAX_UNROLLED_ITERATIONS, AsmOp, ImePlan, Vtype, acc_groups, tile_end_ops, zero_accumulators
from .encoding import encode_vmadot, mnemonic
from .folds import rows_spread_per_register


# stage_b = m_block: e16 tables of the staged fold (rows of 4x4 tile lanes: T0 -> A scales 0..3, T1 -> 4..7)
# and of the staging (lane -> column of its tile: the B scale it gets), 32 lanes each.
STAGED_ROW_INDEX = tuple((lane % 16) // 4 + 4 * mi for mi in range(2) for lane in range(32))
STAGED_COLUMN_INDEX = tuple(4 * (lane // 16) + lane % 4 for lane in range(32))
# ... with spread = per_register: one e16 table per register (8 lanes used, 8 padding) for LMUL-1 vrgathers:
# row tile mi's rows 4mi, 4mi+1 then 4mi+2, 4mi+3 (the lanes of a 4x4 tile's first and second register).
STAGED_PER_REGISTER_ROW_INDEX = tuple(v for mi in range(2) for j in range(2)
                                      for v in [4 * mi + 2 * j] * 4 + [4 * mi + 2 * j + 1] * 4 + [0] * 8)
# ... with a_scale_type = fp16: one e16 table per row tile for an LMUL-1 gather over a 4x4 tile's 16 lanes.
STAGED_FP16_ROW_INDEX = tuple(4 * mi + lane // 4 for mi in range(2) for lane in range(16))
# Register map of the staged kernels (rules.register_budget): accumulators from v0, then
B_STAGED, A_STAGED, SCALES_STAGED, TABLES_STAGED = 16, 20, 24, 28
COLUMN_TABLES_STAGED = SCALES_STAGED + 2  # a16: the fold's two e16 lane -> column tables (v26, v27)
STAGED_FP16_SCALE_BYTES = 16  # a16: a block's 8 fp16 B scales, staged as they are (the fold spreads them)


def staged_ime_plan(spec: KernelSpec) -> ImePlan:
    """stage_b = m_block (rules.staged_b_refusal): TN = 8, TM = 4ma, k_unroll 2, fp32 accumulators in registers.

    Per N tile and M block, `stage` writes for every block the B tiles each loop iteration loads
    (high then low nibbles minus the zero points, signed: 4 registers, one whole-register load) and
    the block's 8 B scales spread over the lanes of a row tile's two accumulator pairs (fp16 ones
    widened first; with a_scale_type = fp16 the 8 fp16 scales as they are, which the fold spreads).
    A tile's block is then: zero the int32 accumulators, per iteration one A and one
    B load and 4ma vmadots, and the fold: one vfcvt, one load of the spread B scales, one strided
    load of the A scales and per row tile a vrgatherei16 (row table kept in registers), a vfmul and
    a vfmacc on LMUL-4 groups."""
    if spec.tile_n == 12:
        return _staged_8x12_plan(spec)
    ma, na, ku = spec.tile_m // 4, 2, 2
    acc = tuple(tuple(4 * mi + 2 * ni for ni in range(na)) for mi in range(ma))
    facc = tuple(tuple(4 * ma + 4 * mi + 2 * ni for ni in range(na)) for mi in range(ma))
    B, A, T = B_STAGED, A_STAGED, TABLES_STAGED
    iterations = spec.block // 16
    body = [AsmOp("vle8", f"vl{ku * ma}re8.v v{A}, (%[a])", f"A: {ku} k-steps x {ma} tiles"),
            AsmOp("vle8", f"vl4re8.v v{B}, (%[b])", "staged B: k-step 1 (v16-v17), k-step 0 (v18-v19), cols 0..7"),
            AsmOp("addi", "addi %[b], %[b], 128")]
    for step in range(ku):
        for mi in range(ma):
            for ni in range(na):
                vd, vs1, vs2 = acc[mi][ni], A + step * ma + mi, B + 2 * (1 - step) + ni
                body.append(_vmadot(vd, vs1, vs2))
    body.append(AsmOp("addi", f"addi %[a], %[a], {ku * ma * 32}"))
    fold: list[AsmOp] = []
    vt = Vtype(fold)
    a_fp16 = spec.a_scale_type == "fp16"
    per_register = spec.spread == "per_register"  # STAGED_PER_REGISTER_ROW_INDEX

    def dots_to_fp32() -> None:
        for first, g in acc_groups(4 * ma):
            vt(None, "e32", f"m{g}")
            fold.append(AsmOp("vfcvt", f"vfcvt.f.x.v v{first}, v{first}", f"dots -> fp32, v{first}-v{first + g - 1}"))

    if a_fp16:  # the conversion after the e16 products: one vsetvli serves it and the vfmacc
        _staged_fp16_fold(ma, vt)
        dots_to_fp32()
        fold.append(AsmOp("vfmacc", f"vfmacc.vv v{facc[0][0]}, v{acc[0][0]}, v{B}", "every row and column tile"))
    else:
        dots_to_fp32()
        _staged_fp32_fold(ma, acc, facc, vt, per_register)
    g = 4 * ma  # the accumulators: one LMUL-4ma group each, int32 from v0, fp32 from v{g}
    # a16: the tile start and the fold both leave vtype at e32, m{g}: each block zeroes its int32
    # accumulators with one instruction (on the integer unit: the FP unit does the vfwmul)
    zero_fp32 = ((AsmOp("vset", f"vsetvli t0, zero, e32, m{g}, ta, ma"), AsmOp("vmv", f"vmv.v.i v{g}, 0", "fp32 accumulators"))
                 if a_fp16 else (AsmOp("vset", "vsetivli zero, 16, e32, m2, ta, ma"),
                                 *(AsmOp("vmv", f"vmv.v.i v{r}, 0", "fp32 accumulators") for row in facc for r in row)))
    # x - x: the integer unit's cheapest zero (LLVM's X60: vsub 8 cycles at LMUL 8, vmv.v.i 16)
    acc_zero = ((AsmOp("vsub", "vsub.vv v0, v0, v0", f"int32 accumulators v0-v{g - 1} (e32, m{g} already)"),) if a_fp16
                else zero_accumulators(g, on_vfp=True, halves=per_register))
    col_tables = ((AsmOp("addi", f"addi t0, %[idx16], {32 * ma}"),
                   AsmOp("vle16", f"vl2re16.v v{COLUMN_TABLES_STAGED}, (t0)", "e16 column tables, for every block")) if a_fp16 else ())
    tables = (AsmOp("vle16", f"vl{ma if a_fp16 else 2 * ma}re16.v v{T}, (%[idx16])", "e16 row tables, for every block"),
              *col_tables)
    return _staged_plan(
        spec, acc, facc, body, fold, (*zero_fp32, *tables), acc_zero, a_scale_bytes=(2 if a_fp16 else 4) * 4 * ma,
        stage=_stage_b(spec, iterations), stage_block_bytes=iterations * 128 + (STAGED_FP16_SCALE_BYTES if a_fp16 else 128),
        index16=(STAGED_FP16_ROW_INDEX[:16 * ma] + STAGED_COLUMN_INDEX if a_fp16 else
                 (STAGED_PER_REGISTER_ROW_INDEX if per_register else STAGED_ROW_INDEX)[:32 * ma]),
        stage_index=() if a_fp16 else STAGED_COLUMN_INDEX,  # a16 stages its scales as they are: no spread
    )


def _vmadot(vd: int, vs1: int, vs2: int) -> AsmOp:
    """A signed x signed vmadot: staged B holds codes minus their zero points."""
    word = encode_vmadot(vd, vs1, vs2, signedness="ss")
    return AsmOp("vmadot", f".word 0x{word:08x}", f"{mnemonic('ss', 0)} v{vd}, v{vs1}, v{vs2}")


def _staged_plan(spec: KernelSpec, acc, facc, body: list[AsmOp], fold: list[AsmOp], start: tuple[AsmOp, ...],
                 acc_zero: tuple[AsmOp, ...], a_scale_bytes: int, stage: tuple[AsmOp, ...], stage_block_bytes: int,
                 **extra) -> ImePlan:
    """What every staged kernel shares: one asm statement loops over the blocks (tile start `start`, then per
    block the loop and fold, the A scales advanced by a_scale_bytes), k_unroll 2 (one 16-k group an
    iteration), row-major fp32 accumulators in memory for the C epilogue, whole tiles stored to C."""
    ma, na = len(acc), len(acc[0])
    iterations = spec.block // 16
    unrolled = iterations <= MAX_UNROLLED_ITERATIONS
    tile_start = (*start, AsmOp("label", "2:", "each block"), *(() if unrolled else (AsmOp("li", f"li %[n], {iterations}"),)))
    block_end = (AsmOp("addi", f"addi %[sa], %[sa], {a_scale_bytes}", "next block's A scales"),
                 AsmOp("addi", "addi %[k], %[k], -1"), AsmOp("bnez", "bnez %[k], 2b"))
    direct_store = not spec.bias
    return ImePlan(
        ma=ma, na=na, acc_regs=acc, prologue=(), body=tuple(body), fold=tuple(fold),
        iterations_per_block=iterations, a_bytes_per_iteration=2 * ma * 32,
        b_stride=spec.panel * 8, b_walk=iterations * spec.panel * 8,
        clobbers=tuple(f"v{r}" for r in range(32)), vmadots_per_tile_block=(spec.block // 8) * ma * na,
        facc_floats=ma * na * 16, facc_at=f"(i / 4 * {na} + j / 4) * 16 + i % 4 * 4 + j % 4",
        facc_regs=facc, direct_store=direct_store, tile_start=tile_start, block_end=block_end,
        tile_end=tile_end_ops(acc, facc, direct_store), acc_zero=acc_zero, unrolled=unrolled, entry_vset=True,
        stage=stage, stage_block_bytes=stage_block_bytes, **extra)


# Register map of the 8x12 staged kernel: int32 accumulators v0-v11 and fp32 ones v12-v23 by column tile
# (pair [mi][ni] at 4 ni + 2 mi: one LMUL-4 group per column tile, both row tiles), A of two k-steps
# v24-v27, one k-step's staged B columns 0..7 v28-v29, both k-steps' columns 8..11 v30-v31 (the staged
# layout of _stage_b_12); in the fold v24-v31 are free.
WIDE_A, WIDE_B, WIDE_FACC = 24, 28, 12
WIDE_SCALE_BYTES = 32  # a block's 12 fp16 B scales (24 bytes), staged as they are, padded to 32


def _staged_8x12_plan(spec: KernelSpec) -> ImePlan:
    """stage_b = m_block with TN = 12, TM = 8 and a_scale_type = fp16 (rules.staged_b_refusal): six vmadot
    tiles, fp32 accumulators in registers (32 of 32). An iteration loads A for two k-steps (one vl4r),
    columns 8..11 of both k-steps' staged B (one vl2r) and columns 0..7 of each (a vl2r): 4 loads per 12
    vmadots, every one at LMUL 2 or more (LLVM's X60 schedule charges an LMUL-1 load 3 cycles for 32 bytes).

    The fold needs no index table in registers: the 8 fp16 A scales are spread over a column tile's 32
    lanes (lane -> its row) by one e16 LMUL-2 gather whose index (lane / 4) vid and vsrl build; the 4
    fp16 B scales of column tile j are one 64-bit element of the B scales' register, which one
    vrgather.vi at SEW 64 repeats over those lanes (lane -> its column); one vfwmul gives the exact fp32
    products into a group overlapping that spread (its highest part: RVV 1.0 §5.2) and one vfmacc folds
    the column tile. 18 vector instructions a block with the accumulators' zeroing."""
    ma, na, ku = 2, 3, 2
    acc = tuple(tuple(4 * ni + 2 * mi for ni in range(na)) for mi in range(ma))
    facc = tuple(tuple(WIDE_FACC + 4 * ni + 2 * mi for ni in range(na)) for mi in range(ma))
    A, B = WIDE_A, WIDE_B
    iterations = spec.block // 16
    body = [AsmOp("vle8", f"vl4re8.v v{A}, (%[a])", "A: 2 k-steps x 2 tiles")]
    for step in range(ku):
        body += [AsmOp("vle8", f"vl2re8.v v{B}, (%[b])", f"staged B, k-step {step}: cols 0..7"), AsmOp("addi", "addi %[b], %[b], 64")]
        if step == 0:
            body += [AsmOp("vle8", f"vl2re8.v v{B + 2}, (%[b])", "cols 8..11 of k-steps 0 and 1"), AsmOp("addi", "addi %[b], %[b], 64")]
        for mi in range(ma):
            for ni in range(na):
                vd, vs1, vs2 = acc[mi][ni], A + step * ma + mi, B + ni + (step if ni == 2 else 0)
                body.append(_vmadot(vd, vs1, vs2))
    body.append(AsmOp("addi", f"addi %[a], %[a], {ku * ma * 32}"))
    IDX, SB, P, SA, RAW = 24, 26, 24, 28, 30  # RAW: the A scales (v30) and B scales (v31), one e16 LMUL-2 group
    fold: list[AsmOp] = []
    vt = Vtype(fold)
    vt(8, "e16", "m1")
    fold.append(AsmOp("vle16", f"vle16.v v{RAW}, (%[sa])", "fp16 A scales, rows 0..7 (adjacent: _a_scale_group)"))
    vt(12, "e16", "m1")
    fold += [AsmOp("vle16", f"vle16.v v{RAW + 1}, (%[b])", "staged fp16 B scales, columns 0..11"),
             AsmOp("addi", f"addi %[b], %[b], {WIDE_SCALE_BYTES}")]
    vt(None, "e16", "m2")
    fold += [AsmOp("vid", f"vid.v v{IDX}"), AsmOp("vsrl", f"vsrl.vi v{IDX}, v{IDX}, 2", "lane -> its row (lane / 4)"),
             AsmOp("vrgather", f"vrgather.vv v{SA}, v{RAW}, v{IDX}", "A scales spread over a column tile's lanes")]
    for first, g in acc_groups(4 * na):
        vt(None, "e32", f"m{g}")
        fold.append(AsmOp("vfcvt", f"vfcvt.f.x.v v{first}, v{first}", f"dots -> fp32, v{first}-v{first + g - 1}"))
    for ni in range(na):
        vt(8, "e64", "m2")
        fold.append(AsmOp("vrgather", f"vrgather.vi v{SB}, v{RAW}, {4 + ni}", f"B scales of columns {4 * ni}..{4 * ni + 3}, 8 times"))
        vt(None, "e16", "m2")
        fold.append(AsmOp("vfwmul", f"vfwmul.vv v{P}, v{SB}, v{SA}", f"scale_a * scale_b, column tile {ni} (exact)"))
        vt(None, "e32", "m4")
        fold.append(AsmOp("vfmacc", f"vfmacc.vv v{facc[0][ni]}, v{acc[0][ni]}, v{P}", f"column tile {ni}, both row tiles"))
    acc_zero = (AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"), AsmOp("vsub", "vsub.vv v0, v0, v0", "int32 accumulators v0-v7"),
                AsmOp("vset", "vsetvli t0, zero, e32, m4, ta, ma"), AsmOp("vsub", "vsub.vv v8, v8, v8", "v8-v11"))
    zero_fp32 = (AsmOp("vset", "vsetvli t0, zero, e32, m4, ta, ma"), AsmOp("vmv", f"vmv.v.i v{WIDE_FACC}, 0", "fp32 accumulators"),
                 AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"), AsmOp("vmv", f"vmv.v.i v{WIDE_FACC + 4}, 0"))
    return _staged_plan(spec, acc, facc, body, fold, zero_fp32, acc_zero, a_scale_bytes=2 * 4 * ma,
                        stage=_stage_b_12(spec, iterations), stage_block_bytes=iterations * 192 + WIDE_SCALE_BYTES)


def _stage_b_12(spec: KernelSpec, iterations: int) -> tuple[AsmOp, ...]:
    """The staging asm of an 8x12 kernel: per block of a 12-column N tile, each 16-k group's codes (a
    vl2r and a vl1r) unpacked at LMUL 4 (the fourth register's lanes are computed, never stored) minus
    the spread zero points (or 8), stored as the tile loop loads them: k-step 0's columns 0..7, columns
    8..11 of k-steps 0 and 1, k-step 1's columns 0..7 (192 bytes); then the 12 fp16 scales."""
    asym = spec.zero_point == "asymmetric"
    ops = [AsmOp("label", "2:", "each block")]
    if asym:
        ops += [AsmOp("vset", "vsetivli zero, 12, e8, m1, ta, ma"), AsmOp("vle8", "vle8.v v16, (%[zp])", "the 12 columns' zero points"),
                AsmOp("vset", "vsetivli zero, 12, e64, m4, ta, ma"), AsmOp("vzext", "vzext.vf8 v8, v16", "one column per 64-bit lane"),
                AsmOp("vmul", "vmul.vx v8, v8, %[rep]", "zero point in all 8 bytes of its column")]
    for _ in range(iterations):
        ops += [AsmOp("vle8", "vl2re8.v v0, (%[b])", "16 k x 8 columns of codes"), AsmOp("addi", "addi t0, %[b], 64"),
                AsmOp("vle8", "vl1re8.v v2, (t0)", "and 4 more"), AsmOp("add", "add %[b], %[b], %[bstride]"),
                AsmOp("vset", "vsetvli t0, zero, e8, m4, ta, ma"), AsmOp("vand", "vand.vi v4, v0, 15", "low nibbles: k-step 0"),
                AsmOp("vsrl", "vsrl.vi v0, v0, 4", "high nibbles: k-step 1"),
                *((AsmOp("vsub", "vsub.vv v4, v4, v8", "- zero points"), AsmOp("vsub", "vsub.vv v0, v0, v8", "- zero points")) if asym else
                  (AsmOp("vadd", "vadd.vi v4, v4, -8", "- 8"), AsmOp("vadd", "vadd.vi v0, v0, -8", "- 8"))),
                AsmOp("vse8", "vs2r.v v4, (%[out])", "k-step 0, cols 0..7"), AsmOp("addi", "addi t0, %[out], 64"),
                AsmOp("vse8", "vs1r.v v6, (t0)", "k-step 0, cols 8..11"), AsmOp("addi", "addi t0, %[out], 96"),
                AsmOp("vse8", "vs1r.v v2, (t0)", "k-step 1, cols 8..11"), AsmOp("addi", "addi t0, %[out], 128"),
                AsmOp("vse8", "vs2r.v v0, (t0)", "k-step 1, cols 0..7"), AsmOp("addi", "addi %[out], %[out], 192")]
    ops += [AsmOp("vset", "vsetivli zero, 12, e16, m1, ta, ma"), AsmOp("vle16", "vle16.v v12, (%[sb])", "B fp16 scales"),
            AsmOp("vse16", "vse16.v v12, (%[out])", "as they are"), AsmOp("addi", f"addi %[out], %[out], {WIDE_SCALE_BYTES}"),
            AsmOp("add", "add %[b], %[b], %[bnext]", "next block's B"), AsmOp("add", "add %[sb], %[sb], %[sbs]", "next block's B scales"),
            *((AsmOp("add", "add %[zp], %[zp], %[zps]", "next block's zero points"),) if asym else ()),
            AsmOp("addi", "addi %[k], %[k], -1"), AsmOp("bnez", "bnez %[k], 2b")]
    return tuple(ops)


def _staged_fp32_fold(ma: int, acc, facc, vt: "Vtype", per_register: bool) -> None:
    """fp32 A scales (appended through vt): the spread B scales (fp32, 128 B) and the tile's A scales
    loaded, then per row tile the A scales spread (one LMUL-4 gather, or LMUL-1 ones with spread =
    per_register), multiplied by the B scales and the dots accumulated."""
    B, A, SB, T = B_STAGED, A_STAGED, SCALES_STAGED, TABLES_STAGED
    fold = vt.ops
    fold += [AsmOp("vle32", f"vl4re32.v v{SB}, (%[b])", "staged B scales, spread over a row tile's lanes"),
             AsmOp("addi", "addi %[b], %[b], 128")]
    vt(4 * ma, "e32", "m1")
    fold.append(AsmOp("vle32", f"vle32.v v{B}, (%[sa])", f"A scales, rows 0..{4 * ma - 1} (adjacent: _a_scale_group)"))
    for mi in range(ma):
        if per_register:
            vt(8, "e32", "m1")
            fold += rows_spread_per_register(A, B, T + 2 * mi, mi)
        vt(None, "e32", "m4")
        if not per_register:
            fold.append(AsmOp("vrgather", f"vrgatherei16.vv v{A}, v{B}, v{T + 2 * mi}", f"A scales of rows {4 * mi}..{4 * mi + 3}, twice"))
        fold += [AsmOp("vfmul", f"vfmul.vv v{A}, v{A}, v{SB}", "scale_a * scale_b"),
                 AsmOp("vfmacc", f"vfmacc.vv v{facc[mi][0]}, v{acc[mi][0]}, v{A}", f"row tile {mi}, both column tiles")]


def _staged_fp16_fold(ma: int, vt: "Vtype") -> None:
    """a_scale_type = fp16 (appended through vt): the block's 8 staged fp16 B scales and the tile's
    fp16 A scales loaded at vl 8 (16 bytes each: one VLS beat under the model); two e16 LMUL-1
    gathers spread the B scales over column tile 0's and 1's lanes (v24, v25; lane -> column tables
    v26, v27), one per row tile its 4 A scales over a 4x4 tile's 16 lanes, and two vfwmul give
    scale_a * scale_b exactly in fp32 (11 by 11 significant bits fit fp32's 24) for its two column
    tiles, into products v16.. laid out as the accumulators. The caller then converts the dots and
    folds them with one vfmacc (one vsetvli for both).
    Measured alternatives: the B scales staged already spread (64 B, one whole-register load, no
    gathers: 4 more VLS beats per (tile, block)); the A scales spread by the A quantization (each
    four times, no gathers: VLS 38 -> 40 cycles per (tile, block) of 8x8 block 32 under the model).
    VLS binds at M = 512, the gathers go to the integer unit."""
    SB, P, T = SCALES_STAGED, B_STAGED, TABLES_STAGED
    CT, SA, SPREAD = COLUMN_TABLES_STAGED, 30, 31  # row tables v28.. (T)
    fold = vt.ops
    vt(8, "e16", "m1")
    fold += [AsmOp("vle16", f"vle16.v v{SPREAD}, (%[b])", "staged fp16 B scales, columns 0..7"),
             AsmOp("addi", f"addi %[b], %[b], {STAGED_FP16_SCALE_BYTES}"),
             AsmOp("vle16", f"vle16.v v{SA}, (%[sa])", f"fp16 A scales, rows 0..{4 * ma - 1} (adjacent: _a_scale_group)")]
    vt(16, "e16", "m1")
    fold += [AsmOp("vrgather", f"vrgatherei16.vv v{SB + ni}, v{SPREAD}, v{CT + ni}", f"B scales of columns {4 * ni}..{4 * ni + 3}")
             for ni in range(2)]
    for mi in range(ma):
        fold.append(AsmOp("vrgather", f"vrgatherei16.vv v{SPREAD}, v{SA}, v{T + mi}", f"A scales of rows {4 * mi}..{4 * mi + 3}"))
        fold += [AsmOp("vfwmul", f"vfwmul.vv v{P + 4 * mi + 2 * ni}, v{SPREAD}, v{SB + ni}",
                       f"scale_a * scale_b, row tile {mi}, column tile {ni} (exact)") for ni in range(2)]


def _stage_b(spec: KernelSpec, iterations: int) -> tuple[AsmOp, ...]:
    """The staging asm: for every block of an N tile (8 columns of a panel), its B tiles unpacked as
    the tile loop of a non-staged kernel would (vand/vsrl, minus the spread zero points or 8) and
    stored whole, then its 8 B scales spread by the lane -> column table (v16): as fp32, or with
    a_scale_type = fp16 as the fp16 values the fold multiplies."""
    spread = spec.a_scale_type != "fp16"  # fp32 B scales are staged spread over the fold's lanes
    ops = [*((AsmOp("vle16", "vl2re16.v v16, (%[cols])", "lane -> column, for every block"),) if spread else ()),
           AsmOp("label", "2:", "each block")]
    asym = spec.zero_point == "asymmetric"
    if asym:
        ops += [AsmOp("vset", "vsetivli zero, 8, e8, m1, ta, ma"), AsmOp("vle8", "vle8.v v8, (%[zp])", "the 8 columns' zero points"),
                AsmOp("vset", "vsetivli zero, 8, e64, m2, ta, ma"), AsmOp("vzext", "vzext.vf8 v4, v8", "one column per 64-bit lane"),
                AsmOp("vmul", "vmul.vx v4, v4, %[rep]", "zero point in all 8 bytes of its column"),
                AsmOp("vmv", "vmv2r.v v6, v4", "again: for the high and the low nibbles")]
    for _ in range(iterations):
        ops += [AsmOp("vle8", "vl2re8.v v0, (%[b])", "16 k x 8 columns of codes"), AsmOp("add", "add %[b], %[b], %[bstride]"),
                AsmOp("vset", "vsetvli t0, zero, e8, m2, ta, ma"), AsmOp("vand", "vand.vi v2, v0, 15", "low nibbles: k-step 0"),
                AsmOp("vsrl", "vsrl.vi v0, v0, 4", "high nibbles: k-step 1"), AsmOp("vset", "vsetvli t0, zero, e8, m4, ta, ma"),
                AsmOp("vsub", "vsub.vv v0, v0, v4", "- zero points") if asym else AsmOp("vadd", "vadd.vi v0, v0, -8", "- 8"),
                AsmOp("vse8", "vs4r.v v0, (%[out])"), AsmOp("addi", "addi %[out], %[out], 128")]
    if spec.a_scale_type == "fp16":  # the fold multiplies fp16 scales and spreads them (_staged_fp16_fold)
        ops += [AsmOp("vset", "vsetivli zero, 8, e16, mf2, ta, ma"), AsmOp("vle16", "vle16.v v12, (%[sb])", "B fp16 scales"),
                AsmOp("vse16", "vse16.v v12, (%[out])", "as they are"),
                AsmOp("addi", f"addi %[out], %[out], {STAGED_FP16_SCALE_BYTES}")]
    else:
        if spec.scale_type == "fp16":
            ops += [AsmOp("vset", "vsetivli zero, 8, e16, mf2, ta, ma"), AsmOp("vle16", "vle16.v v12, (%[sb])", "B fp16 scales"),
                    AsmOp("vfwcvt", "vfwcvt.f.f.v v8, v12", "widened to fp32, once per M block")]
        else:
            ops += [AsmOp("vset", "vsetivli zero, 8, e32, m1, ta, ma"), AsmOp("vle32", "vle32.v v8, (%[sb])", "B scales")]
        ops += [AsmOp("vset", "vsetvli t0, zero, e32, m4, ta, ma"),
                AsmOp("vrgather", "vrgatherei16.vv v12, v8, v16", "spread: lane -> its column's scale"),
                AsmOp("vse32", "vs4r.v v12, (%[out])"), AsmOp("addi", "addi %[out], %[out], 128")]
    ops += [AsmOp("add", "add %[b], %[b], %[bnext]", "next block's B"), AsmOp("add", "add %[sb], %[sb], %[sbs]", "next block's B scales"),
            *((AsmOp("add", "add %[zp], %[zp], %[zps]", "next block's zero points"),) if asym else ()),
            AsmOp("addi", "addi %[k], %[k], -1"), AsmOp("bnez", "bnez %[k], 2b")]
    return tuple(ops)
