"""Block folds of IME kernels: after a K block's vmadots, its int32 accumulator pairs (a 4x4 tile's 16
lanes each) become fp32 and are added into the tile's fp32 accumulators with their A and B scales (and
zero points). plan.ime_plan picks one; staged kernels fold in staged.py.
"""

from __future__ import annotations

from ...spec import KernelSpec
from .asm import AsmOp, Vtype, acc_groups, lmul_name
from .rules import gemv_fold_lmul, zero_points_in_b, zp_nibbles


def rows_spread_per_register(dst: int, src: int, tables: int, mi: int) -> list[AsmOp]:
    """Row tile mi's 4 A scales (lanes of src) spread over its two 4x4 tiles' lanes at e32, LMUL 1:
    one gather per register of the first tile (tables, tables + 1: lane -> row), a copy for the second."""
    return [*(AsmOp("vrgather", f"vrgatherei16.vv v{dst + j}, v{src}, v{tables + j}",
                    f"A scales of rows {4 * mi + 2 * j}-{4 * mi + 2 * j + 1}") for j in range(2)),
            AsmOp("vmv", f"vmv2r.v v{dst + 2}, v{dst}", "the same rows for column tile 1")]


def _scale_load(spec: KernelSpec, dst: int, tmp: int, ni: int, vset, lanes: str = "e32, m1") -> list[AsmOp]:
    """The 4 B scales of columns 4ni..4ni+3 into dst as fp32: fp16 ones widened by vfwcvt.f.f.v."""
    if spec.scale_type == "fp16":
        return [AsmOp("addi", f"addi t1, %[sb], {ni * 8}"), vset(4, "e16", "mf2"),
                AsmOp("vle16", f"vle16.v v{tmp}, (t1)", f"B fp16 scales, cols {4 * ni}..{4 * ni + 3}"),
                AsmOp("vfwcvt", f"vfwcvt.f.f.v v{dst}, v{tmp}", "widened to fp32"), vset(4, *lanes.split(", "))]
    return [vset(4, *lanes.split(", ")), AsmOp("addi", f"addi t1, %[sb], {ni * 16}"),
            AsmOp("vle32", f"vle32.v v{dst}, (t1)", f"B scales, cols {4 * ni}..{4 * ni + 3}")]


