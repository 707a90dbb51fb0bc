"""Where IME kernels keep packed B and quantized A: in the order vmadot reads them (32-byte tiles of
4 rows or columns x 8 k), k permuted to match the B unpack."""

from __future__ import annotations

from ...spec import KernelSpec
from .rules import staged


def pack_codes(spec: KernelSpec) -> tuple[str, str]:
    """(byte, shift) of code (c, kk) in a packed-B chunk: 32-byte vmadot B tiles, 4 columns x 8 bytes,
    column groups of a panel side by side."""
    np_ = spec.panel
    tile = "(c / 4) * 32 + (c % 4) * 8"
    if spec.bits == 8:
        return f"(kk / 8) * {np_ * 8} + {tile} + kk % 8", "0"
    if spec.unpack == "planar":  # byte j: k=j (low nibble), k=j+8 (high): vand/vsrl give k0-7, k8-15
        return f"(kk / 16) * {np_ * 8} + {tile} + kk % 8", "((kk % 16) / 8) * 4"
    # interleaved = ORT's own order: byte j holds k=2j, 2j+1
    return f"(kk / 16) * {np_ * 8} + {tile} + (kk % 16) / 2", "(kk % 2) * 4"


def a_index(spec: KernelSpec) -> tuple[str, int, int]:
    """A tiles hold k in the order the B tiles were unpacked into (see pack_codes)."""
    pos = "k" if (spec.bits == 8 or spec.unpack == "planar") else "(k / 16) * 16 + (k % 2) * 8 + (k % 16) / 2"
    if spec.tile_m == 1:  # gemv: one row, 8-k steps back to back; slide forms walk a 32-byte load
        return f"m * (Kpad + 32) + {pos}", 1, 32
    ma = spec.tile_m // 4
    # [row tile][8-k step][A tile mi][4 rows x 8 k]
    expr = (f"(((m / {spec.tile_m}) * (Kpad / 8) + ({pos}) / 8) * {ma} + (m % {spec.tile_m}) / 4) * 32"
            f" + (m % 4) * 8 + ({pos}) % 8")
    return expr, spec.tile_m, 0


def a_chunk_stride(spec: KernelSpec) -> int | None:
    """Bytes between a row's consecutive 8-k chunks of quantized A when k stays in order there (planar
    or 8-bit B; interleaved B permutes k within 16): the vector A quantization then stores a whole
    block's codes with one store (gemv: unit-stride; gemm: 8-byte elements TM x 8 bytes apart)."""
    if spec.abi != "imegen" or spec.block < 32 or (spec.bits == 4 and spec.unpack != "planar"):
        return None
    return 8 if spec.tile_m == 1 else spec.tile_m * 8


def a_scale_group(spec: KernelSpec) -> int:
    """The staged fold reads a tile's TM scales of one block with one unit-stride load
    ([Mpad / TM][k_blocks][TM]): LLVM's X60 schedule charges a strided load VLMAX cycles (8 at e32)
    and a unit-stride one 3 (docs/ime-isa.md §7)."""
    return spec.tile_m if staged(spec) else 1


def quantize_lmul(spec: KernelSpec) -> int:
    """IME harts have VLEN 256, so a block of BLK floats needs BLK / 8 registers (up to 8; the cost
    model charges a group's beats whatever vl is)."""
    return min(8, max(1, spec.block // 8))
