"""The frozen KernelSpec: one kernel's settings after validation (imegen.ir builds and checks it). Every
stage after the DSL front end, the targets included, reads it; it depends on nothing but the spans."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import Span


@dataclass(frozen=True)
class KernelSpec:
    name: str
    op: str = "gemm"  # gemm (M>1, prefill) | gemv (M=1, decode)
    bits: int = 4  # weight bits: 4 | 8
    block: int = 32  # quantization block size along K
    zero_point: str = "symmetric"  # symmetric (implicit 2^(bits-1)) | asymmetric (ORT uint8-packed) | blksum (8-bit MLAS)
    bias: bool = False
    compute: str = "fp32"  # fp32 (dequantize B, fp32 FMA) | int8 (quantize A per block, integer dots)
    target: str = "scalar"  # ime | rvv | scalar
    vlen: int | None = None  # ime: 256; rvv: the smallest VLEN the kernel accepts
    tile_m: int = 1  # register-blocked output tile, rows
    tile_n: int = 16  # ... and columns
    k_unroll: int = 2  # K steps per inner-loop iteration (ime: 8-k vmadot steps; else single k)
    unpack: str = "planar"  # int4 nibble order in packed B: planar (k, k+8) | interleaved (k, k+1)
    panel: int = 16  # packed-B column panel width
    scales: str = "inline"  # scales/zero points: inline (ahead of each panel block) | separate | ort (raw ORT arrays)
    abi: str = "imegen"  # imegen (NAME_matmul) | mlas (ORT MLAS QNBitGemm dispatch entry points)
    scale_type: str = "fp32"  # packed-B scales: fp32 (ORT's) | fp16 (half the scale bytes, int8 compute only)
    stage_b: str = "tile"  # int4 B unpacked by each tile | once per M block into the workspace (staged_b_refusal)
    spread: str = "group"  # the fold spreads scales over the accumulator lanes by one vrgather per LMUL-4 group | per register (spread_refusal)
    a_scale_type: str = "fp32"  # A's block scales: fp32 (MLAS CompInt8) | fp16, rounded up, A quantized with it (a_fp16_refusal)
    hp_blocks: int = 0  # ime2 gemv: 0, or blocks per FP16 super-block of block-scaled `.hp` vmadots (hp_refusal)
    b_pack: str = "plain"  # ime2: plain | hp, B packed for the .hp gemv (signed codes, scales / D), read by its gemm too
    # Routing in the custom-op library (the generated code does not depend on these): the weight shapes
    # (N, K) the kernel was chosen for (empty: any), the fewest rows a gemm kernel is chosen for, and
    # whether it only runs slices whose thread cannot reach an IME hart.
    shapes: tuple[tuple[int, int], ...] = ()
    min_rows: int = 2
    fallback: bool = False
    source: Span | None = field(default=None, compare=False)

    def describe(self) -> str:
        """One line with every setting, for generated-file headers and tables."""
        vlen = f" vlen={self.vlen}" if self.vlen else ""
        return (
            f"op={self.op} bits={self.bits} block={self.block} zero_point={self.zero_point} "
            f"bias={'yes' if self.bias else 'no'} compute={self.compute} target={self.target}{vlen} "
            f"tile={self.tile_m}x{self.tile_n} k_unroll={self.k_unroll} unpack={self.unpack} "
            f"panel={self.panel} scales={self.scales} scale_type={self.scale_type} abi={self.abi}"
            + (f" stage_b={self.stage_b}" if self.stage_b != "tile" else "")
            + (f" spread={self.spread}" if self.spread != "group" else "")
            + (f" a_scale_type={self.a_scale_type}" if self.a_scale_type != "fp32" else "")
            + (f" hp_blocks={self.hp_blocks}" if self.hp_blocks else "")
            + (f" b_pack={self.b_pack}" if self.b_pack != "plain" else "")
            + self.describe_routing()
        )

    def describe_routing(self) -> str:
        """The routing settings that differ from their defaults, as ` key=value` words."""
        return ((f" shapes={','.join(f'{n}x{k}' for n, k in self.shapes)}" if self.shapes else "")
                + (f" min_rows={self.min_rows}" if self.min_rows != 2 else "")
                + (" fallback=yes" if self.fallback else ""))


@dataclass(frozen=True)
class AttentionSpec:
    """An attention kernel: O = softmax(scale Q K^T, causal per row) V for a tile of query rows sharing one KV
    head, streamed over the keys in blocks with an online softmax (flash attention). fp32."""

    name: str
    target: str = "rvv"
    vlen: int | None = None  # the smallest VLEN the kernel accepts
    q_rows: int = 4  # query rows computed together (each key block is loaded once for all of them)
    kv_block: int = 16  # keys per block: one score vector per query row
    source: Span | None = field(default=None, compare=False)

    def describe(self) -> str:
        vlen = f" vlen={self.vlen}" if self.vlen else ""
        return f"attention target={self.target}{vlen} tile={self.q_rows}x{self.kv_block}"
