"""IME2's rules: what an A100 vmadot kernel can be (the DSL refusals of its own settings) and its vector
register budget. docs/ime2-isa.md §10 lists them with their reasons."""

from __future__ import annotations

from ...spec import KernelSpec
from ..base import Refuse, refuse_k_step

IME2_VLEN = 1024  # the A100's fixed VLEN: vmadot's int8 tile is 8 x 16 x 8 there and nowhere else
TILE_ROWS = 8  # rows of A (and of C) one vmadot multiplies
TILE_COLUMNS = 8  # columns of B (and of C)
K_STEP = 16  # int8 k values per vmadot: 16 bytes of each A row and B column
A_TILE_BYTES = TILE_ROWS * K_STEP  # one vector register at VLEN 1024: 128 bytes
SLIDES = 4  # vmadot, vmadot1, vmadot2, vmadot3: k-steps one A register feeds a gemv row
# The gemv and gemm ort-accelerate --target k3 derives (not tuned per shape: `imegen tune` searches under the X60
# model only): the 4-bit ones of examples/ime2_k3.imegen (tests/test_k3.py holds them equal), which pack B alike
# (32-column panels, ORT's nibble order), so one copy of B serves both; k_unroll by serving_k_unroll.
SERVING = {"gemv": {"tile": "1x32", "unpack": "interleaved", "panel": 32},
           "gemm": {"tile": "8x32", "unpack": "interleaved", "panel": 32}}


# abi = mlas: MLAS offsets packed B by RangeStartN * ldb, RangeStartN a multiple of 16 (its thread ranges), so a
# panel may not be wider than 16 columns: 16 = two B tiles, and an output tile spans at most one panel.
MLAS_PANEL = 16


def mlas_refusal(spec: KernelSpec) -> tuple[str, str] | None:
    """(setting, why) when an abi = mlas kernel cannot be an IME2 kernel behind MLAS's QNBitGemm dispatch."""
    if spec.bits == 8:
        return "bits", ("abi mlas with target ime2 serves 4-bit weights: MLAS runs 8-bit ones only through its BlkSum "
                        "contract (codes stored signed, zero points as per-block sums), whose fold IME2 kernels do "
                        "not have; use abi = imegen (the custom-op library) for 8-bit weights on the K3")
    if spec.tile_n > MLAS_PANEL:
        return "tile", (f"abi mlas with target ime2: tile width {spec.tile_n} spans two panels; MLAS hands column "
                        f"ranges starting at multiples of {MLAS_PANEL}, so B is packed in {MLAS_PANEL}-column panels "
                        f"and a tile is at most {MLAS_PANEL} wide (e.g. tile = 1x16, 8x16 with panel = 16)")
    return None


# hp_blocks: the one shape its asm is written for (kernel.hp_plan): a row of 32 columns, four 8-column `.hp` tiles, one
# 4-bit block of 32 k per `vmadot.hp ..., i4` (its A row holds 32 4-bit values), Q4_0's format (symmetric, fp16
# scales ahead of each panel block).
HP_SHAPE = {"op": "gemv", "tile_m": 1, "tile_n": 32, "panel": 32, "bits": 4, "block": 32, "zero_point": "symmetric",
            "scale_type": "fp16", "scales": "inline", "unpack": "interleaved", "abi": "imegen"}


# ort-accelerate --decode hp: the serving gemv with these settings (examples/ime2_k3.imegen's q40_decode_hp_k3:
# FP16 sums per 2 blocks, which keep ORT's level-4 tolerance with a 3x margin at every Qwen2.5-0.5B shape) and the
# gemm reading the B it packs (q40_prefill_hp_k3), so that one packed copy serves both.
HP_SERVING = {"gemv": {"scale_type": "fp16", "hp_blocks": 2}, "gemm": {"scale_type": "fp16", "b_pack": "hp"}}


def _differing_setting(spec: KernelSpec, shape: dict[str, object]) -> str | None:
    """The first DSL setting of spec outside `shape` (tile_m and tile_n are the DSL's `tile`), None if none is."""
    key = next((k for k, want in shape.items() if getattr(spec, k) != want), None)
    return {"tile_m": "tile", "tile_n": "tile"}.get(key, key)


def hp_refusal(spec: KernelSpec) -> str | None:
    """Why `hp_blocks` cannot be set for spec (None: it can). A `.hp` vmadot multiplies 4-bit A by 4-bit B and scales
    each block's products by an FP16 value per column into FP16 accumulators (docs/ime2-isa.md §10.8). Asked of
    other targets' specs too (targets.option_refusal), as target ime's options are."""
    if spec.target != "ime2":
        return "hp_blocks chooses IME2's block-scaled `.hp` vmadots; it needs target = ime2"
    differs = _differing_setting(spec, HP_SHAPE)
    return differs and (f"hp_blocks is generated for a gemv row of 32 columns in Q4_0's format (op = gemv, tile = 1x32, "
                        f"panel = 32, bits = 4, block = 32, zero_point = symmetric, scale_type = fp16, scales = inline, "
                        f"unpack = interleaved, abi = imegen); {differs} differs")