def ime_fold(spec: KernelSpec, acc: tuple[tuple[int, ...], ...], facc: tuple[tuple[int, ...], ...] = (),
              tables: tuple[int, int] | None = None) -> tuple[AsmOp, ...]:
    """Per block, on the int32 accumulator pairs (16 lanes = a 4x4 tile, lane 4r+q):
    facc += float(dot - zp[q] * sum_a[r]) * (scale_a[r] * scale_b[q]), or with MLAS block sums
    facc += float(dot) * (scale_a[r] * scale_b[q]) + blksum_a[r] * blksum_b[q].

    Row and column values are loaded 4 at a time and spread over the 16 lanes with vrgather
    (index tables: lane -> q and lane -> r). All fold registers are even pairs (LMUL 2) outside
    the accumulators; the A/B registers of the loop are dead by now and are reused. A gemv tile
    has one live row (lanes 0..3 of each pair): see gemv_fold."""
    taken = {r for row in (*acc, *facc) for r in row}
    free = [r for r in range(0, 32, 2) if r not in taken]
    if zero_points_in_b(spec):
        if tables:
            fast = _grouped_signed_fold(spec, acc, [r for r in free if r not in tables], facc, tables)
            if fast is not None:
                return fast
        return _signed_fold(spec, acc, free, facc)
    IDXC, IDXR, SA, AS, X4, SB, Y, ZP = free[:8]
    asym, blksum = spec.zero_point == "asymmetric", spec.zero_point == "blksum"
    vs = lambda n, sew="e32", lmul="m2": AsmOp("vset", f"vsetivli zero, {n}, {sew}, {lmul}, ta, ma")  # noqa: E731
    ops = [vs(16), AsmOp("vle32", f"vle32.v v{IDXC}, (%[idx])", "lane -> column q"),
           AsmOp("addi", "addi t1, %[idx], 64"), AsmOp("vle32", f"vle32.v v{IDXR}, (t1)", "lane -> row r")]
    for mi, row in enumerate(acc):
        ops += [vs(4), AsmOp("vlse32", f"vlse32.v v{X4}, (%[sa]), %[sas]", f"A scales, rows {4 * mi}..{4 * mi + 3}"),
                AsmOp("vlse32", f"vlse32.v v{Y}, (%[as]), %[ass]", "A block sums"),
                AsmOp("add", "add %[sa], %[sa], %[sa4]"), AsmOp("add", "add %[as], %[as], %[as4]"), vs(16),
                AsmOp("vrgather", f"vrgather.vv v{SA}, v{X4}, v{IDXR}"), AsmOp("vrgather", f"vrgather.vv v{AS}, v{Y}, v{IDXR}")]
        for ni, vd in enumerate(row):
            ops += _scale_load(spec, X4, SB, ni, vs, "e32, m2")
            if asym:
                ops += [AsmOp("addi", f"addi t1, %[zp], {ni * 4}"), vs(4, "e8", "mf2"),
                        AsmOp("vle8", f"vle8.v v{ZP}, (t1)", "B zero points"), vs(4),
                        AsmOp("vzext", f"vzext.vf4 v{Y}, v{ZP}")]
            ops += [vs(16), AsmOp("vrgather", f"vrgather.vv v{SB}, v{X4}, v{IDXC}")]
            if blksum:  # ZP holds the B block sums, X4 the accumulators
                ops += [vs(4), AsmOp("addi", f"addi t1, %[bs], {ni * 16}"), AsmOp("vle32", f"vle32.v v{X4}, (t1)", "B block sums"),
                        vs(16), AsmOp("vrgather", f"vrgather.vv v{ZP}, v{X4}, v{IDXC}")]
                off = (mi * len(row) + ni) * 64
                ops += [AsmOp("vfcvt", f"vfcvt.f.x.v v{vd}, v{vd}"), AsmOp("vfmul", f"vfmul.vv v{Y}, v{SA}, v{SB}", "scale_a * scale_b"),
                        AsmOp("addi", f"addi t1, %[facc], {off}"), AsmOp("vle32", f"vle32.v v{X4}, (t1)"),
                        AsmOp("vfmacc", f"vfmacc.vv v{X4}, v{vd}, v{Y}"),
                        AsmOp("vfmacc", f"vfmacc.vv v{X4}, v{AS}, v{ZP}", "+ blksum_a * blksum_b"),
                        AsmOp("vse32", f"vse32.v v{X4}, (t1)")]
                continue
            if asym:
                ops += [AsmOp("vrgather", f"vrgather.vv v{ZP}, v{Y}, v{IDXC}"),
                        AsmOp("vnmsac", f"vnmsac.vv v{vd}, v{ZP}, v{AS}", "dot -= zp * sum_a")]
            else:
                ops += [AsmOp("vnmsac", f"vnmsac.vx v{vd}, %[zpc], v{AS}", "dot -= zp * sum_a")]
            off = (mi * len(row) + ni) * 64
            ops += [AsmOp("vfcvt", f"vfcvt.f.x.v v{vd}, v{vd}"), AsmOp("vfmul", f"vfmul.vv v{Y}, v{SA}, v{SB}", "scale_a * scale_b"),
                    AsmOp("addi", f"addi t1, %[facc], {off}"), AsmOp("vle32", f"vle32.v v{ZP}, (t1)"),
                    AsmOp("vfmacc", f"vfmacc.vv v{ZP}, v{vd}, v{Y}"), AsmOp("vse32", f"vse32.v v{ZP}, (t1)")]
    return tuple(ops)


def _tile_b_scales(spec: KernelSpec, vt: "Vtype", n: int, dst: int, staging: int, lmul: tuple[str, str],
                   what: str = "") -> list[AsmOp]:
    """The tile's n B scales (at %[sb]) into v`dst` as fp32: fp16 ones loaded into v`staging` and widened
    by vfwcvt.f.f.v (the one instruction fp32 scales do not need). lmul: (fp16 LMUL, fp32 LMUL)."""
    if spec.scale_type == "fp16":
        vt(n, "e16", lmul[0])
        return [AsmOp("vle16", f"vle16.v v{staging}, (%[sb])", f"B fp16 scales, cols 0..{n - 1}"),
                AsmOp("vfwcvt", f"vfwcvt.f.f.v v{dst}, v{staging}", f"widened to fp32{what}")]
    vt(n, "e32", lmul[1])
    return [AsmOp("vle32", f"vle32.v v{dst}, (%[sb])", f"B scales, cols 0..{n - 1}{what}")]


