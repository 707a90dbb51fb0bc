"""The k loop of an IME tile (non-staged kernels): the zero-point prologue before it, and one iteration:
A tile loads, B loads and unpacking (minus the zero points), the vmadots, the A pointer step."""

from __future__ import annotations

from ...spec import KernelSpec
from .asm import AsmOp, lmul_name
from .encoding import encode_vmadot, mnemonic
from .registers import Registers, Shape, grouped

# A int8 signed x B raw unsigned codes, zero points folded in the epilogue (8-bit, and 4-bit gemv);
# signed x signed when 4-bit gemm kernels subtract the zero points from the unpacked B (rules.zero_points_in_b)
# and for 8-bit MLAS kernels, which store B as signed q - 128 and fold zero points through MLAS's block
# sums (plan.KernelPlan.blksum).
IME_SIGNEDNESS = {False: "su", True: "ss"}


def spread_twice(spec: KernelSpec, r: Registers, pack) -> bool:
    """Paired runs of a tile of at most 8 columns in imegen's packed B: one stride-0 load reads the tile's
    TN zero-point bytes twice, so the spread covers raw + low runs without a copy. The load's element is
    TN bytes: matmul refuses a packed B that is not 8-byte aligned, and every chunk part is a multiple of it."""
    return (r.paired_b and r.zpb is not None and spec.tile_n in (4, 8) and spec.scales != "ort"
            and all(n % spec.tile_n == 0 for n in (pack.data_bytes, pack.scale_bytes, pack.zp_bytes)))


def _vl(n: int, sew: str, lmul: str) -> str:
    """vsetivli for n elements (vsetvli at VLMAX when n does not fit its 5-bit immediate)."""
    return f"vsetivli zero, {n}, {sew}, {lmul}, ta, ma" if n < 32 else f"vsetvli t0, zero, {sew}, {lmul}, ta, ma"


def zero_point_prologue(spec: KernelSpec, s: Shape, r: Registers, pack) -> tuple[AsmOp, ...]:
    """Before the loop: the tile's zero points spread over the unpacked B layout (byte 8c+j of a 4-column
    B tile is column c), so that `B - zp` is one vsub per register and vmadot runs signed."""
    if r.zpb is None:
        return ()
    twice = spread_twice(spec, r, pack)
    raw = r.b_reg[0][0]
    if twice:
        ops = [AsmOp("vset", f"vsetivli zero, 2, e{8 * spec.tile_n}, m1, ta, ma"),
               AsmOp(f"vlse{8 * spec.tile_n}", f"vlse{8 * spec.tile_n}.v v{raw}, (%[zp]), zero",
                     "B zero points of the tile's columns, twice")]
    else:
        ops = [AsmOp("vset", _vl(spec.tile_n, "e8", "m1")), AsmOp("vle8", f"vle8.v v{raw}, (%[zp])", "B zero points of the tile's columns")]
    if grouped(r.zpb, s.na) or s.na == 1:
        return (*ops, *_spread_by_multiply(spec, s, r, twice))
    return (*ops, *_spread_by_gather(s, r))


def _spread_by_multiply(spec: KernelSpec, s: Shape, r: Registers, twice: bool) -> list[AsmOp]:
    """Column c's zero point fills bytes 8c..8c+7 of the run: zero-extend each to 64 bits, times 0x0101..01."""
    lanes, m = (2 * spec.tile_n, 2 * s.na) if twice else (spec.tile_n, s.na)
    ops = [AsmOp("vset", _vl(lanes, "e64", f"m{m}")), AsmOp("vzext", f"vzext.vf8 v{r.zpb}, v{r.b_reg[0][0]}", "one column per 64-bit lane"),
           AsmOp("vmul", f"vmul.vx v{r.zpb}, v{r.zpb}, %[rep]", "zero point in all 8 bytes of its column")]
    if r.paired_b and not twice:
        ops.append(AsmOp("vmv", f"vmv{s.na}r.v v{r.zpb + s.na}, v{r.zpb}", "again, next to itself: one vsub per raw + low run"))
    return ops