# b_pack = hp on a gemm: the in-register 8x32 gemm that subtracts zero points in its k loop (kernel.gemm_zp_in_loop),
# in the .hp gemv's format, reads B as the .hp gemv packs it: one packed copy serves a node's decode and prefill.
HP_GEMM_SHAPE = {**{k: v for k, v in HP_SHAPE.items() if k not in ("op", "tile_m")}, "op": "gemm", "tile_m": 8}


def b_pack_refusal(spec: KernelSpec) -> str | None:
    """Why `b_pack = hp` cannot be set for spec (None: it can; asked of other targets' specs too)."""
    if spec.target != "ime2":
        return "b_pack = hp packs B for IME2's block-scaled `.hp` gemv; it needs target = ime2"
    if spec.op == "gemv":
        return None if spec.hp_blocks else ("b_pack = hp: the int8 gemv reads B as plainly packed; the gemv that reads "
                                            "this packing is the `.hp` one (set hp_blocks)")
    differs = _differing_setting(spec, HP_GEMM_SHAPE)
    return differs and (f"b_pack = hp is generated for the 8x32 gemm in Q4_0's format (tile = 8x32, panel = 32, "
                        f"bits = 4, block = 32, zero_point = symmetric, scale_type = fp16, scales = inline, "
                        f"unpack = interleaved, abi = imegen); {differs} differs")


def serving_k_unroll(block: int) -> int:
    """Two 16-k steps per iteration (a 4-bit byte row holds two) where the block allows it, else one."""
    return 2 if block % (2 * K_STEP) == 0 else 1


def tiles(spec: KernelSpec) -> tuple[int, int]:
    """(A tiles down the output tile, B tiles across): a gemv row uses one A tile's row 0."""
    return max(1, spec.tile_m // TILE_ROWS), spec.tile_n // TILE_COLUMNS


def validate(spec: KernelSpec, refuse: Refuse) -> None:
    """Refuse what an A100 cannot run as this target generates it (int8 vmadot, 4-bit B unpacked to int8)."""
    if spec.compute != "int8":
        refuse("compute", "vmadot multiplies int8 operands; target ime2 needs compute = int8 (A quantized per block, "
               "4-bit B unpacked to int8); use rvv or scalar for fp32")
    if spec.vlen not in (None, IME2_VLEN):
        refuse("vlen", f"IME2's 8x16x8 int8 vmadot tile exists only at VLEN = {IME2_VLEN} (the K3's A100 cores), "
               f"not {spec.vlen}")
    if spec.tile_n % TILE_COLUMNS:
        refuse("tile", f"tile width {spec.tile_n} is not a multiple of vmadot's {TILE_COLUMNS} output columns (IME2)")
    if spec.tile_m != 1 and spec.tile_m % TILE_ROWS:
        refuse("tile", f"tile height {spec.tile_m} is neither 1 (gemv, one live row) nor a multiple of vmadot's "
               f"{TILE_ROWS} rows (IME2)")
    if spec.bits == 4 and spec.k_unroll % 2:
        refuse("k_unroll", "4-bit IME2 needs an even k_unroll: one 128-byte B register unpacks into two 16-k "
               "vmadot steps (low nibbles, high nibbles)")
    refuse_k_step(spec, refuse, K_STEP, f"{K_STEP}*k_unroll")


def a_registers(spec: KernelSpec) -> int:
    """A registers of one loop iteration: gemm, one per (k-step, A tile); gemv, an even pair per 4 k-steps
    (vmadot1..3 read vs1 + 1 too), or one when no slide runs (k_unroll 1)."""
    if spec.tile_m == 1:
        return 1 if spec.k_unroll == 1 else 2 * -(-spec.k_unroll // SLIDES)
    return tiles(spec)[0] * spec.k_unroll


def b_registers(spec: KernelSpec) -> int:
    """B registers of one loop iteration: 8-bit, one per (k-step, B tile); 4-bit, per two k-steps and B tile
    the raw codes (their high nibbles after the unpack) and the low nibbles: the same count."""
    return tiles(spec)[1] * spec.k_unroll


def register_budget(spec: KernelSpec) -> dict[str, int]:
    """Vector registers the k loop keeps live, by class (the fold runs after the asm, on the stored int32 dots)."""
    if spec.hp_blocks:  # kernel.hp_plan's map
        return {"FP16 accumulators": 4, "fp32 accumulators": 8, "A": 1, "B tiles": 4, "scales": 2}
    ma, na = tiles(spec)
    return {"int32 accumulators": 2 * ma * na, "A tiles": a_registers(spec), "B tiles": b_registers(spec)}