def _fold_prologue(spec: KernelSpec, ops: list[AsmOp], vt: "Vtype", ma: int, na: int, n: int, b_dst: int,
                   b_staging: int, a_dst: int, lmul: tuple[str, str], where: tuple[str, str] = ("", ""),
                   a_rows: int | None = None) -> None:
    """Appends the start of a grouped fold: every accumulator to fp32 (one vfcvt per LMUL-8 group), the
    tile's n B scales into v`b_dst` (_tile_b_scales) and the A scales of its first `a_rows` rows (all
    4ma by default) into v`a_dst` by one strided load; that load keeps the B scales' vtype when
    a_rows = n (at SEW 16 a vlse32's EMUL doubles, still the register group a_dst is). where: comment
    suffixes for the B and A scales' lanes."""
    rows = a_rows or 4 * ma
    for first, g in acc_groups(2 * ma * na):
        vt(None, "e32", f"m{g}")
        ops.append(AsmOp("vfcvt", f"vfcvt.f.x.v v{first}, v{first}", f"dots -> fp32, v{first}-v{first + g - 1}"))
    ops += _tile_b_scales(spec, vt, n, b_dst, b_staging, lmul, where[0])
    if rows != n:
        vt(rows, "e32", lmul[1])
    ops.append(AsmOp("vlse32", f"vlse32.v v{a_dst}, (%[sa]), %[sas]", f"A scales, rows 0..{rows - 1}{where[1]}"))


def _spread_16_lanes(ops: list[AsmOp], vt: "Vtype", per_register: bool, dst: int, src: int, idx: int, what: str) -> None:
    """One e32 LMUL-2 vrgather (a 4x4 tile's 16 lanes) at the vtype in force, or with spread = per_register
    its two LMUL-1 halves, which read the one source register `src` (every index relative to it, below 8)."""
    if not per_register:
        ops.append(AsmOp("vrgather", f"vrgather.vv v{dst}, v{src}, v{idx}", what))
        return
    vt(8, "e32", "m1")
    ops.extend(AsmOp("vrgather", f"vrgather.vv v{dst + h}, v{src}, v{idx + h}", f"{what}, tile rows {2 * h}-{2 * h + 1}")
               for h in range(2))
    vt(16, "e32", "m2")


