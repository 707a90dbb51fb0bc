"""The `llama.cpp real` tables: llama.cpp's real kernels next to imegen's like-for-like config, and the X60
model's calibration on them against llama.cpp's published K1 figures."""

from __future__ import annotations

from ..baselines.llama_cpp.rows import LlamaRow, calibration_points
from ..model import x60
from ..workload import PREFILL_M
from .tables import format_table, short_config


def table(rs: list[LlamaRow]) -> str:
    head = ["shape", "M", "llama 1t M", "imegen sym-fp16 1c M", "ratio", "llama 4t M/core", "llama 1c ms", "+lat",
            "llama 4c ms", "+lat", "imegen sym 1c ms", "imegen sym 4c ms", "1c core ms: llama", "imegen sym",
            "imegen config"]
    body = []
    for r in rs:
        t = r.times()
        i = r.imegen_sym
        li, ii = x60.total_instructions(r.one), (x60.total_instructions(i.counts) if i else float("nan"))
        body.append([r.case.shape, str(r.case.M), f"{li / 1e6:.3f}", f"{ii / 1e6:.3f}", f"{ii / li:.2f}",
                     f"{x60.total_instructions(r.four) / 1e6:.3f}", f"{t['1'][0] * 1e3:.4f}", f"{t['1'][1] * 1e3:.4f}",
                     f"{t['4'][0] * 1e3:.4f}", f"{t['4'][1] * 1e3:.4f}",
                     f"{i.one_core.time_s * 1e3:.4f}" if i else "-", f"{i.four_cores.time_s * 1e3:.4f}" if i else "-",
                     f"{x60.core_seconds(r.one) * 1e3:.4f}", f"{i.one_core.core_s * 1e3:.4f}" if i else "-",
                     short_config(i.spec) if i else "refused"])
    return format_table(head, body, right=set(range(1, 14)))


def calibration(rs: list[LlamaRow]) -> str:
    """Whole-model MODELED estimate from llama.cpp's real counts vs its published K1 figures."""
    points = calibration_points(rs)
    if points is None:
        return f"(calibration needs every Qwen shape at M = 1 and {PREFILL_M[-1]}: run without --quick)"
    lines = []
    for label, M, published, t in points:
        tps, tps_lat = M / t[0], M / t[1]
        occ = (f"; with LLVM's measured occupancies {M / t[2]:.1f} tok/s, optimism factor {M / t[2] / published:.2f}x"
               if t[2] is not None else "")
        lines.append(f"  {label}: MODELED {tps:.1f} tok/s (with latency sensitivity {tps_lat:.1f}); published "
                     f"{published} tok/s; optimism factor {tps / published:.2f}x ({tps_lat / published:.2f}x){occ}")
    return "\n".join(lines)
