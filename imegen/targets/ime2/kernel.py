"""The asm statement of an IME2 tile and block (templates/micro_ime2.c.j2 places it): the int32 accumulators
zeroed, the k loop (A tiles, B tiles unpacked from 4 bits, vmadotsu), and the accumulators stored for the
fold after it, which scales them and corrects the zero points. The simplest correct form: one asm statement
per (tile, block), the fold in C with RVV intrinsics where the compiler has them (docs/ime2-isa.md §10.3).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...spec import KernelSpec
from ..base import VECTOR_REGISTERS, default_zero_point
from ..ime.asm import MAX_UNROLLED_ITERATIONS, AsmOp, ImePlan, acc_groups, zero_accumulators
from .encoding import encode_vmadot, encode_vmadot_hp, mnemonic
from .rules import A_TILE_BYTES, K_STEP, SLIDES, a_registers, tiles

# A signed int8 codes x B's raw unsigned codes (0..15 or 0..255): the fold subtracts zp * sum(a). A symmetric
# 4-bit gemv with the in-register fold reads B signed instead (signed_b): no zero point, no sum(a).
SIGNEDNESS = "su"
SIGNED_B_XOR = 0x88  # both nibbles' top bit flipped: a code q read as a signed 4-bit number is then q - 8
ENTRY_VTYPE = "vsetvli t0, zero, e8, m1, ta, ma"  # vmadot: LMUL 1, vl = VLMAX (docs/ime2-isa.md §5)
GEMV_SLIDE_BYTES = SLIDES * K_STEP  # A bytes between a gemv row's consecutive A loads


@dataclass(frozen=True)
class Registers:
    acc: tuple[tuple[int, ...], ...]  # [mi][ni] -> even vd of the int32 accumulator pair
    a: list  # gemm: [k-step][mi]; gemv: [load] (an even pair when slides read it)
    raw: list[list[int]]  # [group][ni]: B as loaded (4-bit: its high nibbles after the unpack)
    low: list[list[int]] | None  # [group][ni]: 4-bit low nibbles
    used: int  # v0..v(used - 1)


def b_groups(spec: KernelSpec) -> int:
    """B loads per iteration: one 128-byte register per B tile holds one 16-k step (8-bit) or two (4-bit)."""
    return spec.k_unroll // 2 if spec.bits == 4 else spec.k_unroll


def grouped(first: int, n: int) -> bool:
    """Is v{first}.. an aligned register group of n (one LMUL-n instruction, or one whole-register load)?"""
    return n in (2, 4, 8) and first % n == 0


def allocate(spec: KernelSpec, reserve: int = 0) -> Registers:
    """Upwards from v0: accumulator pairs, `reserve` registers (the in-register gemm fold's fp32 accumulators),
    A, then per B group its raw and (4-bit) low-nibble registers, each run aligned to its size where the
    registers allow (one load and one unpack per run), else packed."""
    aligned = _allocate(spec, align=True, reserve=reserve)
    return aligned if aligned.used <= VECTOR_REGISTERS else _allocate(spec, align=False, reserve=reserve)


def _allocate(spec: KernelSpec, align: bool, reserve: int = 0) -> Registers:
    ma, na = tiles(spec)
    acc = tuple(tuple(2 * (mi * na + ni) for ni in range(na)) for mi in range(ma))
    first_a = 2 * ma * na + reserve  # even: a gemv pair starts on an even register
    if spec.tile_m == 1:
        step = 1 if spec.k_unroll == 1 else 2
        a: list = [first_a + step * q for q in range(a_registers(spec) // step)]
    else:
        a = [[first_a + k * ma + mi for mi in range(ma)] for k in range(spec.k_unroll)]
    nxt = first_a + a_registers(spec)

    def run() -> list[int]:
        nonlocal nxt
        if align and grouped(0, na):
            nxt = -(-nxt // na) * na
        first, nxt = nxt, nxt + na
        return [first + ni for ni in range(na)]

    groups = b_groups(spec)
    raw = [run() for _ in range(groups)]
    low = [run() for _ in range(groups)] if spec.bits == 4 else None
    return Registers(acc, a, raw, low, nxt)


def _load(reg: int, ptr: str, offset: int, what: str, n: int = 1) -> list[AsmOp]:
    """Whole-register load(s) of n registers from ptr + offset (no vtype needed)."""
    if not offset:
        return [AsmOp("vle8", f"vl{n}re8.v v{reg}, ({ptr})", what)]
    return [AsmOp("addi", f"addi t1, {ptr}, {offset}"), AsmOp("vle8", f"vl{n}re8.v v{reg}, (t1)", what)]


def _load_a(spec: KernelSpec, r: Registers) -> list[AsmOp]:
    if spec.tile_m == 1:
        return [op for q, reg in enumerate(r.a) for op in _load(
            reg, "%[a]", q * GEMV_SLIDE_BYTES, f"A row, k-steps {SLIDES * q}.. (row 0 of vmadot .. vmadot3)")]
    ma, _ = tiles(spec)
    first, n = r.a[0][0], spec.k_unroll * ma  # the iteration's A tiles lie back to back in the workspace
    if grouped(first, n):
        return _load(first, "%[a]", 0, f"A: {spec.k_unroll} k-steps x {ma} tiles, v{first}-v{first + n - 1}", n)
    return [op for k in range(spec.k_unroll) for mi in range(ma) for op in _load(
        r.a[k][mi], "%[a]", (k * ma + mi) * A_TILE_BYTES, f"A rows {8 * mi}..{8 * mi + 7}, k-step {k}")]


def signed_b(spec: KernelSpec) -> bool:
    """A symmetric 4-bit gemv with the in-register fold multiplies B signed: each nibble q becomes 16 (q - 8) in
    its byte (the zero point 8 taken out in the unpack, x16 so that no shift back is needed), so a block's dot
    needs neither zp x sum(a) nor a zero-point load; the tile end divides the fp32 sums by 16 (exact)."""
    return (spec.tile_m == 1 and spec.bits == 4 and spec.zero_point == "symmetric"
            and gemv_fold_registers(spec) is not None)


def signedness(spec: KernelSpec) -> str:
    return "ss" if signed_b(spec) else SIGNEDNESS


def _unpack(spec: KernelSpec, low: int, raw: int) -> list[AsmOp]:
    """4-bit codes in v{raw} into the group's two 16-k steps: low nibbles into v{low}, high ones in place."""
    if signed_b(spec):
        return [AsmOp("vxor", f"vxor.vx v{raw}, v{raw}, t2",
                      f"nibbles ^ 8: q - 8 as signed 4-bit (t2 = {SIGNED_B_XOR:#x})"),
                AsmOp("vsll", f"vsll.vi v{low}, v{raw}, 4", "16 (q - 8) of the low nibbles: the first 16-k step"),
                AsmOp("vand", f"vand.vi v{raw}, v{raw}, -16", "16 (q - 8) of the high nibbles: the second")]
    return [AsmOp("vand", f"vand.vi v{low}, v{raw}, 15", "low nibbles: the first 16-k step"),
            AsmOp("vsrl", f"vsrl.vi v{raw}, v{raw}, 4", "high nibbles: the second")]


def _load_b(spec: KernelSpec, r: Registers, g: int) -> list[AsmOp]:
    """Group g's B tiles (the panel's B tiles of one k group lie back to back): one whole-register load per
    aligned run, else one per register; 4-bit codes split into low (k-step 2g) and high (2g + 1) nibbles."""
    raw, low, na = r.raw[g], (r.low[g] if r.low else None), len(r.raw[g])
    whole = grouped(raw[0], na) and (low is None or grouped(low[0], na))
    ops: list[AsmOp] = []
    for ni, n in [(0, na)] if whole else [(ni, 1) for ni in range(na)]:
        ops += _load(raw[ni], "%[b]", ni * A_TILE_BYTES, f"B cols {8 * ni}..{8 * (ni + n) - 1}, group {g}", n)
        if low is not None:
            if n > 1:
                ops.append(AsmOp("vset", f"vsetvli t0, zero, e8, m{n}, ta, ma", "unpack the run at once"))
            ops += _unpack(spec, low[ni], raw[ni])
            if n > 1:
                ops.append(AsmOp("vset", ENTRY_VTYPE, "back to vmadot's vtype"))
    ops.append(AsmOp("add", "add %[b], %[b], %[bstride]", "the panel's next k group"))
    return ops


def _vmadots(spec: KernelSpec, r: Registers) -> list[AsmOp]:
    ops, sign = [], signedness(spec)
    for k in range(spec.k_unroll):
        g, high = (k // 2, k % 2) if spec.bits == 4 else (k, 0)
        for mi, row in enumerate(r.acc):
            vs1, slide = (r.a[k // SLIDES], k % SLIDES) if spec.tile_m == 1 else (r.a[k][mi], 0)
            for ni, vd in enumerate(row):
                vs2 = r.raw[g][ni] if (spec.bits == 8 or high) else r.low[g][ni]
                word = encode_vmadot(vd, vs1, vs2, signedness=sign, slide=slide)
                ops.append(AsmOp("vmadot", f".word 0x{word:08x}", f"{mnemonic(sign, slide=slide)} v{vd}, v{vs1}, v{vs2}"))
    return ops


def a_step(spec: KernelSpec) -> int:
    """Bytes the A pointer advances per iteration."""
    ma, _ = tiles(spec)
    return spec.k_unroll * K_STEP if spec.tile_m == 1 else spec.k_unroll * ma * A_TILE_BYTES


def loop_body(spec: KernelSpec, r: Registers) -> tuple[AsmOp, ...]:
    ops = _load_a(spec, r)
    for g in range(b_groups(spec)):
        ops += _load_b(spec, r, g)
    ops += _vmadots(spec, r)
    ops += _add_imm("%[a]", a_step(spec))
    return tuple(ops)


def store_accumulators(n_regs: int) -> tuple[AsmOp, ...]:
    """The int32 accumulators v0..v(n_regs - 1) to %[dots], whole registers: pair (mi, ni) lands as its 8x8
    tile row-major (rows 0-3 in vd, 4-7 in vd + 1) at int32 (mi * na + ni) * 64."""
    ops = []
    for first, g in acc_groups(n_regs):
        ops += _store(first, g)
    return tuple(ops)


def _store(first: int, g: int) -> list[AsmOp]:
    what = f"int32 dots v{first}-v{first + g - 1}"
    if not first:
        return [AsmOp("vse8", f"vs{g}r.v v{first}, (%[dots])", what)]
    return [AsmOp("addi", f"addi t1, %[dots], {first * A_TILE_BYTES}"), AsmOp("vse8", f"vs{g}r.v v{first}, (t1)", what)]


def _b_advance_to_block_end(body: tuple[AsmOp, ...], iterations: int, b_walk: int,
                            b_stride: int) -> tuple[tuple[AsmOp, ...], int]:
    """A one-iteration block's last B advance (nothing reads %[b] after it) left to the block's end, which
    moves the pointer to the next chunk anyway: (body, bytes the body walks B)."""
    last = max(i for i, op in enumerate(body) if "%[b]" in op.text)
    if iterations != 1 or body[last].text != "add %[b], %[b], %[bstride]":
        return body, b_walk
    return body[:last] + body[last + 1:], b_walk - b_stride


def gemv_compact_rows(spec: KernelSpec, r: Registers) -> tuple[AsmOp, ...]:
    """gemv: row 0 of each vmadot tile (its 8 useful dots; rows 1-7 pair A's later k-steps with this B) slid
    next to each other, four tiles to an e32 register (column j at lane j % 32 of the register of j / 32),
    and only those registers stored: the fold then loads the row's TN dots contiguously."""
    ops: list[AsmOp] = []
    row = r.acc[0]
    for first in range(0, len(row), 4):
        for q in range(1, min(4, len(row) - first)):
            vl = 8 * (q + 1)
            ops.append(AsmOp("vset", f"vsetivli t0, {vl}, e32, m1, tu, ma" if vl < 32 else "vsetvli t0, zero, e32, m1, tu, ma",
                             f"lanes {8 * q}..{vl - 1}, the rest kept"))
            ops.append(AsmOp("vslide", f"vslideup.vi v{row[first]}, v{row[first + q]}, {8 * q}",
                             f"columns {8 * (first + q)}..{8 * (first + q) + 7}"))
        ops += _store_one(row[first], (first // 4) * A_TILE_BYTES)
    return tuple(ops)


def _store_one(reg: int, offset: int) -> list[AsmOp]:
    what = f"dots of columns from {offset // 4}"
    if not offset:
        return [AsmOp("vse8", f"vs1r.v v{reg}, (%[dots])", what)]
    return [AsmOp("addi", f"addi t1, %[dots], {offset}"), AsmOp("vse8", f"vs1r.v v{reg}, (t1)", what)]


def dot_at(spec: KernelSpec) -> str:
    """C expr in i, j: where output (i, j)'s int32 dot lies in the stored accumulators (store_accumulators)."""
    _, na = tiles(spec)
    return f"((i / 8) * {na} + j / 8) * 64 + (i % 8) * 8 + j % 8"


def facc_at(spec: KernelSpec) -> str:
    """C expr in i, j: where output (i, j) accumulates in the tile's fp32 accumulators: a gemv row's TN
    side by side; a gemm tile's in the dots' own layout, so that the vector fold runs over both at once."""
    return "j" if spec.tile_m == 1 else dot_at(spec)


def ime2_plan(spec: KernelSpec, pack) -> ImePlan:
    """The asm statement of a (tile, block): pack is the kernel's packed-B layout (plan.PackLayout)."""
    if spec.hp_blocks:
        return hp_plan(spec)
    ma, na = tiles(spec)
    r = allocate(spec)
    iterations = spec.block // (K_STEP * spec.k_unroll)
    b_stride = spec.panel * K_STEP  # a panel's B tiles for one k group (16 k of 8-bit codes, 32 of 4-bit)
    acc_zero = (*zero_accumulators(2 * ma * na, on_vfp=False), AsmOp("vset", ENTRY_VTYPE, "vmadot: e8, LMUL 1, vl = 128"))
    b_walk = iterations * b_groups(spec) * b_stride
    g = gemv_fold_registers(spec)
    if gemm_zp_in_loop(spec):  # B's zero points off in the k loop; its one iteration leaves B's pointer alone
        in_regs = dict(facc_regs=((G_FACC,),), tile_start=zp_tile_start(spec), acc_zero=zp_block_zero(spec),
                       fold=zp_free_fold(spec), block_end=gemm_block_end(spec, pack, 0), tile_end=gemm_tile_end(spec),
                       index16=zp_lane_tables(), clobbers=tuple(f"v{x}" for x in range(VECTOR_REGISTERS)))
        body = zp_loop_body(spec, default_zero_point(spec))
    elif gemm_fold_in_registers(spec):
        r = allocate(spec, reserve=8)
        body, b_walk = _b_advance_to_block_end(loop_body(spec, r), iterations, b_walk, b_stride)
        entry = () if any(op.kind == "vset" for op in body) else (AsmOp("vset", ENTRY_VTYPE, "vmadot: LMUL 1"),)
        in_regs = dict(facc_regs=((G_FACC,),), tile_start=gemm_tile_start(default_zero_point(spec)),
                       acc_zero=(*gemm_block_zero(), *entry),
                       fold=gemm_fold(spec, default_zero_point(spec)), block_end=gemm_block_end(spec, pack, b_walk),
                       tile_end=gemm_tile_end(spec), index16=gemm_lane_tables(),
                       clobbers=tuple(f"v{x}" for x in range(VECTOR_REGISTERS)))
    elif g is not None:  # one asm statement per tile: the block loop and the fold in registers
        body, b_walk = _b_advance_to_block_end(loop_body(spec, r), iterations, b_walk, b_stride)
        # the fold leaves e32, LMUL 1 (vmadot's too); an unpack at the entry vtype needs e8
        entry = () if spec.bits == 8 or any(op.kind == "vset" for op in body) else (AsmOp("vset", ENTRY_VTYPE, "the unpack: e8"),)
        in_regs = dict(facc_regs=((g.facc,),), tile_start=gemv_tile_start(spec, g), acc_zero=entry,
                       fold=gemv_fold(spec, g, default_zero_point(spec)), block_end=gemv_block_end(spec, pack, b_walk),
                       tile_end=gemv_tile_end(spec, g),
                       index16=compact_mask(spec), clobbers=tuple(f"v{x}" for x in range(g.dots + 4)))
    else:
        body = loop_body(spec, r)
        in_regs = dict(fold=gemv_compact_rows(spec, r) if spec.tile_m == 1 else store_accumulators(2 * ma * na),
                       clobbers=tuple(f"v{x}" for x in range(r.used)))
    in_regs.setdefault("acc_zero", acc_zero)
    return ImePlan(
        ma=ma, na=na, acc_regs=r.acc, prologue=(), body=body, **in_regs,
        iterations_per_block=iterations, a_bytes_per_iteration=a_step(spec), b_stride=b_stride,
        b_walk=iterations * b_groups(spec) * b_stride,
        vmadots_per_tile_block=(spec.block // K_STEP) * ma * na,
        facc_floats=spec.tile_n if spec.tile_m == 1 else ma * na * 64, facc_at=facc_at(spec),
        unrolled=iterations <= MAX_UNROLLED_ITERATIONS, entry_vset=False,
        k_step=K_STEP, a_tile_bytes=A_TILE_BYTES)



# --- gemv: the whole block loop in one asm statement, the fold in registers ---------------------------------

GEMV_FOLD_LANES = 32  # one e32 register at VLEN 1024: the row's TN <= 32 results, compacted dots, factors


@dataclass(frozen=True)
class GemvRegisters:
    facc: int  # the row's fp32 accumulators (e32, one register)
    mask: int  # the lanes of row 0 of every vmadot tile in the e32 view of v0..v7 (vcompress)
    dots: int  # an aligned group of 8: vcompress's destination; its lanes 0..TN-1 = the block's dots
    # dots + 1, + 2, + 3: the zero points' bytes (fp16 scales: the B scales as loaded), widened to int32, the B
    # scales (as fp32) times the A scale


def gemv_fold_registers(spec: KernelSpec) -> GemvRegisters | None:
    """Where gemv_tile_asm keeps its fold, after the k loop's registers; None when it does not apply: more than
    32 columns (their compacted dots would not fit one e32 register), ORT's own scale arrays, or too few
    registers left."""
    if spec.tile_m != 1 or spec.tile_n > GEMV_FOLD_LANES or spec.scales == "ort":
        return None
    first = max(allocate(spec).used, 8)  # v0..v7 are zeroed as one group (the k loop's A and B reload anyway)
    dots = -(-(first + 2) // 8) * 8
    return GemvRegisters(facc=first, mask=first + 1, dots=dots) if dots + 8 <= VECTOR_REGISTERS else None


def encode_vfwcvt_f_f(vd: int, vs2: int) -> int:
    """`vfwcvt.f.f.v vd, vs2` (unmasked; Zvfhmin, which the A100 has as RVA23 requires) as a word: the kernels
    build with plain rv64gcv, which GCC 12's assembler knows no FP16 vector instruction of."""
    return 0b010010 << 26 | 1 << 25 | vs2 << 20 | 0b01100 << 15 | 0b001 << 12 | vd << 7 | 0b1010111


def compact_mask(spec: KernelSpec) -> tuple[int, ...]:
    """vcompress's mask as bytes (lane L: bit L % 8 of byte L / 8) over the e32 view of v0..v7: lanes 0..7 of
    each accumulator pair's vd, row 0 of its vmadot tile (tile ni's vd is v(2 ni): lanes 64 ni..)."""
    mask = [0] * (8 * VECTOR_REGISTERS // 8)
    for ni in range(tiles(spec)[1]):
        mask[ni * 8] = 0xFF
    return tuple(mask[:32])


def _add_imm(reg: str, value: int, what: str = "") -> list[AsmOp]:
    if not value:
        return []
    if -2048 <= value < 2048:
        return [AsmOp("addi", f"addi {reg}, {reg}, {value}", what)]
    return [AsmOp("li", f"li t1, {value}"), AsmOp("add", f"add {reg}, {reg}, t1", what)]  # past addi's 12 bits


def gemv_fold(spec: KernelSpec, g: GemvRegisters, zp_default: int) -> tuple[AsmOp, ...]:
    """After a block's k loop: its TN dots compacted into v{dots} (vcompress), then, at e32 LMUL 1 (32 lanes),
    facc += float(dot - zp * sum(a)) * (b_scale * a_scale): the difference is exact in int32 and fp32
    (|.| <= block x 128 x 255 < 2^24), the scaling rounds twice, as the C fold does. Signed B (signed_b) has no
    zero-point term: its dots are 16 x the block's (|.| <= block x 128 x 128 < 2^24, exact too). fp16 B scales
    are widened by vfwcvt (exact)."""
    d, z8, z32, sb = g.dots, g.dots + 1, g.dots + 2, g.dots + 3
    ops = [AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma", "the accumulators' e32 view"),
           AsmOp("vcompress", f"vcompress.vm v{d}, v0, v{g.mask}", "row 0 of each tile: the block's dots, column by column"),
           *_zero_accumulators_e32m8(spec, "for the next block")]
    if spec.scale_type == "fp16":
        ops += [AsmOp("vset", "vsetvli t0, zero, e16, mf2, ta, ma", "32 fp16 lanes"),
                AsmOp("vle16", f"vle16.v v{z8}, (%[sb])", "B's fp16 scales"),
                AsmOp("vfwcvt", f".word 0x{encode_vfwcvt_f_f(sb, z8):08x}",
                      f"vfwcvt.f.f.v v{sb}, v{z8}: as fp32, exact")]
    ops.append(AsmOp("vset", "vsetvli t0, zero, e32, m1, ta, ma", "the fold: 32 lanes (and vmadot's vtype: LMUL 1, vl = VLMAX)"))
    if spec.zero_point == "asymmetric":
        ops += [AsmOp("lw", "lw t2, 0(%[as])", "the row's code sum of the block"),
                AsmOp("vle8", f"vle8.v v{z8}, (%[zp])", "B's zero points"),
                AsmOp("vzext", f"vzext.vf4 v{z32}, v{z8}"),
                AsmOp("vnmsac", f"vnmsac.vx v{d}, t2, v{z32}", "- zp * sum(a)")]
    elif not signed_b(spec):
        shift = zp_default.bit_length() - 1
        ops += [AsmOp("lw", "lw t2, 0(%[as])", "the row's code sum of the block"),
                AsmOp("slli", f"slli t2, t2, {shift}", f"{zp_default} * sum(a)"),
                AsmOp("vsub", f"vsub.vx v{d}, v{d}, t2", "- zp * sum(a)")]
    ops.append(AsmOp("vfcvt", f"vfcvt.f.x.v v{d}, v{d}", "exact: below 2^24"))
    if spec.scale_type != "fp16":
        ops.append(AsmOp("vle32", f"vle32.v v{sb}, (%[sb])", "B's scales"))
    ops += [AsmOp("flw", "flw ft0, 0(%[sa])", "the row's A scale"),
            AsmOp("vfmul", f"vfmul.vf v{sb}, v{sb}, ft0"),
            AsmOp("vfmacc", f"vfmacc.vv v{g.facc}, v{d}, v{sb}", "facc += dot x scale")]
    return tuple(ops)


def _zero_accumulators_e32m8(spec: KernelSpec, what: str) -> list[AsmOp]:
    """The int32 accumulators (v0.., at most 8 registers for a gemv of <= 32 columns) = 0, under e32 LMUL 8: all
    of v0..v7, which holds nothing else live across blocks (gemv_fold_registers)."""
    return [AsmOp("vmv", "vmv.v.i v0, 0", f"int32 accumulators v0-v7 = 0, {what}")]


def gemv_block_end(spec: KernelSpec, pack, b_walk: int) -> tuple[AsmOp, ...]:
    """Every pointer to the next block (a's k loop has walked it already), then the block loop's branch: on
    until the A scale pointer reaches the tile's last block's."""
    data, scale, zp = ((pack.chunk_bytes,) * 3 if pack.inline else (pack.data_bytes, pack.scale_bytes, pack.zp_bytes))
    ops = [AsmOp("addi", "addi %[sa], %[sa], 4"),
           *([] if signed_b(spec) else [AsmOp("addi", "addi %[as], %[as], 4")]),
           *_add_imm("%[sb]", scale, "the next block's B scales")]
    if spec.zero_point == "asymmetric":
        ops += _add_imm("%[zp]", zp, "... zero points")
    ops += _add_imm("%[b]", data - b_walk, "... codes")
    ops += [AsmOp("bne", "bne %[sa], %[sa_end], 2b", "the next block")]
    return tuple(ops)


def gemv_tile_start(spec: KernelSpec, g: GemvRegisters) -> tuple[AsmOp, ...]:
    """vmadot runs under the fold's vtype (e32, LMUL 1, vl = VLMAX: docs/ime2-isa.md §5), so a block needs no
    vsetvli of its own but the 4-bit unpack's two."""
    signed = (AsmOp("li", f"li t2, {SIGNED_B_XOR}", "the signed unpack's nibble flip"),) if signed_b(spec) else ()
    return (*signed, AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma", "vlm reads VLMAX / 8 bytes: 32"),
            AsmOp("vlm", f"vlm.v v{g.mask}, (%[mask])", "row 0 of each tile (compact_mask)"),
            *_zero_accumulators_e32m8(spec, "for the first block"),
            AsmOp("vset", "vsetvli t0, zero, e32, m1, ta, ma"),
            AsmOp("vmv", f"vmv.v.i v{g.facc}, 0", "fp32 accumulators: +0.0f"))


def gemv_tile_end(spec: KernelSpec, g: GemvRegisters) -> tuple[AsmOp, ...]:
    """The row's results to C: plus C's (a later K chunk) or the bias (the first), cols of them; signed B's sums
    divided by 16 first (exact: a power of two)."""
    unscale = ((AsmOp("lui", "lui t1, 0x3d800", "1/16 as fp32"), AsmOp("fmv", "fmv.w.x ft0, t1"),
                AsmOp("vfmul", f"vfmul.vf v{g.facc}, v{g.facc}, ft0", "the dots were 16 x"))
               if signed_b(spec) else ())
    return (AsmOp("vset", "vsetvli t0, %[cols], e32, m1, ta, ma", "the tile's columns"), *unscale,
            AsmOp("beqz", "beqz %[addend], 3f", "nothing to add"),
            AsmOp("vle32", f"vle32.v v{g.dots}, (%[addend])", "C (a later K chunk) or the bias"),
            AsmOp("vfadd", f"vfadd.vv v{g.facc}, v{g.facc}, v{g.dots}"),
            AsmOp("label", "3:"),
            AsmOp("vse32", f"vse32.v v{g.facc}, (%[c])", "the row's results"))


# --- gemm 8x32: the whole block loop in one asm statement, fp32 accumulators in registers -------------------
#
# v0-v7 the int32 accumulators (tile ni: v(2 ni) rows 0-3, v(2 ni + 1) rows 4-7, 8 columns each), v8-v15 the
# fp32 ones in the same lanes, v16-v17 and v20-v27 the k loop's A and B, then in the fold the loaded factors
# (v16, the gathers' source), a row factor (v20-v23) and a column factor (v24-v27); three e16 lane tables the
# k loop leaves alone: lane -> row (v28-v29), lane -> column of the first half (v30-v31) and of the second
# (v18-v19). The fold works on halves of 4 registers (tiles 0-1, 2-3): a factor per row or column of the block
# is loaded contiguously (all 32 columns' in one register) and spread over a half's 128 lanes by one register
# gather, each half's columns by its own table.

GEMM_FOLD_TILE = (8, 32)
G_FACC, G_SRC, G_ROW, G_COL, G_IDX_ROW, G_IDX_COL, G_IDX_COL2 = 8, 16, 20, 24, 28, 30, 18
G_TABLES = (G_IDX_ROW, G_IDX_ROW + 1, G_IDX_COL, G_IDX_COL + 1, G_IDX_COL2, G_IDX_COL2 + 1)
G_PERM = 24  # the epilogue's row-major order table (e16, 4 registers), after the last block
ZEROS_BYTES = 512  # v4-v7, the int32 accumulators gemm_block_zero loads
ZEROS_AT = 2 * (3 * 128 + 256)  # their byte offset in gemm_lane_tables: after the row, two column and perm tables
HALF_LANES = 128  # e32 lanes of 4 registers at VLEN 1024


def gemm_fold_in_registers(spec: KernelSpec) -> bool:
    """Does the gemm get the in-register fold: an 8x32 tile (its 16 accumulator registers, int32 and fp32,
    leave room for the k loop only there), fp32 scales ahead of each chunk (the fold loads 128 bytes from the
    B scales and zero points: inside the chunk), a k loop within v16-v27."""
    scales_ok = spec.scale_type == "fp32" or spec.b_pack == "hp"  # b_pack = hp: fp16 scales, widened in the fold
    if not (spec.tile_m != 1 and (spec.tile_m, spec.tile_n) == GEMM_FOLD_TILE and scales_ok and spec.scales == "inline"):
        return False
    r = allocate(spec, reserve=8)
    k_loop = {*(x for row in r.a for x in (row if isinstance(row, list) else [row])),
              *(x for g in r.raw for x in g), *(x for g in (r.low or []) for x in g)}
    return r.used <= G_IDX_ROW and not k_loop & set(G_TABLES)


def gemm_lane_tables() -> tuple[int, ...]:
    """The e16 tables the asm loads: a half's lane -> row (0-7), the first half's lane -> column (0-15) and the
    second's (16-31), then the row-major order of the fp32 accumulators' lanes (output (r, c) at entry
    32 r + c) for the epilogue, then 512 bytes of zeros (gemm_block_zero loads half the accumulators' zeros)."""
    row = [4 * ((q // 32) % 2) + (q % 32) // 8 for q in range(HALF_LANES)]
    col = [8 * (q // 64) + q % 8 for q in range(HALF_LANES)]
    perm = [(2 * (c // 8) + r // 4) * 32 + (r % 4) * 8 + c % 8 for r in range(8) for c in range(32)]
    return (*row, *col, *(c + 16 for c in col), *perm, *([0] * (ZEROS_BYTES // 2)))


def _spread(dest: int, idx: int, what: str) -> AsmOp:
    return AsmOp("vgather", f"vrgatherei16.vv v{dest}, v{G_SRC}, v{idx}", what)


def gemm_fold(spec: KernelSpec, zp_default: int) -> tuple[AsmOp, ...]:
    """After a block's k loop: the int32 dots to fp32 (exact: |dot| <= block x 128 x 255 < 2^24), minus
    zp x sum(a) (exact too: an integer below 2^24, the fused multiply-subtract rounds it to itself), times
    a_scale x b_scale into the fp32 accumulators (two roundings, as the C fold). The zero-point fix runs on the
    FP unit, which the integer unit's unpack and gathers would otherwise outweigh; small vectors convert at LMUL 1.
    Each factor per column is loaded once for the tile's 32 columns; the halves gather their own from it
    (G_IDX_COL, G_IDX_COL2)."""
    m1 = AsmOp("vset", "vsetvli t0, zero, e32, m1, ta, ma", "one register: 32 lanes")
    m4 = AsmOp("vset", "vsetvli t0, zero, e32, m4, ta, ma", "a half: 128 lanes")
    rows8 = AsmOp("vset", "vsetivli t0, 8, e32, m1, ta, ma", "the tile's 8 rows")
    ops = [AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"), AsmOp("vfcvt", "vfcvt.f.x.v v0, v0", "the dots, exact"),
           rows8, AsmOp("vlse32", f"vlse32.v v{G_SRC}, (%[as]), %[ass]", "the rows' code sums of the block"),
           AsmOp("vfcvt", f"vfcvt.f.x.v v{G_SRC}, v{G_SRC}", "exact"), m4, _spread(G_ROW, G_IDX_ROW, "sum(a) by row")]
    if spec.zero_point == "asymmetric":
        ops += [AsmOp("vle8", f"vl1re8.v v{G_COL}, (%[zp])", "B's zero points"), m1,
                AsmOp("vzext", f"vzext.vf4 v{G_SRC}, v{G_COL}"), AsmOp("vfcvt", f"vfcvt.f.xu.v v{G_SRC}, v{G_SRC}"), m4]
        for half, idx in enumerate((G_IDX_COL, G_IDX_COL2)):
            ops += [_spread(G_COL, idx, "zp by column"),
                    AsmOp("vfnmsac", f"vfnmsac.vv v{4 * half}, v{G_COL}, v{G_ROW}", "- zp * sum(a)")]
    else:
        ops += [AsmOp("vfnmsac", f"vfnmsac.vf v{4 * half}, ft2, v{G_ROW}", f"- {zp_default} * sum(a)") for half in range(2)]
    ops += [rows8, AsmOp("vle32", f"vle32.v v{G_SRC}, (%[sa])", "the rows' A scales of the block"), m4,
            _spread(G_ROW, G_IDX_ROW, "a_scale by row")]
    ops.append(AsmOp("vle8", f"vl1re32.v v{G_SRC}, (%[sb])", "the 32 columns' B scales"))
    for half, idx in enumerate((G_IDX_COL, G_IDX_COL2)):
        ops += [_spread(G_COL, idx, "b_scale by column"),
                AsmOp("vfmul", f"vfmul.vv v{G_COL}, v{G_COL}, v{G_ROW}", "a_scale x b_scale"),
                AsmOp("vfmacc", f"vfmacc.vv v{G_FACC + 4 * half}, v{4 * half}, v{G_COL}", "facc += dot x scale")]
    return tuple(ops)  # under e32, LMUL 4, as gemm_block_zero needs


def gemm_block_zero() -> tuple[AsmOp, ...]:
    """A block's int32 accumulators = 0 as it starts (not after each fold: the tile's last block would zero them
    for nothing), under e32 LMUL 4 (the tile start's or the previous fold's): half on the integer unit, half
    loaded from zeros (t2, gemm_tile_start): the fold keeps the integer and FP units about equally busy and the
    load unit has room, where a second vector move would add to one of them."""
    return (AsmOp("vmv", "vmv.v.i v0, 0", "int32 accumulators = 0: half on the integer unit,"),
            AsmOp("vle8", "vl4re8.v v4, (t2)", f"half loaded ({ZEROS_BYTES} zero bytes)"))


def gemm_block_end(spec: KernelSpec, pack, b_walk: int) -> tuple[AsmOp, ...]:
    """Every pointer to the next block (A's codes walked by the k loop), then the block loop's branch."""
    ops = [AsmOp("addi", f"addi %[sa], %[sa], {4 * spec.tile_m}", "A scales: TM to a block"),
           AsmOp("addi", "addi %[as], %[as], 4"), *_add_imm("%[sb]", pack.chunk_bytes, "the next chunk")]
    if spec.zero_point == "asymmetric":
        ops += _add_imm("%[zp]", pack.chunk_bytes)
    ops += _add_imm("%[b]", pack.chunk_bytes - b_walk)
    return (*ops, AsmOp("bne", "bne %[sa], %[sa_end], 2b", "the next block"))


def gemm_tile_start(zp_default: int) -> tuple[AsmOp, ...]:
    return (AsmOp("fmv", "fmv.w.x ft1, zero", "+0.0f"),
            AsmOp("li", f"li t2, {zp_default}"), AsmOp("fcvt", "fcvt.s.w ft2, t2", "the zero point without stored ones"),
            AsmOp("addi", f"addi t2, %[idx], {ZEROS_AT}", "zeros for gemm_block_zero"),
            AsmOp("vle8", f"vl2re16.v v{G_IDX_ROW}, (%[idx])", "lane -> row"),
            AsmOp("addi", f"addi t1, %[idx], {2 * HALF_LANES}"),
            AsmOp("vle8", f"vl2re16.v v{G_IDX_COL}, (t1)", "lane -> column, columns 0-15"),
            AsmOp("addi", f"addi t1, %[idx], {4 * HALF_LANES}"),
            AsmOp("vle8", f"vl2re16.v v{G_IDX_COL2}, (t1)", "lane -> column, columns 16-31"),
            AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"),
            AsmOp("vfmv", f"vfmv.v.f v{G_FACC}, ft1", "fp32 accumulators: +0.0f (on the FP unit: the integer unit is the busier)"),
            AsmOp("vset", "vsetvli t0, zero, e32, m4, ta, ma", "gemm_block_zero's vtype"))


def gemm_tile_end(spec: KernelSpec) -> tuple[AsmOp, ...]:
    """The fp32 accumulators in row-major order (one gather at LMUL 8: row r in v(16 + r)), then row by row, cols
    of them: plus %[addend]'s row (C's, a later K chunk; the bias, the first; %[astride] bytes apart) when there
    is one, stored to C's row, until %[rows] rows are. b_pack = hp: first times D / 16 (B's factor, and its codes
    were read as 16 (q - 8): hp_unpack), a power of two."""
    unscale = ((AsmOp("flw", "flw ft1, 0(%[bf])", "B's factor D (finish_pack)"),
                AsmOp("lui", "lui t1, 0x3d800", "1/16 as fp32"), AsmOp("fmv", "fmv.w.x ft2, t1"),
                AsmOp("fmul", "fmul.s ft1, ft1, ft2", "D / 16: exact"),
                AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"),
                AsmOp("vfmul", f"vfmul.vf v{G_FACC}, v{G_FACC}, ft1"))
               if spec.b_pack == "hp" else ())
    ops = [*unscale, AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"),
           AsmOp("addi", f"addi t1, %[idx], {6 * HALF_LANES}"),
           AsmOp("vle8", f"vl4re16.v v{G_PERM}, (t1)", "row-major order"),
           AsmOp("vgather", f"vrgatherei16.vv v16, v{G_FACC}, v{G_PERM}"),
           AsmOp("vset", "vsetvli t0, %[cols], e32, m1, ta, ma", "the tile's columns"),
           AsmOp("mv", "mv t1, %[c]"), AsmOp("mv", "mv t2, %[addend]"), AsmOp("mv", "mv %[n], %[rows]", "rows left")]
    for r in range(GEMM_FOLD_TILE[0]):
        row = 16 + r
        ops += [AsmOp("beqz", "beqz t2, 4f", "nothing to add"),
                AsmOp("vle32", f"vle32.v v{G_PERM}, (t2)"), AsmOp("vfadd", f"vfadd.vv v{row}, v{row}, v{G_PERM}"),
                AsmOp("add", "add t2, t2, %[astride]"), AsmOp("label", "4:"),
                AsmOp("vse32", f"vse32.v v{row}, (t1)", f"row {r}")]
        if r + 1 < GEMM_FOLD_TILE[0]:
            ops += [AsmOp("addi", "addi %[n], %[n], -1"), AsmOp("beqz", "beqz %[n], 9f", "the tile's last row"),
                    AsmOp("add", "add t1, t1, %[ldcb]")]
    return (*ops, AsmOp("label", "9:"))


# --- gemm 8x32, 4-bit, block 32: B's zero points subtracted in the k loop -----------------------------------
#
# B's codes minus their zero points (-15..15; symmetric: code - 8) times A's signed codes (vmadot, signed x
# signed) give dot - zp x sum(a) in int32 directly, the same integer gemm_fold computes on the FP unit: the fold
# is then the dots to fp32 and facc += dot x (a_scale x b_scale), with the same two roundings, and A's code sums
# are never read. A block is one k iteration (k_unroll 2: one 128-byte B register per 8 columns holds its 32 k),
# so the zero points are spread once per block over the unpacked B's 512 bytes: one byte gather through an e8
# lane -> column table, at the unpack's own vtype. Registers: v16-v19 that table, then the low nibbles; v20-v23
# the spread zero points, then A; v24-v27 the zero points as loaded (the gather's source), then B's codes
# (their high nibbles after the unpack); v28-v31 the fold's lane -> row and lane -> column tables (gemm_lane_tables);
# v0-v15 as gemm_fold's.

Z_LOW, Z_ZP, Z_RAW, Z_A = 16, 20, 24, 20
ZP_SPREAD_AT = ZEROS_AT + ZEROS_BYTES  # byte offset of the e8 table lane -> column (zp_lane_tables)


def gemm_zp_in_loop(spec: KernelSpec) -> bool:
    """The in-register 8x32 gemm of 4-bit codes in blocks of 32 k (one k iteration a block) takes this form."""
    return gemm_fold_in_registers(spec) and spec.bits == 4 and spec.block == 2 * K_STEP


def zp_lane_tables() -> tuple[int, ...]:
    """gemm_lane_tables, then (at ZP_SPREAD_AT) the e8 table lane -> column of the unpacked B (byte L of the 4
    B registers is column L / 16), two bytes to an e16 entry, little-endian."""
    spread = [lane // K_STEP for lane in range(4 * A_TILE_BYTES)]
    return (*gemm_lane_tables(), *(spread[2 * i] | spread[2 * i + 1] << 8 for i in range(len(spread) // 2)))


def zp_loop_body(spec: KernelSpec, zp_default: int) -> tuple[AsmOp, ...]:
    """The block's k loop: B's 32 columns x 32 k unpacked and less their zero points at e8 LMUL 4, then the 8
    vmadots (signed x signed) at LMUL 1."""
    low, raw = f"v{Z_LOW}", f"v{Z_RAW}"
    ops = [AsmOp("vset", "vsetvli t0, zero, e8, m4, ta, ma", "the unpack: 512 bytes")]
    if spec.zero_point == "asymmetric":
        ops += [AsmOp("vle8", f"vl1re8.v {raw}, (%[zp])", "B's zero points, 32 columns"),
                AsmOp("vle8", f"vl4re8.v {low}, (t2)", "lane -> column (ZP_SPREAD_AT)"),
                AsmOp("vgather", f"vrgather.vv v{Z_ZP}, {raw}, {low}", "each column's zero point over its 16 bytes")]
    if spec.b_pack == "hp":  # codes stored signed (finish_pack): 16 (q - 8) in each byte, no zero point left
        return (*ops, AsmOp("vle8", f"vl4re8.v {raw}, (%[b])", "B cols 0..31, the block's 32 k, signed"),
                AsmOp("vsll", f"vsll.vi {low}, {raw}, 4", "16 (q - 8) of the low nibbles: the first 16-k step"),
                AsmOp("vand", f"vand.vi {raw}, {raw}, -16", "16 (q - 8) of the high nibbles: the second"),
                *_zp_vmadots(spec))
    ops += [AsmOp("vle8", f"vl4re8.v {raw}, (%[b])", "B cols 0..31, the block's 32 k"), *_unpack(spec, Z_LOW, Z_RAW)]
    if spec.zero_point == "asymmetric":
        ops += [AsmOp("vsub", f"vsub.vv {low}, {low}, v{Z_ZP}", "- zp: -15..15"), AsmOp("vsub", f"vsub.vv {raw}, {raw}, v{Z_ZP}")]
    else:
        ops += [AsmOp("vadd", f"vadd.vi {x}, {x}, {-zp_default}", f"- {zp_default}") for x in (low, raw)]
    return (*ops, *_zp_vmadots(spec))


def _zp_vmadots(spec: KernelSpec) -> tuple[AsmOp, ...]:
    """A's two k-steps, then the 8 vmadots (signed x signed) at LMUL 1, and A's pointer to the next block."""
    ops = [AsmOp("vle8", f"vl2re8.v v{Z_A}, (%[a])", "A: k-steps 0 and 1"),
           AsmOp("vset", "vsetvli t0, zero, e8, m1, ta, ma", "vmadot: LMUL 1")]
    for k, first_b in enumerate((Z_LOW, Z_RAW)):
        for ni in range(GEMM_FOLD_TILE[1] // 8):
            word = encode_vmadot(2 * ni, Z_A + k, first_b + ni, signedness="ss")
            ops.append(AsmOp("vmadot", f".word 0x{word:08x}", f"{mnemonic('ss')} v{2 * ni}, v{Z_A + k}, v{first_b + ni}"))
    return (*ops, *_add_imm("%[a]", a_step(spec)))


def zp_free_fold(spec: KernelSpec) -> tuple[AsmOp, ...]:
    """gemm_fold without the zero-point term: the dots to fp32 (exact), times a_scale x b_scale into the fp32
    accumulators; B's scales of columns 16-31 loaded from 64 bytes on (inside the chunk: its zero points and
    codes follow), so that one lane -> column table serves both halves. b_pack = hp: the 32 fp16 scales loaded and
    widened once (exact), columns 16-31 slid down to lanes 0-15 for the second half."""
    m4 = AsmOp("vset", "vsetvli t0, zero, e32, m4, ta, ma", "a half: 128 lanes")
    ops = [AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"), AsmOp("vfcvt", "vfcvt.f.x.v v0, v0", "the dots, exact"),
           AsmOp("vset", "vsetivli t0, 8, e32, m1, ta, ma", "the tile's 8 rows"),
           AsmOp("vle32", f"vle32.v v{G_SRC}, (%[sa])", "the rows' A scales of the block"), m4,
           _spread(G_ROW, G_IDX_ROW, "a_scale by row")]
    hp = spec.b_pack == "hp"
    if hp:
        ops += [AsmOp("vset", "vsetvli t0, zero, e16, mf2, ta, ma", "32 fp16 lanes (VLMAX)"),
                AsmOp("vle16", f"vle16.v v{G_SRC + 1}, (%[sb])", "B's fp16 scales"),
                AsmOp("vfwcvt", f".word 0x{encode_vfwcvt_f_f(G_SRC, G_SRC + 1):08x}",
                      f"vfwcvt.f.f.v v{G_SRC}, v{G_SRC + 1}: as fp32, exact"), m4]
    for half in range(2):
        if hp and half:
            ops.append(AsmOp("vslide", f"vslidedown.vi v{G_SRC}, v{G_SRC}, 16", "columns 16-31 to lanes 0-15"))
        elif not hp:
            if half:
                ops.append(AsmOp("addi", "addi t1, %[sb], 64"))
            ops.append(AsmOp("vle8", f"vl1re32.v v{G_SRC}, ({'t1' if half else '%[sb]'})", f"B scales of columns {16 * half}.."))
        ops.append(_spread(G_COL, G_IDX_COL, "b_scale by column"))
        ops += [AsmOp("vfmul", f"vfmul.vv v{G_COL}, v{G_COL}, v{G_ROW}", "a_scale x b_scale"),
                AsmOp("vfmacc", f"vfmacc.vv v{G_FACC + 4 * half}, v{4 * half}, v{G_COL}", "facc += dot x scale")]
    return tuple(ops)


def zp_block_zero(spec: KernelSpec) -> tuple[AsmOp, ...]:
    """A block's int32 accumulators = 0 as it starts, on the FP unit (+0.0f is all zero bits): without the
    zero-point term the fold leaves it the less busy unit (the integer one has the unpack and the gathers), and
    one LMUL-8 move and its vsetvli cost less vector issue than two LMUL-4 moves. b_pack = hp: on the integer
    unit, which its two-instruction unpack and no zero-point spread leave the less busy one (the fold's widened
    scales add to the FP unit)."""
    if spec.b_pack == "hp":
        return (AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"), AsmOp("vmv", "vmv.v.i v0, 0", "int32 accumulators = 0"))
    return (AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"),
            AsmOp("vfmv", "vfmv.v.f v0, ft1", "int32 accumulators = 0"))


def zp_tile_start(spec: KernelSpec) -> tuple[AsmOp, ...]:
    ops = [AsmOp("fmv", "fmv.w.x ft1, zero", "+0.0f")]
    if spec.zero_point == "asymmetric":
        ops.append(AsmOp("addi", f"addi t2, %[idx], {ZP_SPREAD_AT}", "the zero points' lane -> column table"))
    return (*ops, AsmOp("vle8", f"vl2re16.v v{G_IDX_ROW}, (%[idx])", "lane -> row"),
            AsmOp("addi", f"addi t1, %[idx], {2 * HALF_LANES}"),
            AsmOp("vle8", f"vl2re16.v v{G_IDX_COL}, (t1)", "lane -> column, columns 0-15"),
            AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"),
            AsmOp("vfmv", f"vfmv.v.f v{G_FACC}, ft1", "fp32 accumulators: +0.0f"))


# --- gemv with block-scaled `.hp` vmadots (hp_blocks = S): FP16 accumulation per super-block of S blocks ------
#
# A's int8 codes c (MLAS CompInt8) are split into three signed 4-bit rows of the vmadot A tile: row 0 the high
# nibbles (c >> 4), row 1 the low ones less 8 ((c & 15) - 8), row 4 all ones, so c = 16 row0 + row1 + 8 row4
# exactly; B's codes are stored signed (q - 8: finish_pack). One `vmadot.hp ..., i4` per 8 columns and block
# multiplies all three rows by the block's 32 k and adds each product, times the column's FP16 scale
# s = sa x sb, into its FP16 accumulator: 4 vmadots per block where the int8 path needs 8, and no unpack. Every
# S blocks the FP16 accumulators are widened into fp32 ones (vfwadd.wv) and zeroed; the tile end combines the
# rows (16 r0 + r1 + 8 r4), compacts row 0's lanes and multiplies by A's row factor and B's factor (the scales
# were normalized by them, powers of two, so that |s| <= 1 and no FP16 sum can overflow: |H| <= S x 2048).
#
# Registers: v0 the block's FP16 scales s (imm3 = tile: elements 8t..8t+7), v1 B's scales as loaded, v2 A (rows
# 0-1 loaded per block; rows 4-7 the ones, set at the tile start and kept by the tail-undisturbed loads), v3 the
# compaction mask, v4-v7 the FP16 accumulators (tile t in v(4 + t)), v8-v11 B (tile t in v(8 + t)), v16-v23
# the fp32 accumulators (e32, LMUL 8: tile t's cell (r, j) at lane 64 t + 8 r + j), v24-v31 the tile end's sums.

HP_SCALES, HP_B_SCALES, HP_A, HP_MASK, HP_ACC, HP_B, HP_FACC, HP_SUM = 0, 1, 2, 3, 4, 8, 16, 24
HP_TILES = 4  # 32 columns: four 8-column vmadot tiles
HP_ONES_ROW = 4  # the A tile's row of ones: rows 2-3 hold the next block's codes (a 64-byte load)
HP_LOOP_VTYPE = "vsetvli t0, zero, e16, m1, tu, ma"  # .hp: LMUL 1, vl = VLMAX; tu keeps A's rows 4-7
HP_SCALE_BASE = 28  # t3: the A scale pointer the flh words name (a fixed register: a .word cannot take an operand)


def encode_flh(rd: int, rs1: int, offset: int) -> int:
    """`flh f{rd}, offset(x{rs1})` (Zfh, which the A100 has: llama.cpp's IME2 kernels use it) as a word: the
    kernels build with plain rv64gcv."""
    return (offset & 0xFFF) << 20 | rs1 << 15 | 0b001 << 12 | rd << 7 | 0b0000111


def encode_vfncvt_f_f_w(vd: int, vs2: int) -> int:
    """`vfncvt.f.f.w vd, vs2` (unmasked; Zvfhmin) as a word, for the same reason."""
    return 0b010010 << 26 | 1 << 25 | vs2 << 20 | 0b10100 << 15 | 0b001 << 12 | vd << 7 | 0b1010111


def hp_block(j: int) -> tuple[AsmOp, ...]:
    """Block j of a super-block, under HP_LOOP_VTYPE: %[b] at its chunk (64 bytes of fp16 scales, then 512 of
    codes), %[a] at its 32 bytes of A (row 0 then row 1), t3 at the super-block's first A scale."""
    ops = [AsmOp("vle16", f"vle16.v v{HP_B_SCALES}, (%[b])", "B's 32 fp16 scales (the 64 lanes read 64 more bytes, unused)"),
           AsmOp("addi", "addi %[b], %[b], 64"),
           AsmOp("vle8", f"vl4re8.v v{HP_B}, (%[b])", "B: 32 columns x 32 k, signed 4-bit"),
           AsmOp("addi", "addi %[b], %[b], 512", "the next chunk"),
           AsmOp("vle8", f"vle8.v v{HP_A}, (%[a])", "A rows 0-3 (64 bytes: rows 0-1 this block's); rows 4-7 kept"),
           AsmOp("addi", "addi %[a], %[a], 32"),
           AsmOp("flh", f".word 0x{encode_flh(0, HP_SCALE_BASE, 2 * j):08x}", f"flh ft0, {2 * j}(t3): the block's A scale"),
           AsmOp("vfmul", f"vfmul.vf v{HP_SCALES}, v{HP_B_SCALES}, ft0", "s = sa x sb, FP16, per column")]
    for t in range(HP_TILES):
        word = encode_vmadot_hp(HP_ACC + t, HP_A, HP_B + t, scale=HP_SCALES, imm3=t, signedness="ss", dtype="i4")
        ops.append(AsmOp("vmadot", f".word 0x{word:08x}",
                         f"{mnemonic('ss', 'i4', form='hp')} v{HP_ACC + t}, v{HP_A}, v{HP_B + t}, v{HP_SCALES}, {t}"))
    return tuple(ops)


def hp_fold() -> tuple[AsmOp, ...]:
    """A super-block's FP16 sums into the fp32 accumulators (each sum rounds once), and zeroed."""
    return (AsmOp("vset", "vsetvli t0, zero, e16, m4, ta, ma", "the four FP16 accumulators"),
            AsmOp("vfwadd", f"vfwadd.wv v{HP_FACC}, v{HP_FACC}, v{HP_ACC}", "fp32 += FP16"),
            AsmOp("vmv", f"vmv.v.i v{HP_ACC}, 0", "FP16 accumulators = +0"),
            AsmOp("vset", HP_LOOP_VTYPE))


def hp_tile_start() -> tuple[AsmOp, ...]:
    return (AsmOp("vset", "vsetvli t0, zero, e8, m1, ta, ma"),
            AsmOp("li", "li t1, 0x11"), AsmOp("vmv", f"vmv.v.x v{HP_A}, t1", f"A's row {HP_ONES_ROW} (and 5-7): ones"),
            AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"),
            AsmOp("vmv", f"vmv.v.i v{HP_FACC}, 0", "fp32 accumulators = +0"),
            AsmOp("vset", "vsetvli t0, zero, e16, m4, ta, ma"),
            AsmOp("vmv", f"vmv.v.i v{HP_ACC}, 0", "FP16 accumulators = +0"),
            AsmOp("vset", HP_LOOP_VTYPE), AsmOp("mv", "mv t3, %[sa]", "the A scales (flh's base)"))


def hp_tile_end() -> tuple[AsmOp, ...]:
    """16 row0 + row1 + 8 row4 per cell (the codes' split undone; fp32, fused: 16 x and 8 x are exact), row 0's
    lanes compacted into the row's 32 results, times B's factor, then A's (each a power of two), plus the
    addend, stored."""
    ones = 8 * HP_ONES_ROW
    return (AsmOp("vset", "vsetvli t0, zero, e32, m8, ta, ma"),
            AsmOp("vslide", f"vslidedown.vi v{HP_SUM}, v{HP_FACC}, 8", "row 1 (the low nibbles) under row 0"),
            AsmOp("li", "li t1, 0x41800000"), AsmOp("fmv", "fmv.w.x ft1, t1", "16.0f"),
            AsmOp("vfmacc", f"vfmacc.vf v{HP_SUM}, ft1, v{HP_FACC}", "+ 16 x row 0 (the high nibbles)"),
            AsmOp("li", f"li t1, {ones}"),
            AsmOp("vslide", f"vslidedown.vx v{HP_B}, v{HP_FACC}, t1", f"row {HP_ONES_ROW} (the ones: sum(w)) under row 0"),
            AsmOp("li", "li t1, 0x41000000"), AsmOp("fmv", "fmv.w.x ft1, t1", "8.0f"),
            AsmOp("vfmacc", f"vfmacc.vf v{HP_SUM}, ft1, v{HP_B}", "+ 8 x row 4: sum of c x w"),
            AsmOp("vlm", f"vlm.v v{HP_MASK}, (%[mask])", "row 0 of each tile (compact_mask)"),
            AsmOp("vcompress", f"vcompress.vm v{HP_B}, v{HP_SUM}, v{HP_MASK}", "the row's 32 sums, column by column"),
            AsmOp("vset", "vsetvli t0, %[cols], e32, m1, ta, ma", "the tile's columns"),
            AsmOp("flw", "flw ft0, 0(%[bf])", "B's factor"), AsmOp("vfmul", f"vfmul.vf v{HP_B}, v{HP_B}, ft0"),
            AsmOp("flw", "flw ft0, 0(%[af])", "the row's A factor"), AsmOp("vfmul", f"vfmul.vf v{HP_B}, v{HP_B}, ft0"),
            AsmOp("beqz", "beqz %[addend], 3f", "nothing to add"),
            AsmOp("vle32", f"vle32.v v{HP_B + 1}, (%[addend])", "C (a later K chunk) or the bias"),
            AsmOp("vfadd", f"vfadd.vv v{HP_B}, v{HP_B}, v{HP_B + 1}"),
            AsmOp("label", "3:"),
            AsmOp("vse32", f"vse32.v v{HP_B}, (%[c])", "the row's results"))


def hp_program(S: int) -> tuple[AsmOp, ...]:
    """The tile's asm: super-blocks of S blocks while t3 (the A scales) is short of %[sa_full], each folded, then
    the remaining blocks one at a time until %[sa_end], folded once; then the tile end."""
    def label(name: str) -> AsmOp:
        return AsmOp("label", f"{name}:")
    return (*hp_tile_start(),
            AsmOp("beq", "beq t3, %[sa_full], 4f", "no whole super-block"), label("2"),
            *(op for j in range(S) for op in hp_block(j)),
            AsmOp("addi", f"addi t3, t3, {2 * S}", "the next super-block's A scales"), *hp_fold(),
            AsmOp("bne", "bne t3, %[sa_full], 2b", "the next super-block"),
            label("4"), AsmOp("beq", "beq t3, %[sa_end], 5f", "no blocks left"), label("1"), *hp_block(0),
            AsmOp("addi", "addi t3, t3, 2"), AsmOp("bne", "bne t3, %[sa_end], 1b", "the next of the last blocks"),
            *hp_fold(), label("5"), *hp_tile_end())


def hp_plan(spec: KernelSpec) -> ImePlan:
    """The `.hp` gemv: its whole asm statement (hp_program), which templates/micro_ime2.c.j2 prints."""
    return ImePlan(program=hp_program(spec.hp_blocks), 
        ma=1, na=HP_TILES, acc_regs=((HP_ACC,),), prologue=(), body=hp_block(0), iterations_per_block=1,
        a_bytes_per_iteration=2 * K_STEP, b_stride=0, b_walk=0, clobbers=tuple(f"v{x}" for x in range(VECTOR_REGISTERS)),
        vmadots_per_tile_block=HP_TILES, fold=hp_fold(), facc_floats=spec.tile_n, facc_at="j",
        facc_regs=((HP_FACC,),), tile_start=hp_tile_start(), tile_end=hp_tile_end(),
        index16=compact_mask(spec), k_step=K_STEP, a_tile_bytes=A_TILE_BYTES)