def _grouped_signed_fold(spec: KernelSpec, acc: tuple[tuple[int, ...], ...], free: list[int],
                         facc: tuple[tuple[int, ...], ...], tables: tuple[int, int] | None = None) -> tuple[AsmOp, ...] | None:
    """The signed fold with few instructions, for tiles of at most 16 columns whose accumulators
    are v0.. and whose free register pairs hold every row tile's spread A scales plus 4 (5 with the
    fp32 accumulators in memory): all accumulators converted to fp32 by one instruction per
    LMUL-8 group; the 4 x ma A scales by one strided load, spread per row tile by vrgather with a
    lane -> row index advanced by 4; the TN B scales by one load (fp16: and one vfwcvt), spread
    per column tile by vrgather with a lane -> column index advanced by 4. With `tables` (lane ->
    row, lane -> column pairs loaded once per tile) the advanced indices go to a temporary. None:
    use _signed_fold's general form."""
    ma, na, tn = len(acc), len(acc[0]), spec.tile_n
    if tn > 16 or len(free) < ma + (4 if facc else 5) or sorted(r for row in acc for r in row) != list(range(0, 2 * ma * na, 2)):
        return None
    SAS, (SRC, IDXC, SB, Y) = free[:ma], free[ma:ma + 4]
    FT = None if facc else free[ma + 4]
    IDXR, X = Y, SB  # dead before the B scales are spread and the products formed
    ops: list[AsmOp] = []
    vt = Vtype(ops)
    # The TN B scales into SRC (fp16: staged in IDXC, not loaded yet), then the 4ma A scales into X.
    _fold_prologue(spec, ops, vt, ma, na, tn, SRC, IDXC, X, ("m1", "m2"))
    vt(16, "e32", "m2")

    def index(base: int, step: int, what: str) -> int:
        """The index table `base` advanced by `step` (in place, or into Y when it is kept)."""
        if not step:
            return base
        dst = Y if tables else base
        ops.append(AsmOp("vadd", f"vadd.vi v{dst}, v{base}, {step if tables else 4}", what))
        return dst

    # spread = per_register: LMUL-1 halves of each gather, from the source register holding the 4 scales
    # (indices relative to it; with the tables kept, every index is the table plus 0 or 4).
    per_register = spec.spread == "per_register" and tables is not None
    if spec.spread == "per_register" and not per_register:
        return None

    if tables:
        IDXR, IDXC = tables
    else:
        ops += [AsmOp("addi", "addi t1, %[idx], 64"), AsmOp("vle32", f"vle32.v v{IDXR}, (t1)", "lane -> row r")]
    for mi in range(ma):
        idx = index(IDXR, 4 * (mi % 2 if per_register else mi), "-> row 4mi + r")
        _spread_16_lanes(ops, vt, per_register, SAS[mi], X + (mi // 2 if per_register else 0), idx,
                         f"A scales spread, rows {4 * mi}..{4 * mi + 3}")
    if not tables:
        ops.append(AsmOp("vle32", f"vle32.v v{IDXC}, (%[idx])", "lane -> column q"))
    for ni in range(na):
        idx = index(IDXC, 4 * (ni % 2 if per_register else ni), "-> column 4ni + q")
        _spread_16_lanes(ops, vt, per_register, SB, SRC + (ni // 2 if per_register else 0), idx,
                         f"B scales spread, cols {4 * ni}..{4 * ni + 3}")
        for mi in range(ma):
            vd = acc[mi][ni]
            ops.append(AsmOp("vfmul", f"vfmul.vv v{Y}, v{SAS[mi]}, v{SB}", "scale_a * scale_b"))
            if facc:
                ops.append(AsmOp("vfmacc", f"vfmacc.vv v{facc[mi][ni]}, v{vd}, v{Y}"))
            else:
                ops += [AsmOp("addi", f"addi t1, %[facc], {(mi * na + ni) * 64}"), AsmOp("vle32", f"vle32.v v{FT}, (t1)"),
                        AsmOp("vfmacc", f"vfmacc.vv v{FT}, v{vd}, v{Y}"), AsmOp("vse32", f"vse32.v v{FT}, (t1)")]
    return tuple(ops)


def column_pair_fold(spec: KernelSpec, acc: tuple[tuple[int, ...], ...]) -> tuple[AsmOp, ...]:
    """The fold of two-row-tile kernels (TM = 8, TN <= 16) with the fp32 accumulators in memory,
    grouped by column tile ([ni][mi] in registers and in facc): per column tile one LMUL-4 load,
    multiply-add and store of its 2 x 16 fp32 accumulators, with the product of both row tiles'
    spread A scales (an LMUL-4 group) and its spread B scales (gathered once, copied next to
    themselves). Registers above the accumulators: A scales 4, B scales 2, column index 2,
    B scales twice / products 4, fp32 accumulators 4."""
    ma, na, tn = len(acc), len(acc[0]), spec.tile_n
    base = 4 * na
    SA, SRC, IDXC, SB, F = base, base + 4, base + 6, base + 8, base + 12
    X, IDXR = SB, F  # staging, dead before SB and F are written
    per_register = spec.spread == "per_register"
    ops: list[AsmOp] = []
    vt = Vtype(ops)

    _fold_prologue(spec, ops, vt, ma, na, tn, SRC, IDXC, X, ("m1", "m2"))
    vt(16, "e32", "m2")
    ops += [AsmOp("addi", "addi t1, %[idx], 64"), AsmOp("vle32", f"vle32.v v{IDXR}, (t1)", "lane -> row r")]
    _spread_16_lanes(ops, vt, per_register, SA, X, IDXR, "A scales spread, rows 0..3")
    ops.append(AsmOp("vadd", f"vadd.vi v{IDXR}, v{IDXR}, 4", "-> row 4 + r"))
    _spread_16_lanes(ops, vt, per_register, SA + 2, X, IDXR, "A scales spread, rows 4..7")
    ops.append(AsmOp("vle32", f"vle32.v v{IDXC}, (%[idx])", "lane -> column q"))
    for ni in range(na):
        vt(16, "e32", "m2")
        if ni:  # per register, column tiles 2 and 3 read the B scales' second register: back to q
            step = -4 if per_register and ni == 2 else 4
            ops.append(AsmOp("vadd", f"vadd.vi v{IDXC}, v{IDXC}, {step}", "-> column 4ni + q" if step > 0 else "-> q, in the next register"))
        _spread_16_lanes(ops, vt, per_register, SB, SRC + 1 if per_register and ni >= 2 else SRC, IDXC,
                         f"B scales spread, cols {4 * ni}..{4 * ni + 3}")
        ops.append(AsmOp("vmv", f"vmv2r.v v{SB + 2}, v{SB}", "again, for the second row tile"))
        vt(None, "e32", "m4")
        ops += [AsmOp("vfmul", f"vfmul.vv v{SB}, v{SB}, v{SA}", "scale_a * scale_b, both row tiles"),
                AsmOp("addi", f"addi t1, %[facc], {ni * ma * 64}"), AsmOp("vle32", f"vle32.v v{F}, (t1)"),
                AsmOp("vfmacc", f"vfmacc.vv v{F}, v{acc[0][ni]}, v{SB}", f"cols {4 * ni}..{4 * ni + 3}, both row tiles"),
                AsmOp("vse32", f"vse32.v v{F}, (t1)")]
    return tuple(ops)


# e16 index tables of paired_column_fold (32 lanes each): lane -> row r of its 4x4 tile, and lane ->
# the B scale (lanes 16.. of the scale group) of column tile lane / 16, column q.
PAIRED_FOLD_INDEX = tuple((lane % 16) // 4 for lane in range(32)) + tuple(16 + 4 * (lane // 16) + lane % 4 for lane in range(32))


# spread = per_register: one e16 table per register (8 lanes used, 8 padding), for LMUL-1 vrgathers from the
# register holding the A scales (lanes 0..3) or the B scales (lanes 0..7): the lanes of rows 0-1 and of rows
# 2-3 of a 4x4 tile (-> row), then those of column tile 0 and of column tile 1 (-> column).
PER_REGISTER_FOLD_INDEX = tuple(v for table in ([0] * 4 + [1] * 4, [2] * 4 + [3] * 4, [0, 1, 2, 3] * 2, [4, 5, 6, 7] * 2)
                                for v in table + [0] * 8)


def paired_column_fold(spec: KernelSpec, acc: tuple[tuple[int, ...], ...], facc: tuple[tuple[int, ...], ...],
                        tables: int) -> tuple[AsmOp, ...] | None:
    """The fold of two-column-tile (TN = 8) kernels with the fp32 accumulators in registers, on
    LMUL-4 groups: row tile mi's two accumulator pairs (and fp32 pairs) lie side by side, so
    facc[mi] += float(dot[mi]) * (A scales of mi spread twice) * (B scales of both column tiles)
    is one vfmul and one vfmacc. The B scales (lanes 16..23) and each row tile's 4 A scales (lanes
    0..3, one strided load per row tile: the same row table serves every row tile) share one group S,
    spread by vrgatherei16 with the tables kept at v`tables` (PAIRED_FOLD_INDEX). None when the
    tile's registers do not fit this form."""
    ma, na = len(acc), len(acc[0])
    taken = {r for row in (*acc, *facc) for p in row for r in (p, p + 1)} | set(range(tables, tables + 4))
    groups = [g for g in range(0, 32, 4) if not taken & set(range(g, g + 4))]
    if na != 2 or ma > 2 or len(groups) < 3 or any(row[1] != row[0] + 2 or row[0] % 4 for row in (*acc, *facc)):
        return None
    S, SA, SB = groups[:3]
    T_ROW, T_COL = tables, tables + 2
    per_register = spec.spread == "per_register"  # PER_REGISTER_FOLD_INDEX: tables T..T+3, one register each
    ops: list[AsmOp] = []
    vt = Vtype(ops)
    _fold_prologue(spec, ops, vt, ma, na, 8, S + 2, SA, S, ("mf2", "m1"), (", lanes 16..23", ", lanes 0..3"), a_rows=4)
    if per_register:
        vt(8, "e32", "m1")
        ops += [AsmOp("vrgather", f"vrgatherei16.vv v{SB + j}, v{S + 2}, v{tables + 2 + j // 2}",
                      f"B scales of column tile {j // 2}, rows {2 * (j % 2)}-{2 * (j % 2) + 1}") for j in range(4)]
    else:
        vt(None, "e32", "m4")
        ops.append(AsmOp("vrgather", f"vrgatherei16.vv v{SB}, v{S}, v{T_COL}", "B scales spread over both column tiles"))
    for mi in range(ma):
        if mi:  # this row tile's A scales over the last one's lanes 0..3 (B's lanes are spread already)
            vt(4, "e32", "m1")
            ops += [AsmOp("add", f"add t1, {'%[sa]' if mi == 1 else 't1'}, %[sa4]"),
                    AsmOp("vlse32", f"vlse32.v v{S}, (t1), %[sas]", f"A scales, rows {4 * mi}..{4 * mi + 3}, lanes 0..3")]
        if per_register:
            vt(8, "e32", "m1")
            ops += rows_spread_per_register(SA, S, tables, mi)
            vt(None, "e32", "m4")
        else:
            vt(None, "e32", "m4")
            ops.append(AsmOp("vrgather", f"vrgatherei16.vv v{SA}, v{S}, v{T_ROW}", f"A scales of rows {4 * mi}..{4 * mi + 3}, twice"))
        ops += [AsmOp("vfmul", f"vfmul.vv v{SA}, v{SA}, v{SB}", "scale_a * scale_b"),
                AsmOp("vfmacc", f"vfmacc.vv v{facc[mi][0]}, v{acc[mi][0]}, v{SA}", f"row tile {mi}, both column tiles")]
    return tuple(ops)


def _signed_fold(spec: KernelSpec, acc: tuple[tuple[int, ...], ...], free: list[int],
                 facc: tuple[tuple[int, ...], ...] = ()) -> tuple[AsmOp, ...]:
    """The fold of kernels whose loop ran on B - zp (rules.zero_points_in_b): facc += float(dot) *
    (scale_a[r] * scale_b[q]). When registers allow, every row tile's spread A scales are built
    first and each column tile's B scales once (columns outer), else per row tile. With `facc`
    (registers) the fp32 accumulators are added to in place, and %[sa] is left at the block's
    A scales (t2 walks the row tiles) for the next block's step."""
    fast = _grouped_signed_fold(spec, acc, free, facc)
    if fast is not None:
        return fast
    if facc:
        IDXC, IDXR, X4, SB, Y, *rest = free
        FT = None
    else:
        IDXC, IDXR, X4, SB, Y, FT, *rest = free
    hoist = len(rest) >= len(acc)
    SAS = rest[:len(acc)] if hoist else rest[:1] * len(acc)
    vs = lambda n, sew="e32", lmul="m2": AsmOp("vset", f"vsetivli zero, {n}, {sew}, {lmul}, ta, ma")  # noqa: E731
    sa = "t2" if facc else "%[sa]"
    ops = [vs(16), AsmOp("vle32", f"vle32.v v{IDXC}, (%[idx])", "lane -> column q"),
           AsmOp("addi", "addi t1, %[idx], 64"), AsmOp("vle32", f"vle32.v v{IDXR}, (t1)", "lane -> row r")]
    if facc:
        ops.append(AsmOp("mv", "mv t2, %[sa]"))

    def row_scales(mi: int) -> list[AsmOp]:
        return [vs(4), AsmOp("vlse32", f"vlse32.v v{X4}, ({sa}), %[sas]", f"A scales, rows {4 * mi}..{4 * mi + 3}"),
                AsmOp("add", f"add {sa}, {sa}, %[sa4]"), vs(16), AsmOp("vrgather", f"vrgather.vv v{SAS[mi]}, v{X4}, v{IDXR}")]

    def col_scales(ni: int) -> list[AsmOp]:
        return _scale_load(spec, X4, SB, ni, vs, "e32, m2") + [vs(16), AsmOp("vrgather", f"vrgather.vv v{SB}, v{X4}, v{IDXC}")]

    def fold_pair(mi: int, ni: int) -> list[AsmOp]:
        vd = acc[mi][ni]
        if facc:
            return [AsmOp("vfcvt", f"vfcvt.f.x.v v{vd}, v{vd}"), AsmOp("vfmul", f"vfmul.vv v{Y}, v{SAS[mi]}, v{SB}", "scale_a * scale_b"),
                    AsmOp("vfmacc", f"vfmacc.vv v{facc[mi][ni]}, v{vd}, v{Y}")]
        return [AsmOp("vfcvt", f"vfcvt.f.x.v v{vd}, v{vd}"), AsmOp("vfmul", f"vfmul.vv v{Y}, v{SAS[mi]}, v{SB}", "scale_a * scale_b"),
                AsmOp("addi", f"addi t1, %[facc], {(mi * len(acc[0]) + ni) * 64}"), AsmOp("vle32", f"vle32.v v{FT}, (t1)"),
                AsmOp("vfmacc", f"vfmacc.vv v{FT}, v{vd}, v{Y}"), AsmOp("vse32", f"vse32.v v{FT}, (t1)")]

    if hoist:
        for mi in range(len(acc)):
            ops += row_scales(mi)
        for ni in range(len(acc[0])):
            ops += col_scales(ni)
            for mi in range(len(acc)):
                ops += fold_pair(mi, ni)
    else:
        for mi in range(len(acc)):
            ops += row_scales(mi)
            for ni in range(len(acc[0])):
                ops += col_scales(ni) + fold_pair(mi, ni)
    return tuple(ops)


def gemv_facc_group(spec: KernelSpec, row: tuple[int, ...], loop_top: int) -> int | None:
    """First register of the e32 group that keeps a gemv row's fp32 accumulators across blocks: above
    the loop's registers (loop_top) and the fold's groups, aligned to its LMUL; None when it does not
    fit, or for what the per-block strides cannot walk (ORT's raw arrays, MLAS block sums)."""
    if spec.abi != "imegen" or spec.scales == "ort" or spec.zero_point not in ("symmetric", "asymmetric"):
        return None
    g = gemv_fold_lmul(spec.tile_n)
    fold_top = _gemv_fold_groups(spec, row)[-1] + g
    first = -(-max(loop_top, fold_top) // g) * g
    return first if first + g <= 32 else None


def _gemv_fold_groups(spec: KernelSpec, row: tuple[int, ...]) -> tuple[int, int, int]:
    """The gemv fold's LMUL-g groups above the accumulators: scales (S), loads (F), zero points (X)."""
    g = gemv_fold_lmul(spec.tile_n)
    S = -(-(row[0] + 2 * len(row)) // g) * g
    return S, S + g, S + 2 * g


def gemv_fold(spec: KernelSpec, row: tuple[int, ...], facc: int | None = None) -> tuple[AsmOp, ...]:
    """One live row: only lanes 0..3 (row 0, columns 4ni..4ni+3) of each accumulator pair matter.
    Slides gather them into one e32 group of TN lanes at the first accumulator (VLEN 256: a register
    holds 8 lanes, two pairs' rows), folded with the row's scale and sum as scalars:
    facc[0..TN) += float(dot - zp * sum_a) * (scale_b * scale_a), or with MLAS block sums
    facc += float(dot) * (scale_b * scale_a) + blksum_a * blksum_b. LMUL-g groups above the
    accumulators hold scales (S), loads (F) and zero points (X).
    At TN = 16 and 32, fp16 scales and nibble zero points are handled in one SEW-16 phase, the slides
    included (8 e16 lanes = 4 e32 ones), so fp16 costs fp32's fold plus the one vfwcvt."""
    tn = spec.tile_n
    asym, blksum, nibbles = spec.zero_point == "asymmetric", spec.zero_point == "blksum", zp_nibbles(spec)
    g = gemv_fold_lmul(tn)
    D = row[0]
    assert row == tuple(range(D, D + 2 * len(row), 2)) and D % g == 0, "gemv accumulators are consecutive pairs"
    S, F, X = _gemv_fold_groups(spec, row)

    def vs(sew: int, lanes: int = tn) -> AsmOp:  # vsetivli takes at most 31; 32 lanes are VLMAX at these LMULs
        lmul = lmul_name(g * sew * lanes // tn, 32)
        return AsmOp("vset", f"vsetivli zero, {lanes}, e{sew}, {lmul}, ta, ma" if lanes < 32 else f"vsetvli t0, zero, e{sew}, {lmul}, ta, ma")

    def gather(sew: int) -> list[AsmOp]:
        shift = 4 * 32 // sew  # lanes of 4 e32 values
        ops = [AsmOp("vslideup", f"vslideup.vi v{row[j]}, v{row[j + 1]}, {shift}", f"cols {4 * j}..{4 * j + 7}")
               for j in range(0, len(row) - 1, 2)]
        return ops + [AsmOp("vmv", f"vmv1r.v v{D + j // 2}, v{row[j]}") for j in range(2, len(row), 2)]

    fp16, a16 = spec.scale_type == "fp16", spec.a_scale_type == "fp16"
    def widen(dst: int) -> AsmOp:  # the fp16 B scales at F to fp32 (a16: times the row's NaN-boxed fp16 scale, exact)
        return (AsmOp("vfwmul", f"vfwmul.vf v{dst}, v{F}, ft0", "scale_b * scale_a, exact in fp32") if a16
                else AsmOp("vfwcvt", f"vfwcvt.f.f.v v{dst}, v{F}", "widened to fp32"))

    ops = [AsmOp("flw", "flw ft0, 0(%[sa])", "A scale" + (" (fp16, NaN-boxed)" if a16 else "")),
           AsmOp("flw", "flw ft1, 0(%[as])", "A block sum") if blksum else AsmOp("lw", "lw t2, 0(%[as])", "A block sum")]
    if not (asym or blksum):
        ops.append(AsmOp("mul", "mul t2, t2, %[zpc]", "zp * sum_a"))
    zp = None  # the e32 zero points, once widened
    phase16 = tn in (16, 32) and (fp16 or nibbles)
    if phase16:
        ops += [vs(16)] + gather(16)
        if fp16:
            ops += [AsmOp("vle16", f"vle16.v v{F}, (%[sb])", "B fp16 scales"), widen(S)]
        if asym:
            ops.append(AsmOp("vle8", f"vle8.v v{X}, (%[zp])", "B zero points" + (", two per byte" if nibbles else "")))
        if nibbles:
            h = tn // 2
            ops += [AsmOp("vzext", f"vzext.vf2 v{F}, v{X}"), AsmOp("vsrl", f"vsrl.vi v{X}, v{F}, 4", f"cols {h}..{tn - 1}"),
                    AsmOp("vand", f"vand.vi v{F}, v{F}, 15", f"cols 0..{h - 1}"), AsmOp("vslideup", f"vslideup.vi v{F}, v{X}, {h}")]
        ops.append(vs(32))
        if nibbles:
            ops.append(AsmOp("vzext", f"vzext.vf2 v{X}, v{F}"))
            zp = X
        elif asym:
            ops.append(AsmOp("vzext", f"vzext.vf4 v{F}, v{X}"))
            zp = F
    else:
        if a16:  # first, into X (which this branch leaves alone), so that the SEW-16 phase costs no extra vset
            ops += [vs(16), AsmOp("vle16", f"vle16.v v{F}, (%[sb])", "B fp16 scales"), widen(X)]
        if len(row) > 1:
            ops += [AsmOp("vset", "vsetivli zero, 8, e32, m1, ta, ma")] + gather(32)
        if asym and nibbles:
            h = tn // 2
            ops += [vs(8, h), AsmOp("vle8", f"vle8.v v{F}, (%[zp])", "B zero points, two per byte"),
                    AsmOp("vsrl", f"vsrl.vi v{S}, v{F}, 4", f"cols {h}..{tn - 1}"), AsmOp("vand", f"vand.vi v{F}, v{F}, 15", f"cols 0..{h - 1}"),
                    vs(8), AsmOp("vslideup", f"vslideup.vi v{F}, v{S}, {h}")]
        elif asym:
            ops += [vs(8), AsmOp("vle8", f"vle8.v v{F}, (%[zp])", "B zero points")]
        ops.append(vs(32))
        if asym:
            ops.append(AsmOp("vzext", f"vzext.vf4 v{S}, v{F}"))
            zp = S
    if asym:
        ops.append(AsmOp("vnmsac", f"vnmsac.vx v{D}, t2, v{zp}", "dot -= zp * sum_a"))
    elif not blksum:
        ops.append(AsmOp("vsub", f"vsub.vx v{D}, v{D}, t2", "dot -= zp * sum_a"))
    ops.append(AsmOp("vfcvt", f"vfcvt.f.x.v v{D}, v{D}"))
    if fp16 and not phase16 and not a16:
        ops += [vs(16), AsmOp("vle16", f"vle16.v v{F}, (%[sb])", "B fp16 scales"), widen(S), vs(32)]
    elif not fp16:
        ops.append(AsmOp("vle32", f"vle32.v v{S}, (%[sb])", "B scales"))
    if not a16:
        ops.append(AsmOp("vfmul", f"vfmul.vf v{S}, v{S}, ft0", "scale_b * scale_a"))
    P = X if a16 and not phase16 else S  # the scale products
    if facc is not None:  # in registers across blocks (blksum kernels never are)
        return tuple(ops + [AsmOp("vfmacc", f"vfmacc.vv v{facc}, v{D}, v{P}", "the row's fp32 accumulators")])
    ops += [AsmOp("vle32", f"vle32.v v{F}, (%[facc])"), AsmOp("vfmacc", f"vfmacc.vv v{F}, v{D}, v{P}")]
    if blksum:
        ops += [AsmOp("vle32", f"vle32.v v{S}, (%[bs])", "B block sums"),
                AsmOp("vfmacc", f"vfmacc.vf v{F}, ft1, v{S}", "+ blksum_a * blksum_b")]
    ops.append(AsmOp("vse32", f"vse32.v v{F}, (%[facc])"))
    return tuple(ops)
