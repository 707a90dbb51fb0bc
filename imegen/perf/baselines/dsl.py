"""The baselines written in imegen's DSL, built, counted and modeled like imegen's own kernels:
  rvv-fp32    a straightforward RVV kernel: dequantize B to fp32, vfmacc (target rvv, compute
              fp32, VLEN 256; tile 4x16 for prefill, the gemv tile 1x16 for decode);
  llama-4x16  the layout of llama.cpp's hand-written SpacemiT IME micro-kernel expressed in the
              DSL (target ime, tile 4x16, k_unroll 2, planar nibbles, panel 16), for every M,
              as llama.cpp's M=1 path also runs 4-row vmadot tiles.
"""

from __future__ import annotations

BASELINES = ("llama-4x16", "rvv-fp32")


def baseline_settings(kind: str, block: int, M: int) -> dict[str, object]:
    common = {"bits": 4, "block": block, "zero_point": "asymmetric", "bias": "no", "k_unroll": 2,
              "unpack": "planar", "panel": 16, "scales": "inline"}
    if kind == "llama-4x16":
        return {**common, "op": "gemm", "compute": "int8", "target": "ime", "tile": "4x16"}
    if kind == "rvv-fp32":
        return {**common, "op": "gemv" if M == 1 else "gemm", "compute": "fp32", "target": "rvv", "vlen": 256,
                "tile": "1x16" if M == 1 else "4x16"}
    raise ValueError(kind)
