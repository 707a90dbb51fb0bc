"""llama.cpp's real kernels against NumPy: what ime1 computes for Q4_0 (symmetric int4 weights q - 8,
block 32, one fp16 scale per block; A quantized per 32 to Q8 with an fp32 scale amax/127, rounded to
nearest even; integer dots by vmadot, folded in fp32), and a full run of the loop compared with it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from .... import toolchain
from ....toolchain import ToolchainError
from ...count.measure import VLEN
from .build import LlamaExe


def reference(w_blocks: bytes, A: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(Q4_0 x Q8 result, bound): Q4_0 dequantized exactly, A quantized per 32 as ime1 does
    (scale = amax * (1/127) in fp32, codes = round-half-even(a * (1/scale)))."""
    kb = K // 32
    raw = np.frombuffer(w_blocks, dtype=np.uint8).reshape(N, kb, 18)
    d = raw[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float64)
    qs = raw[:, :, 2:]
    q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.int64) - 8  # (N, kb, 32): j and j + 16
    Ab = A.astype(np.float32).reshape(A.shape[0], kb, 32)
    sa = (np.abs(Ab).max(axis=2) * np.float32(1.0 / 127)).astype(np.float32)
    inv = np.divide(np.float32(1), sa, out=np.zeros_like(sa), where=sa != 0).astype(np.float32)
    qa = np.clip(np.rint((Ab * inv[:, :, None]).astype(np.float32)), -128, 127).astype(np.int64)
    dots = np.einsum("mbk,nbk->mnb", qa, q)  # exact integer per-block dots
    terms = dots * sa.astype(np.float64)[:, None, :] * d[None, :, :]
    return terms.sum(axis=2), np.abs(terms).sum(axis=2)


def validate(b: LlamaExe, M: int, N: int, K: int, nth: int, work: Path) -> float:
    """Run the full loop with `nth` threads and compare C with the NumPy model; returns max err / bound."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = [toolchain.QEMU, "-L", str(toolchain.SYSROOT), "-cpu", toolchain.qemu_cpu(VLEN),
           str(b.exe), "full", str(M), str(N), str(K), str(nth), str(work)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise ToolchainError("llama.cpp driver failed", cmd, proc.returncode, proc.stdout, proc.stderr)
    A = np.fromfile(work / "a.bin", dtype=np.float32).reshape(M, K)
    C = np.fromfile(work / "c.bin", dtype=np.float32).reshape(M, N)
    want, bound = reference((work / "w.bin").read_bytes(), A, N, K)
    ratio = float((np.abs(C - want) / (1e-6 * bound + 1e-30)).max())
    if not np.isfinite(C).all() or ratio > 1.0:
        raise ToolchainError(f"llama.cpp real {M}x{K}x{N} ({nth} threads) differs from NumPy: max err "
                             f"{ratio:.3g} x (1e-6 x sum|terms|)", cmd)
    return ratio
