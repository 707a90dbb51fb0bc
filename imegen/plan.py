"""Stage 3: KernelSpec -> KernelPlan, every number and layout formula the templates need.

Templates only place what is decided here: packed-B and A-workspace index formulas (as C
expressions), RVV type names, and for IME the fixed register map and the inner-loop
instruction list with each vmadot already encoded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .ime_encoding import encode_vmadot, mnemonic
from .ir import KernelSpec, fp32_acc_in_registers, gemv_fold_lmul, lmul_for, register_budget, staged, zero_points_in_b

# M blocking: the rows of A's workspace one pass over all N tiles reuses stay within 3/4 of the K1's
# 512 KB cluster L2, so A is read from L2 (and the packed B streamed once per M block) instead of A
# streaming from DRAM once per N tile. B has no reuse across M blocks (it streams through the
# remaining quarter), so the larger the block the fewer times B streams: at K = 4864 (Qwen's down
# projection) 64 rows instead of 40, i.e. 2 passes of B instead of 4 at M = 128.
A_BLOCK_BYTES = 384 * 1024
# Blocks of at most this many loop iterations run the body repeated instead of a counted loop.
MAX_UNROLLED_ITERATIONS = 4
# A int8 signed x B raw unsigned codes, zero points folded in the epilogue (8-bit, and 4-bit gemv);
# signed x signed when 4-bit gemm kernels subtract the zero points from the unpacked B (ir.zero_points_in_b)
# and for 8-bit MLAS kernels, which store B as signed q - 128 and fold zero points through MLAS's block
# sums (KernelPlan.blksum).
IME_SIGNEDNESS = {False: "su", True: "ss"}


@dataclass(frozen=True)
class PackLayout:
    """Packed B: column panels of `panel` columns; per (panel, block) a data chunk.

    `byte`/`shift` are C expressions in c (column within panel) and kk (k within block)
    giving where the element's code lives in the chunk's data.
    """

    panel: int
    data_bytes: int  # per (panel, block)
    inline: bool  # scales/zero points stored ahead of each chunk's data
    scale_bytes: int  # per (panel, block)
    zp_bytes: int  # per (panel, block), 0 when symmetric
    byte: str
    shift: str
    # Zero points one byte per column, or (IME gemv) two per byte: tile t's byte j holds columns
    # t*TN + j (low nibble) and t*TN + j + TN/2 (high), the split the fold unpacks with vand/vsrl.
    zp_nibbles: bool = False
    zp_tile_n: int = 0  # TN when zp_nibbles

    @property
    def tail_bytes(self) -> int:
        """Bytes after the last chunk a kernel may read: the gemv fold loads a tile's nibble zero points
        as TN bytes (at SEW 16, the vl its slides and scales use), TN / 2 of them past its own."""
        return self.zp_tile_n // 2

    def zp_byte(self, c: str) -> str:
        """C expression: the byte of column c's zero point within a chunk's zero points."""
        if not self.zp_nibbles:
            return c
        t, h = self.zp_tile_n, self.zp_tile_n // 2
        return f"{c} / {t} * {h} + {c} % {h}"

    def zp_shift(self, c: str) -> str:
        return f"{c} % {self.zp_tile_n} / {self.zp_tile_n // 2} * 4" if self.zp_nibbles else "0"

    @property
    def chunk_bytes(self) -> int:
        return self.data_bytes + (self.scale_bytes + self.zp_bytes if self.inline else 0)


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
    # fp32 accumulators in registers (ir.fp32_acc_in_registers): [mi][ni] -> even register pair (gemv,
    # _gemv_facc_group: ((first register of the row's e32 group,),)); then
    # one asm statement loops over all blocks: tile_start (zero them, outer label), per block the
    # prologue/loop/fold, block_end (advance the block pointers, branch back), tile_end (store them
    # to facc for the C epilogue). Empty when the accumulators live in memory (one asm per block).
    facc_regs: tuple[tuple[int, ...], ...] = ()
    tile_start: tuple[AsmOp, ...] = ()
    block_end: tuple[AsmOp, ...] = ()
    tile_end: tuple[AsmOp, ...] = ()

    acc_zero: tuple[AsmOp, ...] = ()  # per block: the int32 accumulators = 0, one vmv per LMUL-8 group
    direct_store: bool = False  # whole tiles are stored to C by the asm (tile_end), edge tiles via facc
    index16: tuple[int, ...] = ()  # the e16 index tables of _paired_column_fold, when it is used
    unrolled: bool = False  # few iterations per block: the body is repeated, no loop counter or branch
    entry_vset: bool = True  # the body relies on entering at e8, m1 (else it sets vtype itself first)
    # stage_b = m_block (_staged_ime_plan): `stage` is the asm that writes an N tile's staged B (every
    # block: its unpacked B - zp tiles, then its B scales spread over the fold's lanes, stage_block_bytes
    # in all) for the tiles of an M block; stage_index its lane -> column table (e16).
    stage: tuple[AsmOp, ...] = ()
    stage_block_bytes: int = 0
    stage_index: tuple[int, ...] = ()

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


@dataclass(frozen=True)
class RvvTypes:
    """Type/intrinsic suffixes: e.g. f32='f32m2', u8='u8mf2'."""

    lmul: int  # of the 32-bit accumulators
    f32: str
    i32: str
    u32: str
    i16: str
    u16: str
    u8: str


@dataclass(frozen=True)
class KernelPlan:
    spec: KernelSpec
    pack: PackLayout
    zp_default: int
    k_lo: str  # C expr in kp: first k of byte-row kp (rvv/scalar)
    k_hi: str  # ... second k (4-bit only)
    a_index: str  # C expr in m, k, Kpad: byte/element offset of A[m][k] in the workspace
    a_scale_group: int  # A's block scales by groups of this many rows (_a_scale_group; 1: row-major)
    a_rows_padded_to: int
    a_tail_pad: int  # extra workspace bytes read past the last row (IME gemv loads 32 bytes)
    rvv: RvvTypes | None
    ime: ImePlan | None
    budget: dict
    a_block_bytes: int = A_BLOCK_BYTES
    forced_k_chunks: int = 0  # 0: each call picks its K chunks (k_chunks()); n: always n (counting runs)

    @property
    def a_scale_index(self) -> str:
        """C expr in m, blk, kb: the element offset of A row m's block-blk scale."""
        g = self.a_scale_group
        return "m * kb + blk" if g == 1 else f"((m / {g}) * kb + blk) * {g} + m % {g}"

    @property
    def a_row_tail(self) -> str:
        """C expr in m, Kpad: where row m's a_tail_pad bytes start (gemv: right after its Kpad codes, _a_index)."""
        return f"m * (Kpad + {self.a_tail_pad}) + Kpad"

    @property
    def a_scale_ctype(self) -> str:
        """The C type of A's block scales in the workspace: fp32, or with a_scale_type = fp16 its bits;
        gemv's as 32-bit words 0xffff0000 | bits, which flw loads as a NaN-boxed fp16 value, the
        form an SEW-16 vector-scalar instruction reads from an f register [RVV 1.0 §10.3]."""
        if self.spec.a_scale_type != "fp16":
            return "float"
        return "uint32_t" if self.spec.op == "gemv" else "uint16_t"

    @property
    def a_chunk_stride(self) -> int | None:
        """Bytes between a row's consecutive 8-k chunks of quantized A (see _a_index) when an IME kernel
        keeps k in order there (planar or 8-bit B; interleaved B permutes k within 16): its vector A
        quantization then stores a whole block's codes with one store (gemv: unit-stride; gemm: 8-byte
        elements TM x 8 bytes apart) and sums them with one reduction. None: copy them one by one."""
        s = self.spec
        if s.target != "ime" or s.abi != "imegen" or s.block < 32 or (s.bits == 4 and s.unpack != "planar"):
            return None
        return 8 if s.tile_m == 1 else s.tile_m * 8

    @property
    def a_scale_row_bytes(self) -> str:
        """C expr in kb: bytes between consecutive rows' scales of one block (within a group: adjacent)."""
        size = f"sizeof({self.a_scale_ctype})"
        return size if self.a_scale_group > 1 else f"kb * {size}"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def blksum(self) -> bool:
        """MLAS's 8-bit BlkSum contract: B codes stored signed (q - 128), and zero points enter as
        C += A_blksum[m, b] * B_blksum[n, b] with A_blksum = a_scale * sum(qa), B_blksum = b_scale * (128 - zp)."""
        return self.spec.zero_point == "blksum"

    @property
    def runtime_bias(self) -> bool:
        """MLAS passes the bias (or NULL) at run time; imegen's ABI fixes it in the spec."""
        return self.spec.abi == "mlas"