def _spread_by_gather(s: Shape, r: Registers) -> list[AsmOp]:
    """An unaligned run: each register's bytes gathered from the tile's zero points by a byte -> column table."""
    raw, idx = r.b_reg[0][0], r.b_lo[0][0]
    ops = [AsmOp("vset", "vsetvli t0, zero, e8, m1, ta, ma")]
    for ni in range(s.na):
        ops += [AsmOp("addi", f"addi t1, %[zpi], {32 * ni}"), AsmOp("vle8", f"vle8.v v{idx}, (t1)", "byte -> column"),
                AsmOp("vrgather", f"vrgather.vv v{r.zpb + ni}, v{raw}, v{idx}", f"zero points, cols {4 * ni}..{4 * ni + 3}")]
    return ops


class _Body:
    """The instructions of one loop iteration, and the e8 LMUL they leave set (the template enters the
    loop at e8, m1; every iteration ends there)."""

    def __init__(self):
        self.ops: list[AsmOp] = []
        self.lmul: int | None = 1

    def at_lmul(self, lmul: int | None) -> None:
        """vsetvli e8 (vl = VLMAX) at `lmul` unless already there; None: something else was set."""
        if lmul is not None and lmul != self.lmul:
            self.ops.append(AsmOp("vset", f"vsetvli t0, zero, e8, {lmul_name(lmul)}, ta, ma"))
        self.lmul = lmul

    def load(self, reg: int, ptr: str, offset: int, what: str) -> None:
        if offset:
            self.ops.append(AsmOp("addi", f"addi t1, {ptr}, {offset}"))
            self.ops.append(AsmOp("vle8", f"vle8.v v{reg}, (t1)", what))
        else:
            self.ops.append(AsmOp("vle8", f"vle8.v v{reg}, ({ptr})", what))


def _load_a(spec: KernelSpec, s: Shape, r: Registers, body: _Body) -> None:
    if s.gemv:
        for q, reg in enumerate(r.a_reg):
            body.load(reg, "%[a]", q * 32, f"A row, k-steps {4 * q}..{4 * q + 3}")
    elif spec.abi == "mlas":  # A rows lie lda bytes apart (8-byte aligned): one strided 4 x 8-byte load per tile
        body.ops.append(AsmOp("vset", "vsetivli zero, 4, e64, m1, ta, ma", "4 rows x 8 bytes"))
        for k in range(s.ku):
            for mi in range(s.ma):
                body.ops.append(AsmOp("addi", f"addi t1, %[a], {k * 8}"))
                body.ops.extend([AsmOp("add", "add t1, t1, %[lda4]")] * mi)
                body.ops.append(AsmOp("vlse64", f"vlse64.v v{r.a_reg[k][mi]}, (t1), %[lda]", f"A rows {4 * mi}..{4 * mi + 3}, k-step {k}"))
        body.lmul = None
    elif grouped(r.a_reg[0][0], s.a_group):  # a whole-register load: needs no vtype
        first = r.a_reg[0][0]
        body.ops.append(AsmOp("vle8", f"vl{s.a_group}re8.v v{first}, (%[a])",
                              f"A: {s.ku} k-steps x {s.ma} tiles, v{first}-v{first + s.a_group - 1}"))
    else:
        for k in range(s.ku):
            for mi in range(s.ma):
                body.load(r.a_reg[k][mi], "%[a]", (k * s.ma + mi) * 32, f"A rows {4 * mi}..{4 * mi + 3}, k-step {k}")


