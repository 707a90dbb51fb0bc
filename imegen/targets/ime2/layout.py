"""Where IME2 kernels keep packed B and quantized A: in the order vmadot reads them at VLEN 1024, 128-byte
tiles of 8 rows (A) or 8 columns (B) x 16 k, row after row (docs/ime2-isa.md §2, §10.2).

4-bit B keeps 32 k of a column in its tile's 16 bytes: the kernel's vand gives one 16-k step, its vsrl the
next. Which k each nibble holds (`unpack`) decides A's k order: planar keeps k in order, interleaved (ORT's
own byte order) puts the even k of each 32 in the first step and the odd k in the second.
"""

from __future__ import annotations

import numpy as np

from ...spec import KernelSpec
from .rules import A_TILE_BYTES, K_STEP, TILE_COLUMNS, TILE_ROWS, tiles


def pack_codes(spec: KernelSpec) -> tuple[str, str]:
    """(byte, shift) of code (c, kk) in a packed-B chunk: per k group (16 k for 8-bit codes, 32 for 4-bit) the
    panel's B tiles side by side, column c's 16 bytes at (c % 8) * 16 in tile c / 8 (byte 16 j + k is B[k][j])."""
    np_ = spec.panel
    tile = f"(c / {TILE_COLUMNS}) * {A_TILE_BYTES} + (c % {TILE_COLUMNS}) * {K_STEP}"
    group = f"{np_ * K_STEP}"  # bytes of one k group across the panel
    if spec.bits == 8:
        return f"(kk / 16) * {group} + {tile} + kk % 16", "0"
    if spec.unpack == "planar":  # byte j: k = j (low nibble), k = j + 16 (high): vand/vsrl give k 0-15, 16-31
        return f"(kk / 32) * {group} + {tile} + kk % 16", "((kk % 32) / 16) * 4"
    # interleaved = ORT's order: byte j holds k = 2j (low), 2j + 1 (high)
    return f"(kk / 32) * {group} + {tile} + (kk % 32) / 2", "(kk % 2) * 4"


def _a_position(spec: KernelSpec) -> str:
    """C expr in k: where A's k goes in its row, so that A's k-step order matches the unpacked B (pack_codes)."""
    if spec.bits == 8 or spec.unpack == "planar":
        return "k"
    return "(k / 32) * 32 + (k % 2) * 16 + (k % 32) / 2"


# Bytes a gemv row's loads read past its last k: one whole-register A load (128 bytes) feeds up to SLIDES
# k-steps from wherever it starts, at the latest the row's final 16 bytes.
GEMV_TAIL = A_TILE_BYTES - K_STEP


def a_index(spec: KernelSpec) -> tuple[str, int, int]:
    """(C expr in m, k, Kpad: A[m][k]'s byte in the workspace; rows padded to; tail bytes)."""
    pos = _a_position(spec)
    if spec.tile_m == 1:  # gemv: the row's k in order; a load at k-step s feeds vmadot (s) .. vmadot3 (s + 3)
        return f"m * (Kpad + {GEMV_TAIL}) + {pos}", 1, GEMV_TAIL
    ma, _ = tiles(spec)
    # [row tile][16-k step][A tile mi][8 rows x 16 k]
    expr = (f"(((m / {spec.tile_m}) * (Kpad / {K_STEP}) + ({pos}) / {K_STEP}) * {ma} + (m % {spec.tile_m}) / {TILE_ROWS})"
            f" * {A_TILE_BYTES} + (m % {TILE_ROWS}) * {K_STEP} + ({pos}) % {K_STEP}")
    return expr, spec.tile_m, 0


def a_step_bytes(spec: KernelSpec) -> int:
    """Bytes between a row's consecutive 16-k steps in the A workspace (a_index): gemv, 16 (k back to back);
    gemm, one k-step's A tiles of the row tile ({TM / 8} x 128 bytes). templates/quantize_ime2.c.j2 stores
    a whole block's codes with it."""
    return K_STEP if spec.tile_m == 1 else tiles(spec)[0] * A_TILE_BYTES


def a_scale_group(spec: KernelSpec) -> int:
    """gemm: A's block scales [row tile][block][TM], so the fold loads a tile's TM scales of a block with one
    unit-stride load (an indexed or strided load costs an element per cycle); gemv: one row, row-major."""
    return 1 if spec.tile_m == 1 else spec.tile_m


def quantize_lmul(spec: KernelSpec) -> int:
    """LMUL of the A quantizer's fp32 groups: the least that holds a block at VLEN 1024 (32 floats per register),
    so a block takes one pass of its loops and no vector instruction works on lanes past it (the A100's vector
    units take time by register group, not by vl)."""
    return min(8, max(1, spec.block // 32))


def pair_code_order(spec: KernelSpec) -> tuple[int, ...]:
    """templates/quantize_ime2.c.j2's pair_order (4-bit interleaved B, block 32): two blocks' codes (lane 32 b + k)
    in the order one strided segment store of 16-byte segments a_step_bytes apart writes them. Segment s holds
    16-k step s of the pair (block s // 2; even k for s even, odd k for s odd: _a_position), its first 8 bytes
    from register `lo` (entries 0..31: 8 per segment), its last 8 from `hi` (entries 32..63)."""
    return tuple(16 * half + 32 * (s // 2) + 2 * j + s % 2 for half in range(2) for s in range(4) for j in range(8))


def a_group_rows(spec: KernelSpec, sums_unused: bool) -> int:
    """Rows of A templates/quantize_ime2.c.j2 quantizes a block of at once: a row tile of 8 where its two A tiles
    of a block lie back to back (8-row tiles, interleaved 4-bit B in blocks of 32) and the kernel reads no code
    sums (kernel.gemm_zp_in_loop), else 0 (row by row)."""
    ok = (sums_unused and spec.tile_m == TILE_ROWS and spec.bits == 4 and spec.unpack == "interleaved"
          and spec.block == 2 * K_STEP and spec.a_scale_type == "fp32")
    return TILE_ROWS if ok else 0


def hp_packed_scales(half, widths: list[int]):
    """The scales a b_pack = hp kernel computes with (float64 [N, kb]): per column slice (each packed alone),
    finish_pack divides the stored FP16 scales by D, the power of two that brings the slice's largest finite |scale|
    into [0.5, 1), and the kernel multiplies its results by D: exact unless a quotient falls below FP16's normal
    range, where it rounds (to nearest even)."""
    out = np.empty(half.shape, np.float64)
    n0 = 0
    for width in widths:
        part = half[n0:n0 + width]
        top = np.abs(part[np.isfinite(part)]).astype(np.float64).max(initial=0.0)
        D = 2.0 ** np.frexp(top)[1] if top > 0 else 1.0
        out[n0:n0 + width] = (part.astype(np.float64) / D).astype(np.float16).astype(np.float64) * D
        n0 += width
    return out
