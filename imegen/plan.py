"""Stage 3: KernelSpec -> KernelPlan, every number and layout formula the templates need.

Templates only place what is decided here: packed-B and A-workspace index formulas (as C
expressions), and the target's own part (its Target.lower): RVV type names, or for IME the fixed
register map and the inner-loop instruction list with each vmadot already encoded.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import targets
from .ir import register_budget
from .spec import KernelSpec
from .targets.base import Target, byte_row_k_pair, default_zero_point

# M blocking: the rows of A's workspace one pass over all N tiles reuses stay within 3/4 of the K1's
# 512 KB cluster L2, so A is read from L2 (and the packed B streamed once per M block) instead of A
# streaming from DRAM once per N tile. B has no reuse across M blocks (it streams through the
# remaining quarter), so the larger the block the fewer times B streams: at K = 4864 (Qwen's down
# projection) 64 rows instead of 40, i.e. 2 passes of B instead of 4 at M = 128.
A_BLOCK_BYTES = 384 * 1024


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
    finished: bool = False  # the target's finish_pack reworks the chunks and writes an fp32 factor after the last

    @property
    def tail_bytes(self) -> int:
        """Bytes after the last chunk: the gemv fold loads a tile's nibble zero points as TN bytes (at SEW 16,
        the vl its slides and scales use), TN / 2 of them past its own; finish_pack's fp32 factor."""
        return max(self.zp_tile_n // 2, 4 if self.finished else 0)

    @property
    def tail_why(self) -> str:
        return "B's fp32 factor (finish_pack)" if self.finished else "the fold's zero-point load reads past the last"

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
class KernelPlan:
    spec: KernelSpec
    pack: PackLayout
    zp_default: int
    k_lo: str  # C expr in kp: first k of byte-row kp (rvv/scalar)
    k_hi: str  # ... second k (4-bit only)
    a_index: str  # C expr in m, k, Kpad: byte/element offset of A[m][k] in the workspace
    a_scale_group: int  # A's block scales by groups of this many rows (Target.a_scale_group; 1: row-major)
    a_rows_padded_to: int
    a_tail_pad: int  # extra workspace bytes read past the last row (IME gemv loads 32 bytes)
    budget: dict
    target: Target
    rvv: object | None = None  # target rvv's part (targets.rvv.kernel.RvvPlan)
    ime: object | None = None  # the vmadot targets' part, ime's and ime2's (targets.ime.asm.ImePlan)
    a_block_bytes: int = A_BLOCK_BYTES
    forced_k_chunks: int = 0  # 0: each call picks its K chunks (k_chunks()); n: always n (counting runs)

    @property
    def a_scale_index(self) -> str:
        """C expr in m, blk, kb: the element offset of A row m's block-blk scale."""
        g = self.a_scale_group
        return "m * kb + blk" if g == 1 else f"((m / {g}) * kb + blk) * {g} + m % {g}"

    @property
    def a_row_tail(self) -> str:
        """C expr in m, Kpad: where row m's a_tail_pad bytes start (gemv: right after its Kpad codes, Target.a_index)."""
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
        """Bytes between a row's consecutive 8-k chunks of quantized A (see a_index) when the target's
        vector A quantization stores a whole block's codes into the kernel's layout with one store and
        sums them with one reduction (Target.a_chunk_stride). None: copy them one by one."""
        return self.target.a_chunk_stride(self.spec)

    @property
    def a_scale_row_bytes(self) -> str:
        """C expr in kb: bytes between consecutive rows' scales of one block (within a group: adjacent)."""
        size = f"sizeof({self.a_scale_ctype})"
        return size if self.a_scale_group > 1 else f"kb * {size}"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def exact_on_exact_data(self) -> bool:
        """Is the kernel exact on exactly representable data (check.py compares it so)? Target.exact_on_exact_data."""
        return self.target.exact_on_exact_data(self.spec)

    @property
    def a_row_start(self) -> str:
        """C expr in m, Kpad: where row m's codes start (gemv rows: Kpad codes then a_tail_pad bytes)."""
        return f"m * (Kpad + {self.a_tail_pad})"

    @property
    def blksum(self) -> bool:
        """MLAS's 8-bit BlkSum contract: B codes stored signed (q - 128), and zero points enter as
        C += A_blksum[m, b] * B_blksum[n, b] with A_blksum = a_scale * sum(qa), B_blksum = b_scale * (128 - zp)."""
        return self.spec.zero_point == "blksum"

    @property
    def runtime_bias(self) -> bool:
        """MLAS passes the bias (or NULL) at run time; imegen's ABI fixes it in the spec."""
        return self.spec.abi == "mlas"


def _pack_layout(spec: KernelSpec, target: Target) -> PackLayout:
    np_, blk = spec.panel, spec.block
    stored = spec.scales != "ort"  # abi mlas reads ORT's raw scale/zero-point arrays instead
    scale_bytes = (2 if spec.scale_type == "fp16" else 4) * np_ if stored else 0
    nibbles = target.zp_nibbles(spec)
    zp_cols = np_ // 2 if nibbles else np_
    zp_bytes = -(-zp_cols // 4) * 4 if stored and spec.zero_point == "asymmetric" else 0  # keep data 4-byte aligned
    inline = spec.scales == "inline"
    byte, shift = target.pack_codes(spec)
    data_bytes = np_ * blk * spec.bits // 8
    return PackLayout(np_, data_bytes, inline, scale_bytes, zp_bytes, byte, shift, nibbles, spec.tile_n if nibbles else 0,
                      bool(target.finishes_pack(spec)))


def plan_kernel(spec: KernelSpec) -> KernelPlan:
    target = targets.of(spec)
    k_lo, k_hi = byte_row_k_pair(spec)
    a_index, rows_pad, tail = target.a_index(spec)
    pack = _pack_layout(spec, target)
    parts = {target.plan_part: target.lower(spec, pack)} if target.plan_part else {}
    return KernelPlan(
        spec=spec,
        pack=pack,
        zp_default=default_zero_point(spec),
        k_lo=k_lo,
        k_hi=k_hi,
        a_index=a_index,
        a_scale_group=target.a_scale_group(spec),
        a_rows_padded_to=rows_pad,
        a_tail_pad=tail,
        budget=register_budget(spec),
        target=target,
        **parts,
    )


def expected_vmadots(plan: KernelPlan, M: int, N: int, K: int) -> int:
    """vmadot instructions one matmul call executes: lets tests prove the IME path ran."""
    if plan.ime is None:
        return 0
    s = plan.spec
    tiles = -(-M // s.tile_m) * -(-N // s.tile_n)
    return tiles * -(-K // s.block) * plan.ime.vmadots_per_tile_block