def _lmul_name(num: int, den: int = 1) -> str:
    return f"m{num // den}" if num >= den else f"mf{den // num}"


def _rvv_types(spec: KernelSpec) -> RvvTypes:
    if spec.compute == "fp32":
        l32 = lmul_for(spec.tile_n * 32, spec.vlen)
        return RvvTypes(l32, f"f32m{l32}", f"i32m{l32}", f"u32m{l32}", "", "", "u8" + _lmul_name(l32, 4))
    l16 = lmul_for(spec.tile_n * 16, spec.vlen)
    l32 = 2 * l16
    return RvvTypes(l32, f"f32m{l32}", f"i32m{l32}", f"u32m{l32}", f"i16m{l16}", f"u16m{l16}", "u8" + _lmul_name(l16, 2))


def _pack_layout(spec: KernelSpec) -> PackLayout:
    np_, blk = spec.panel, spec.block
    stored = spec.scales != "ort"  # abi mlas reads ORT's raw scale/zero-point arrays instead
    scale_bytes = (2 if spec.scale_type == "fp16" else 4) * np_ if stored else 0
    nibbles = zp_nibbles(spec)
    zp_cols = np_ // 2 if nibbles else np_
    zp_bytes = -(-zp_cols // 4) * 4 if stored and spec.zero_point == "asymmetric" else 0  # keep data 4-byte aligned
    inline = spec.scales == "inline"
    if spec.target == "ime":
        # 32-byte vmadot B tiles: 4 columns x 8 bytes, column groups of a panel side by side.
        tile = "(c / 4) * 32 + (c % 4) * 8"
        if spec.bits == 8:
            byte, shift = f"(kk / 8) * {np_ * 8} + {tile} + kk % 8", "0"
        elif spec.unpack == "planar":  # byte j: k=j (low nibble), k=j+8 (high): vand/vsrl give k0-7, k8-15
            byte, shift = f"(kk / 16) * {np_ * 8} + {tile} + kk % 8", "((kk % 16) / 8) * 4"
        else:  # interleaved = ORT's own order: byte j holds k=2j, 2j+1
            byte, shift = f"(kk / 16) * {np_ * 8} + {tile} + (kk % 16) / 2", "(kk % 2) * 4"
    else:
        # One byte row per k (8-bit) or k pair (4-bit): a vector load reads one row of the panel.
        if spec.bits == 8:
            byte, shift = f"kk * {np_} + c", "0"
        elif spec.unpack == "planar":
            byte, shift = f"((kk / 16) * 8 + kk % 8) * {np_} + c", "((kk % 16) / 8) * 4"
        else:
            byte, shift = f"(kk / 2) * {np_} + c", "(kk % 2) * 4"
    data_bytes = np_ * blk * spec.bits // 8
    return PackLayout(np_, data_bytes, inline, scale_bytes, zp_bytes, byte, shift, nibbles, spec.tile_n if nibbles else 0)


def zp_nibbles(spec: KernelSpec) -> bool:
    """4-bit IME gemv packs its zero points two per byte, as ORT does (decode is DRAM-bound: at block
    32 one byte per column and block is 5% of the weight bytes, a nibble 2.7%); its fold unpacks them
    (see _gemv_fold). Other kernels keep one byte per column: their loops spread zero points per byte."""
    return (spec.target == "ime" and spec.tile_m == 1 and spec.bits == 4 and spec.zero_point == "asymmetric"
            and spec.scales != "ort")


def _k_pair(spec: KernelSpec) -> tuple[str, str]:
    if spec.bits == 8:
        return "kp", ""
    if spec.unpack == "planar":
        return "(kp / 8) * 16 + kp % 8", "(kp / 8) * 16 + kp % 8 + 8"
    return "2 * kp", "2 * kp + 1"


def _a_index(spec: KernelSpec) -> tuple[str, int, int]:
    """Where quantized (or staged fp32) A[m][k] lives; returns (C expr, row padding, tail bytes)."""
    if spec.target != "ime":
        return "m * Kpad + k", spec.tile_m, 0
    # IME: A tiles hold k in the order the B tiles were unpacked into (see _pack_layout).
    pos = "k" if (spec.bits == 8 or spec.unpack == "planar") else "(k / 16) * 16 + (k % 2) * 8 + (k % 16) / 2"
    if spec.tile_m == 1:  # gemv: one row, 8-k steps back to back; slide forms walk a 32-byte load
        return f"m * (Kpad + 32) + {pos}", 1, 32
    ma = spec.tile_m // 4
    # [row tile][8-k step][A tile mi][4 rows x 8 k]
    expr = (f"(((m / {spec.tile_m}) * (Kpad / 8) + ({pos}) / 8) * {ma} + (m % {spec.tile_m}) / 4) * 32"
            f" + (m % 4) * 8 + ({pos}) % 8")
    return expr, spec.tile_m, 0


def _ime_plan(spec: KernelSpec) -> ImePlan:
    if staged(spec):
        return _staged_ime_plan(spec)
    ma, na, ku = max(1, spec.tile_m // 4), spec.tile_n // 4, spec.k_unroll
    gemv = spec.tile_m == 1
    zp_in_b = zero_points_in_b(spec)
    budget = register_budget(spec)
    fold_regs = budget["fold temporaries"]
    b_groups = ku // 2 if spec.bits == 4 else ku
    a_group = 0 if (gemv or spec.abi == "mlas") else ku * ma  # the A tiles of one iteration lie back to back
    in_regs = fp32_acc_in_registers(spec)
    # fp32 accumulators in memory, two row tiles, at most 16 columns: _column_pair_fold, on
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
            ops.append(AsmOp("vset", f"vsetvli t0, zero, e8, {_lmul_name(lmul)}, ta, ma"))
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
    L = _pack_layout(spec)
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
    fold = _column_pair_fold(spec, acc) if by_column else None
    t4 = -(-used // 4) * 4
    if fold is None and facc and na == 2 and ma <= 2 and t4 + 4 <= 32:
        fold = _paired_column_fold(spec, acc, facc, t4)
        table_loads = (AsmOp("vle16", f"vl4re16.v v{t4}, (%[idx16])", "e16 index tables: lane -> row, lane -> column, for every block"),)
    # gemv: the row's fp32 accumulators (one e32 group of TN lanes) in registers above the loop's
    # and the fold's, when they fit: one asm statement then runs all blocks (as for gemm tiles).
    gemv_facc = _gemv_facc_group(spec, acc[0], used) if gemv else None
    if gemv:
        fold = _gemv_fold(spec, acc[0], gemv_facc)
    if fold is None:
        if facc and used <= 28:
            first = -(-used // 2) * 2
            tables = (first, first + 2) if first + 4 <= 32 else None
        fold = _ime_fold(spec, acc, facc, tables)
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
        tile_end = _tile_end(acc, facc, direct_store)
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
    # ir.spread_refusal admits only tiles these folds are written for; another fold would not spread per register
    assert spec.spread == "group" or _gathers_per_register(fold), spec.describe()
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
        acc_zero=_acc_zero(2 * ma * na, on_vfp=not gemv), unrolled=unrolled, entry_vset=not _sets_vtype_first(ops),
    )


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
# Register map of the staged kernels (ir.register_budget): accumulators from v0, then
B_STAGED, A_STAGED, SCALES_STAGED, TABLES_STAGED = 16, 20, 24, 28
COLUMN_TABLES_STAGED = SCALES_STAGED + 2  # a16: the fold's two e16 lane -> column tables (v26, v27)
STAGED_FP16_SCALE_BYTES = 16  # a16: a block's 8 fp16 B scales, staged as they are (the fold spreads them)


def _staged_ime_plan(spec: KernelSpec) -> ImePlan:
    """stage_b = m_block (ir.staged_b_refusal): TN = 8, TM = 4ma, k_unroll 2, fp32 accumulators in registers.

    Per N tile and M block, `stage` writes for every block the B tiles each loop iteration loads
    (high then low nibbles minus the zero points, signed: 4 registers, one whole-register load) and
    the block's 8 B scales spread over the lanes of a row tile's two accumulator pairs (fp16 ones
    widened first; with a_scale_type = fp16 the 8 fp16 scales as they are, which the fold spreads).
    A tile's block is then: zero the int32 accumulators, per iteration one A and one
    B load and 4ma vmadots, and the fold: one vfcvt, one load of the spread B scales, one strided
    load of the A scales and per row tile a vrgatherei16 (row table kept in registers), a vfmul and
    a vfmacc on LMUL-4 groups."""
    ma, na, ku = spec.tile_m // 4, 2, 2
    acc = tuple(tuple(4 * mi + 2 * ni for ni in range(na)) for mi in range(ma))
    facc = tuple(tuple(4 * ma + 4 * mi + 2 * ni for ni in range(na)) for mi in range(ma))
    B, A, T = B_STAGED, A_STAGED, TABLES_STAGED
    iterations = spec.block // 16
    unrolled = iterations <= MAX_UNROLLED_ITERATIONS
    body = [AsmOp("vle8", f"vl{ku * ma}re8.v v{A}, (%[a])", f"A: {ku} k-steps x {ma} tiles"),
            AsmOp("vle8", f"vl4re8.v v{B}, (%[b])", "staged B: k-step 1 (v16-v17), k-step 0 (v18-v19), cols 0..7"),
            AsmOp("addi", "addi %[b], %[b], 128")]
    for step in range(ku):
        for mi in range(ma):
            for ni in range(na):
                vd, vs1, vs2 = acc[mi][ni], A + step * ma + mi, B + 2 * (1 - step) + ni
                word = encode_vmadot(vd, vs1, vs2, signedness="ss")
                body.append(AsmOp("vmadot", f".word 0x{word:08x}", f"{mnemonic('ss', 0)} v{vd}, v{vs1}, v{vs2}"))
    body.append(AsmOp("addi", f"addi %[a], %[a], {ku * ma * 32}"))
    fold: list[AsmOp] = []
    vt = _Vtype(fold)
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
    acc_zero = ((AsmOp("vsub", f"vsub.vv v0, v0, v0", f"int32 accumulators v0-v{g - 1} (e32, m{g} already)"),) if a_fp16
                else _acc_zero(g, on_vfp=True, halves=per_register))
    col_tables = ((AsmOp("addi", f"addi t0, %[idx16], {32 * ma}"),
                   AsmOp("vle16", f"vl2re16.v v{COLUMN_TABLES_STAGED}, (t0)", "e16 column tables, for every block")) if a_fp16 else ())
    tile_start = (*zero_fp32,
                  AsmOp("vle16", f"vl{ma if a_fp16 else 2 * ma}re16.v v{T}, (%[idx16])", "e16 row tables, for every block"),
                  *col_tables,
                  AsmOp("label", "2:", "each block"), *(() if unrolled else (AsmOp("li", f"li %[n], {iterations}"),)))
    block_end = (AsmOp("addi", f"addi %[sa], %[sa], {(2 if a_fp16 else 4) * 4 * ma}", "next block's A scales"),
                 AsmOp("addi", "addi %[k], %[k], -1"), AsmOp("bnez", "bnez %[k], 2b"))
    direct_store = not spec.bias
    return ImePlan(
        ma=ma, na=na, acc_regs=acc, prologue=(), body=tuple(body), fold=tuple(fold),
        iterations_per_block=iterations, a_bytes_per_iteration=ku * ma * 32,
        b_stride=spec.panel * 8, b_walk=iterations * spec.panel * 8,
        clobbers=tuple(f"v{r}" for r in range(32)), vmadots_per_tile_block=(spec.block // 8) * ma * na,
        facc_floats=ma * na * 16, facc_at=f"(i / 4 * {na} + j / 4) * 16 + i % 4 * 4 + j % 4",
        facc_regs=facc, direct_store=direct_store, tile_start=tile_start, block_end=block_end,
        tile_end=_tile_end(acc, facc, direct_store),
        index16=(STAGED_FP16_ROW_INDEX[:16 * ma] + STAGED_COLUMN_INDEX if a_fp16 else
                 (STAGED_PER_REGISTER_ROW_INDEX if per_register else STAGED_ROW_INDEX)[:32 * ma]),
        acc_zero=acc_zero, unrolled=unrolled, entry_vset=True,
        stage=_stage_b(spec, iterations), stage_block_bytes=iterations * 128 + (STAGED_FP16_SCALE_BYTES if a_fp16 else 128),
        stage_index=() if a_fp16 else STAGED_COLUMN_INDEX,  # a16 stages its scales as they are: no spread
    )


def _rows_spread_per_register(dst: int, src: int, tables: int, mi: int) -> list[AsmOp]:
    """Row tile mi's 4 A scales (lanes of src) spread over its two 4x4 tiles' lanes at e32, LMUL 1:
    one gather per register of the first tile (tables, tables + 1: lane -> row), a copy for the second."""
    return [*(AsmOp("vrgather", f"vrgatherei16.vv v{dst + j}, v{src}, v{tables + j}",
                    f"A scales of rows {4 * mi + 2 * j}-{4 * mi + 2 * j + 1}") for j in range(2)),
            AsmOp("vmv", f"vmv2r.v v{dst + 2}, v{dst}", "the same rows for column tile 1")]


def _staged_fp32_fold(ma: int, acc, facc, vt: "_Vtype", per_register: bool) -> None:
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
            fold += _rows_spread_per_register(A, B, T + 2 * mi, mi)
        vt(None, "e32", "m4")
        if not per_register:
            fold.append(AsmOp("vrgather", f"vrgatherei16.vv v{A}, v{B}, v{T + 2 * mi}", f"A scales of rows {4 * mi}..{4 * mi + 3}, twice"))
        fold += [AsmOp("vfmul", f"vfmul.vv v{A}, v{A}, v{SB}", "scale_a * scale_b"),
                 AsmOp("vfmacc", f"vfmacc.vv v{facc[mi][0]}, v{acc[mi][0]}, v{A}", f"row tile {mi}, both column tiles")]


def _staged_fp16_fold(ma: int, vt: "_Vtype") -> None:
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


def _gathers_per_register(ops: tuple[AsmOp, ...]) -> bool:
    """Does every vrgather of ops run at LMUL 1 (spread = per_register)?"""
    lmul = "m1"
    for op in ops:
        if op.kind == "vset":
            lmul = op.text.split(",")[3].strip()  # vset{i}vli rd, avl, eSEW, mLMUL, ...
        elif op.kind == "vrgather" and lmul != "m1":
            return False
    return True


def _tile_end(acc: tuple[tuple[int, ...], ...], facc: tuple[tuple[int, ...], ...], direct_store: bool) -> tuple[AsmOp, ...]:
    """After the last block: the fp32 accumulator pairs to facc (for the C epilogue), or with
    `direct_store` whole tiles straight to C and edge tiles to facc."""
    na = len(acc[0])
    to_facc = tuple(op for mi, row in enumerate(facc) for ni, r in enumerate(row)
                    for op in (AsmOp("addi", f"addi t1, %[facc], {(mi * na + ni) * 64}"), AsmOp("vse32", f"vse32.v v{r}, (t1)")))
    if direct_store:
        # A whole tile (no bias) goes straight to C: one indexed store per accumulator pair, at byte
        # offsets r * ldc * 4 + q * 4 of lane 4r + q (built in the dead int32 accumulators).
        T, Q = acc[0][0], acc[0][1] if na > 1 else acc[1][0]
        to_c = [AsmOp("addi", "addi t1, %[idx], 64"), AsmOp("vle32", f"vle32.v v{T}, (t1)", "lane -> row r"),
                AsmOp("vmul", f"vmul.vx v{T}, v{T}, %[ldc4]", "r * ldc * 4"),
                AsmOp("vle32", f"vle32.v v{Q}, (%[idx])", "lane -> column q"), AsmOp("vsll", f"vsll.vi v{Q}, v{Q}, 2"),
                AsmOp("vadd", f"vadd.vv v{T}, v{T}, v{Q}", "byte offsets in C"),
                AsmOp("slli", "slli t2, %[ldc4], 2", "4 rows of C"), AsmOp("mv", "mv t0, %[c]")]
        for mi, row in enumerate(facc):
            if mi:
                to_c.append(AsmOp("add", "add t0, t0, t2"))
            for ni, r in enumerate(row):
                to_c += [AsmOp("addi", f"addi t1, t0, {16 * ni}"),
                         AsmOp("vsuxei32", f"vsuxei32.v v{r}, (t1), v{T}", f"C rows {4 * mi}.., cols {4 * ni}..")]
        return (AsmOp("vset", "vsetivli zero, 16, e32, m2, ta, ma"), AsmOp("beqz", "beqz %[full], 3f", "an edge tile: via facc"),
                *to_c, AsmOp("j", "j 4f"), AsmOp("label", "3:"), *to_facc, AsmOp("label", "4:"))
    return (AsmOp("vset", "vsetivli zero, 16, e32, m2, ta, ma"), *to_facc)


def _sets_vtype_first(body: list[AsmOp]) -> bool:
    """Does the loop body set vtype before its first instruction that depends on it? (Scalar
    instructions and whole-register loads do not.)"""
    for op in body:
        if op.kind == "vset":
            return True
        if not (op.kind in ("addi", "add") or re.match(r"vl\dre8\.v ", op.text)):
            return False
    return False


def _acc_zero(n_regs: int, on_vfp: bool, halves: bool = False) -> tuple[AsmOp, ...]:
    """The int32 accumulators = 0, one instruction per LMUL-8 group. `on_vfp` (the gemm folds leave
    ft1 alone): as +0.0f splats, whose bits are 0, so the FP unit does it while the integer unit
    unpacks B. `halves`: each group's first half on the integer unit, its second on the FP unit (the
    staged fold with per-register spreads, whose FP unit is as busy as its load unit and whose integer
    unit idles: LLVM's X60 schedule charges vfmv.v.f and vmv.v.i at LMUL 8 16 cycles each,
    docs/ime-isa.md §7; its LMUL-4 gathers keep the integer unit busy, so there they stay on the FP unit)."""
    ops: list[AsmOp] = [AsmOp("fmv", "fmv.w.x ft1, zero", "+0.0f")] if on_vfp else []
    vt = _Vtype(ops)
    for first, g in acc_groups(n_regs):
        parts = ((first, g // 2, False), (first + g // 2, g // 2, True)) if halves and g > 1 else ((first, g, on_vfp),)
        for r, n, fp in parts:
            vt(None, "e32", f"m{n}")
            what = f"int32 accumulators v{r}-v{r + n - 1}"
            ops.append(AsmOp("vfmv", f"vfmv.v.f v{r}, ft1", what) if fp else AsmOp("vmv", f"vmv.v.i v{r}, 0", what))
    return tuple(ops)


def _highest_pair_end(ops: tuple[AsmOp, ...]) -> int:
    """One past the highest vector register the ops may touch: operands above the accumulators
    are at most LMUL-4 groups (a few extra clobbers are harmless)."""
    regs = [int(r) for op in ops for r in re.findall(r"\bv(\d+)\b", op.text)]
    return min(32, max(regs, default=-4) + 4)


def _scale_load(spec: KernelSpec, dst: int, tmp: int, ni: int, vset, lanes: str = "e32, m1") -> list[AsmOp]:
    """The 4 B scales of columns 4ni..4ni+3 into dst as fp32: fp16 ones widened by vfwcvt.f.f.v."""
    if spec.scale_type == "fp16":
        return [AsmOp("addi", f"addi t1, %[sb], {ni * 8}"), vset(4, "e16", "mf2"),
                AsmOp("vle16", f"vle16.v v{tmp}, (t1)", f"B fp16 scales, cols {4 * ni}..{4 * ni + 3}"),
                AsmOp("vfwcvt", f"vfwcvt.f.f.v v{dst}, v{tmp}", "widened to fp32"), vset(4, *lanes.split(", "))]
    return [vset(4, *lanes.split(", ")), AsmOp("addi", f"addi t1, %[sb], {ni * 16}"),
            AsmOp("vle32", f"vle32.v v{dst}, (t1)", f"B scales, cols {4 * ni}..{4 * ni + 3}")]


def _ime_fold(spec: KernelSpec, acc: tuple[tuple[int, ...], ...], facc: tuple[tuple[int, ...], ...] = (),
              tables: tuple[int, int] | None = None) -> tuple[AsmOp, ...]:
    """Per block, on the int32 accumulator pairs (16 lanes = a 4x4 tile, lane 4r+q):
    facc += float(dot - zp[q] * sum_a[r]) * (scale_a[r] * scale_b[q]), or with MLAS block sums
    facc += float(dot) * (scale_a[r] * scale_b[q]) + blksum_a[r] * blksum_b[q].

    Row and column values are loaded 4 at a time and spread over the 16 lanes with vrgather
    (index tables: lane -> q and lane -> r). All fold registers are even pairs (LMUL 2) outside
    the accumulators; the A/B registers of the loop are dead by now and are reused. A gemv tile
    has one live row (lanes 0..3 of each pair): see _gemv_fold."""
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


def _tile_b_scales(spec: KernelSpec, vt: "_Vtype", n: int, dst: int, staging: int, lmul: tuple[str, str],
                   what: str = "") -> list[AsmOp]:
    """The tile's n B scales (at %[sb]) into v`dst` as fp32: fp16 ones loaded into v`staging` and widened
    by vfwcvt.f.f.v (the one instruction fp32 scales do not need). lmul: (fp16 LMUL, fp32 LMUL)."""
    if spec.scale_type == "fp16":
        vt(n, "e16", lmul[0])
        return [AsmOp("vle16", f"vle16.v v{staging}, (%[sb])", f"B fp16 scales, cols 0..{n - 1}"),
                AsmOp("vfwcvt", f"vfwcvt.f.f.v v{dst}, v{staging}", f"widened to fp32{what}")]
    vt(n, "e32", lmul[1])
    return [AsmOp("vle32", f"vle32.v v{dst}, (%[sb])", f"B scales, cols 0..{n - 1}{what}")]


def _fold_prologue(spec: KernelSpec, ops: list[AsmOp], vt: "_Vtype", ma: int, na: int, n: int, b_dst: int,
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


def _spread_16_lanes(ops: list[AsmOp], vt: "_Vtype", per_register: bool, dst: int, src: int, idx: int, what: str) -> None:
    """One e32 LMUL-2 vrgather (a 4x4 tile's 16 lanes) at the vtype in force, or with spread = per_register
    its two LMUL-1 halves, which read the one source register `src` (every index relative to it, below 8)."""
    if not per_register:
        ops.append(AsmOp("vrgather", f"vrgather.vv v{dst}, v{src}, v{idx}", what))
        return
    vt(8, "e32", "m1")
    ops.extend(AsmOp("vrgather", f"vrgather.vv v{dst + h}, v{src}, v{idx + h}", f"{what}, tile rows {2 * h}-{2 * h + 1}")
               for h in range(2))
    vt(16, "e32", "m2")


class _Vtype:
    """Appends a vsetvli/vsetivli only when the (vl, SEW, LMUL) asked for differs from the current one."""

    def __init__(self, ops: list[AsmOp]):
        self.ops, self.now = ops, None

    def __call__(self, vl: int | None, sew: str, lmul: str) -> None:
        if (vl, sew, lmul) != self.now:
            text = f"vsetvli t0, zero, {sew}, {lmul}, ta, ma" if vl is None else f"vsetivli zero, {vl}, {sew}, {lmul}, ta, ma"
            self.ops.append(AsmOp("vset", text))
            self.now = (vl, sew, lmul)


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
    vt = _Vtype(ops)
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


def _column_pair_fold(spec: KernelSpec, acc: tuple[tuple[int, ...], ...]) -> tuple[AsmOp, ...]:
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
    vt = _Vtype(ops)

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


# e16 index tables of _paired_column_fold (32 lanes each): lane -> row r of its 4x4 tile, and lane ->
# the B scale (lanes 16.. of the scale group) of column tile lane / 16, column q.
PAIRED_FOLD_INDEX = tuple((lane % 16) // 4 for lane in range(32)) + tuple(16 + 4 * (lane // 16) + lane % 4 for lane in range(32))
# spread = per_register: one e16 table per register (8 lanes used, 8 padding), for LMUL-1 vrgathers from the
# register holding the A scales (lanes 0..3) or the B scales (lanes 0..7): the lanes of rows 0-1 and of rows
# 2-3 of a 4x4 tile (-> row), then those of column tile 0 and of column tile 1 (-> column).
PER_REGISTER_FOLD_INDEX = tuple(v for table in ([0] * 4 + [1] * 4, [2] * 4 + [3] * 4, [0, 1, 2, 3] * 2, [4, 5, 6, 7] * 2)
                                for v in table + [0] * 8)


def _paired_column_fold(spec: KernelSpec, acc: tuple[tuple[int, ...], ...], facc: tuple[tuple[int, ...], ...],
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
    vt = _Vtype(ops)
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
            ops += _rows_spread_per_register(SA, S, tables, mi)
            vt(None, "e32", "m4")
        else:
            vt(None, "e32", "m4")
            ops.append(AsmOp("vrgather", f"vrgatherei16.vv v{SA}, v{S}, v{T_ROW}", f"A scales of rows {4 * mi}..{4 * mi + 3}, twice"))
        ops += [AsmOp("vfmul", f"vfmul.vv v{SA}, v{SA}, v{SB}", "scale_a * scale_b"),
                AsmOp("vfmacc", f"vfmacc.vv v{facc[mi][0]}, v{acc[mi][0]}, v{SA}", f"row tile {mi}, both column tiles")]
    return tuple(ops)


def _signed_fold(spec: KernelSpec, acc: tuple[tuple[int, ...], ...], free: list[int],
                 facc: tuple[tuple[int, ...], ...] = ()) -> tuple[AsmOp, ...]:
    """The fold of kernels whose loop ran on B - zp (ir.zero_points_in_b): facc += float(dot) *
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


def _gemv_facc_group(spec: KernelSpec, row: tuple[int, ...], loop_top: int) -> int | None:
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


def _gemv_fold(spec: KernelSpec, row: tuple[int, ...], facc: int | None = None) -> tuple[AsmOp, ...]:
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
        lmul = _lmul_name(g * sew * lanes // tn, 32)
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


def _a_scale_group(spec: KernelSpec) -> int:
    """A's block scales are row-major [Mpad][k_blocks], so a tile's rows are a strided load apart;
    the staged fold instead reads a tile's TM scales of one block with one unit-stride load
    ([Mpad / TM][k_blocks][TM]): LLVM's X60 schedule charges a strided load VLMAX cycles (8 at e32)
    and a unit-stride one 3 (docs/ime-isa.md §7)."""
    return spec.tile_m if spec.target == "ime" and staged(spec) else 1


def plan_kernel(spec: KernelSpec) -> KernelPlan:
    k_lo, k_hi = _k_pair(spec)
    a_index, rows_pad, tail = _a_index(spec)
    return KernelPlan(
        spec=spec,
        pack=_pack_layout(spec),
        zp_default=0 if spec.zero_point == "blksum" else 1 << (spec.bits - 1),
        k_lo=k_lo,
        k_hi=k_hi,
        a_index=a_index,
        a_scale_group=_a_scale_group(spec),
        a_rows_padded_to=rows_pad,
        a_tail_pad=tail,
        rvv=_rvv_types(spec) if spec.target == "rvv" else None,
        ime=_ime_plan(spec) if spec.target == "ime" else None,
        budget=register_budget(spec),
    )


def expected_vmadots(plan: KernelPlan, M: int, N: int, K: int) -> int:
    """vmadot instructions one matmul call executes: lets tests prove the IME path ran."""
    if plan.ime is None:
        return 0
    s = plan.spec
    tiles = -(-M // s.tile_m) * -(-N // s.tile_n)
    return tiles * -(-K // s.block) * plan.ime.vmadots_per_tile_block