def _load_b_group(spec: KernelSpec, s: Shape, r: Registers, body: _Body, g: int) -> None:
    """Group g's B tiles: one run of na registers when aligned (LMUL na), else register by register;
    4-bit codes unpacked into high and low nibbles, minus the zero points where the loop subtracts them."""
    aligned = grouped(r.b_reg[g][0], s.na) and (r.b_lo is None or grouped(r.b_lo[g][0], s.na))
    for ni, n in [(0, s.na)] if aligned else [(ni, 1) for ni in range(s.na)]:
        raw = r.b_reg[g][ni]
        if ni:
            body.ops.append(AsmOp("addi", f"addi t1, %[b], {ni * 32}"))
        body.ops.append(AsmOp("vle8", f"vl{n}re8.v v{raw}, ({'t1' if ni else '%[b]'})",  # whole registers: no vtype
                              f"B cols {4 * ni}..{4 * (ni + n) - 1}, group {g}"))
        if spec.bits == 4:
            _unpack(spec, s, r, body, raw, r.b_lo[g][ni], ni, n)
    if r.paired_b:  # one instruction over the raw + low run
        body.at_lmul(2 * s.na)
        first = r.b_reg[g][0]
        body.ops.append(AsmOp("vsub", f"vsub.vv v{first}, v{first}, v{r.zpb}", "- zero point, high and low nibbles") if r.zpb is not None
                        else AsmOp("vadd", f"vadd.vi v{first}, v{first}, -{1 << (spec.bits - 1)}", "- zero point, high and low nibbles"))
    body.ops.append(AsmOp("add", "add %[b], %[b], %[bstride]"))


def _unpack(spec: KernelSpec, s: Shape, r: Registers, body: _Body, raw: int, lo: int, ni: int, n: int) -> None:
    body.at_lmul(n)
    body.ops.append(AsmOp("vand", f"vand.vi v{lo}, v{raw}, 15", "low nibbles"))
    body.ops.append(AsmOp("vsrl", f"vsrl.vi v{raw}, v{raw}, 4", "high nibbles"))
    if r.paired_b:
        return  # the group's zero points go in one instruction (_load_b_group)
    if r.zpb is not None:
        body.ops.extend(AsmOp("vsub", f"vsub.vv v{x}, v{x}, v{r.zpb + ni}", "- zero point") for x in (lo, raw))
    elif s.zp_in_b:
        body.ops.extend(AsmOp("vadd", f"vadd.vi v{x}, v{x}, -{1 << (spec.bits - 1)}", "- zero point") for x in (lo, raw))


def _vmadots(spec: KernelSpec, s: Shape, r: Registers, body: _Body) -> None:
    body.at_lmul(1)  # vmadot runs at e8, m1, vl = 32
    sign = IME_SIGNEDNESS[bool(s.zp_in_b) or spec.zero_point == "blksum"]
    for k in range(s.ku):
        g, half = (k // 2, k % 2) if spec.bits == 4 else (k, 0)
        for mi in range(s.ma):
            vs1, slide = (r.a_reg[k // 4], k % 4) if s.gemv else (r.a_reg[k][mi], 0)
            for ni in range(s.na):
                vs2 = r.b_reg[g][ni] if (spec.bits == 8 or half) else r.b_lo[g][ni]
                vd = r.acc[mi][ni]
                word = encode_vmadot(vd, vs1, vs2, signedness=sign, slide=slide)
                body.ops.append(AsmOp("vmadot", f".word 0x{word:08x}", f"{mnemonic(sign, slide)} v{vd}, v{vs1}, v{vs2}"))


def a_step(spec: KernelSpec, s: Shape) -> int:
    """Bytes the A pointer advances per iteration."""
    return s.ku * 8 if (s.gemv or spec.abi == "mlas") else s.ku * s.ma * 32


def loop_body(spec: KernelSpec, s: Shape, r: Registers) -> tuple[AsmOp, ...]:
    body = _Body()
    _load_a(spec, s, r, body)
    for g in range(s.b_groups):
        _load_b_group(spec, s, r, body, g)
    _vmadots(spec, s, r, body)
    body.ops.append(AsmOp("addi", f"addi %[a], %[a], {a_step(spec, s)}"))
    return tuple(body.ops)
