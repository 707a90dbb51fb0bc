"""How accurate would a `vmadot*.hp` decode (gemv) kernel be (results: docs/ime2-isa.md §10.8)? A NumPy model
of what it computes, step by step in FP16 as docs/ime2-isa.md §6.2 specifies the instruction, against ORT's
MatMulNBits accuracy_level 4 tolerance (|y - y_ref| <= 0.1 + 0.02 |y_ref|, y_ref the fp32 product of A and the
dequantized weights), at every Qwen2.5-0.5B MatMulNBits shape and on several kinds of data.

    python3 -m imegen.perf.hp_study                # a matrix of the cases and a summary (seconds)
    python3 -m imegen.perf.hp_study --full         # every path's errors per case
    python3 -m imegen.perf.hp_study --columns 1024 --rows 16   # docs/ime2-isa.md §10.8's run (half a minute)

What is modelled, per output column and 32-k block j (B in Q4_0's format: codes q, zero point 8, fp16 scale d):

- A quantized per block of 32 as CompInt8 does (scale = max|a| / 127, codes rounded to nearest); each int8 code
  split into a signed high nibble (a >> 4) and an unsigned low one (a & 15), as llama.cpp's IME2 kernels do (an
  int4 `.hp` multiplies 4-bit A), B read signed (q - 8).
- Per block two `.hp` steps into the FP16 accumulator H of the column: `H = fp16(H + fp16(fp16(t) * s))` with
  t the exact integer dot of the high nibbles (scale 16 s) and then of the low ones (scale s).
- Every S blocks (a super-block) H is added to the fp32 result and zeroed.

The FP16 scale s of block j, column c, by scheme:

- `absolute`: s = fp16(a_scale_j * d_cj): the instruction does all the scaling; the fold adds float(H).
- `normalized`: the A scales divided by a power of two per super-block (their maximum rounded up), the B scales
  by a power of two per column (their maximum over K, rounded up; a packing-time constant), and a headroom
  2^-h that keeps |H| below FP16's largest finite value for any codes (h from S); the fold multiplies H back
  (fp32, exact powers of two).
- `split3`: a `.hp` gemv kernel's arithmetic, step for step: three tile rows per activation row,
  the high nibbles (c >> 4), the low nibbles made signed ((c & 15) - 8) and ones (c = 16 hi + lp + 8), each
  with its own FP16 accumulator and the same scale s = fp16(fp16(sa / F) * fp16(d / D)), F a power of two per
  row (all of K) and D one per tensor that put the largest normalized scales in [0.5, 1); each accumulator
  added to its own fp32 sum every S blocks, the sums folded once at the end, ((G1 + 16 G0) + 8 G2) x F x D.
- `llama-i8i4`: what llama.cpp's K-blocks-of-32 Q4_0 kernel does: `.hp` with scales 16 and 1 (H = the block's
  dot in FP16), then a_scale * (d * H) in fp32 per block (S = 1).

The exact-integer path (imegen's int8 `vmadot` kernels: int32 dots, fp32 fold per block) is the baseline: its
error is A's quantization alone.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import numpy as np

from .workload import QWEN25_05B, shapes

BLOCK = 32
F16 = np.float16
FP16_MAX = 65504.0
# The most one block can add to |H| per unit of scale: |dot of high nibbles| <= 32 x 8 x 8 (times 16) plus
# |dot of low nibbles| <= 32 x 15 x 8.
BLOCK_H_BOUND = 32 * 8 * 8 * 16 + 32 * 15 * 8


def tolerance(y_ref: np.ndarray) -> np.ndarray:
    """ORT's MatMulNBits accuracy_level 4 operator-test tolerance: absolute 0.1 plus 2% of |y|."""
    return 0.1 + 0.02 * np.abs(y_ref)


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class Data:
    name: str
    weight_std: float  # of the fp32 weights before quantization
    act_std: float  # of the activations' ordinary channels
    outliers: tuple[tuple[float, float, float], ...] = ()  # (fraction of channels, low, high magnitude)


DATA = (
    Data("gaussian", 0.02, 1.0),
    Data("outliers 10-100", 0.02, 1.0, ((0.01, 10.0, 100.0),)),
    Data("outliers 10-100 + 0.1% 200-500", 0.02, 1.0, ((0.01, 10.0, 100.0), (0.001, 200.0, 500.0))),
    Data("small (subnormal products)", 0.002, 0.02),
    Data("small + outliers 1-5", 0.002, 0.02, ((0.01, 1.0, 5.0),)),
)


def weights(rng: np.random.Generator, n: int, k: int, d: Data) -> np.ndarray:
    """Gaussian weights, each output column's spread scaled by its own log-normal factor (real layers vary)."""
    col = np.exp(rng.normal(0.0, 0.3, (n, 1)))
    return (rng.normal(0.0, d.weight_std, (n, k)) * col).astype(np.float32)


def activations(rng: np.random.Generator, rows: int, k: int, d: Data) -> np.ndarray:
    """Gaussian activations; outlier channels (the same channels in every row, as in an LLM's hidden state)
    get magnitudes drawn from their range with a random sign."""
    a = rng.normal(0.0, d.act_std, (rows, k))
    for frac, lo, hi in d.outliers:
        ch = rng.choice(k, max(1, round(frac * k)), replace=False)
        a[:, ch] = rng.uniform(lo, hi, (rows, ch.size)) * rng.choice([-1.0, 1.0], (rows, ch.size))
    return a.astype(np.float32)


# ---------------------------------------------------------------- quantization (ORT's and CompInt8's)


def quantize_b_symmetric(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ORT's blockwise 4-bit symmetric quantizer (MatMulNBits without zero points): per block of 32 the value of
    largest magnitude m, scale = m / -8, q = clamp(round(w / scale) + 8, 0, 15); the scale stored as fp16 here
    (the Q4_0-equivalent config). Returns (codes (N, kb, 32) uint8, fp16 scales (N, kb))."""
    n, k = w.shape
    blocks = w.reshape(n, k // BLOCK, BLOCK)
    idx = np.abs(blocks).argmax(axis=2)
    m = np.take_along_axis(blocks, idx[..., None], axis=2)[..., 0]
    scale = (m / np.float32(-8.0)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1.0), scale)
    q = np.clip(np.rint(blocks / safe[..., None]) + 8, 0, 15).astype(np.uint8)
    return q, scale.astype(F16)


def quantize_a(a: np.ndarray, group: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """CompInt8's A quantization per block of 32 (group 1): scale = max|a| / 127, codes rounded to nearest, as
    int8; with group g one scale per g blocks (the last group may be shorter). Returns (codes (rows, kb, 32)
    int64, fp32 scales per block (rows, kb): a group's scale repeated)."""
    rows, k = a.shape
    blocks = a.reshape(rows, k // BLOCK, BLOCK)
    amax = np.abs(blocks).max(axis=2)
    for g0 in range(0, amax.shape[1], group):
        amax[:, g0:g0 + group] = amax[:, g0:g0 + group].max(axis=1, keepdims=True)
    scale = (amax / np.float32(127.0)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1.0), scale)
    codes = np.clip(np.rint(blocks / safe[..., None]), -127, 127).astype(np.int64)
    return codes, scale


# ---------------------------------------------------------------- the kernels' arithmetic


def fp16_step(h: np.ndarray, t: np.ndarray, s: np.ndarray) -> np.ndarray:
    """One `.hp` instruction on the accumulator cells: fp16(h + fp16(fp16(t) * s)) (three roundings)."""
    with np.errstate(over="ignore"):  # overflow to infinity is the instruction's behaviour, counted by the caller
        return (h + (t.astype(np.float64).astype(F16) * s)).astype(F16)


def headroom(S: int) -> int:
    """h with S x BLOCK_H_BOUND x 2^-h <= FP16_MAX: no codes can overflow H when every scale is <= 2^-h."""
    return max(0, math.ceil(math.log2(S * BLOCK_H_BOUND / FP16_MAX)))


def pow2_ceil(x: np.ndarray) -> np.ndarray:
    """The power of two >= x (1 where x is 0)."""
    e = np.ceil(np.log2(np.where(x > 0, x, 1.0)))
    return np.exp2(e)


def dots(a_codes: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact int dots per (row, column, block): of the whole codes, of the high and of the low nibbles."""
    b = q.astype(np.int64) - 8
    hi, lo = a_codes >> 4, a_codes & 15
    return (np.einsum("rjk,cjk->rcj", a_codes, b), np.einsum("rjk,cjk->rcj", hi, b),
            np.einsum("rjk,cjk->rcj", lo, b))


def int_path(dot: np.ndarray, a_scale: np.ndarray, d: np.ndarray) -> np.ndarray:
    """imegen's int8 path: per block float(dot) * (a_scale * d), accumulated in fp32."""
    f32 = np.float32
    scale = (a_scale[:, None, :] * d.astype(f32)[None, :, :]).astype(f32)
    y = np.zeros(dot.shape[:2], f32)
    for j in range(dot.shape[2]):
        y = (y + (dot[:, :, j].astype(f32) * scale[:, :, j]).astype(f32)).astype(f32)
    return y


def hp_path(t_hi: np.ndarray, t_lo: np.ndarray, a_scale: np.ndarray, d: np.ndarray, S: int,
            scheme: str) -> tuple[np.ndarray, dict]:
    """A `.hp` gemv: per block the high then the low nibbles' step into H, H folded into fp32 every S blocks.
    Returns (y, events: subnormal scales, infinite H cells)."""
    f32 = np.float32
    rows, cols, kb = t_hi.shape
    d32 = d.astype(f32)
    if scheme in ("normalized", "A per super-block"):
        col_norm = pow2_ceil(np.abs(d32).max(axis=1)).astype(f32)  # per column, all of K: a packing constant
        room = f32(2.0 ** -headroom(S))
    y = np.zeros((rows, cols), f32)
    h = np.zeros((rows, cols), F16)
    subnormal = infinite = 0
    for j in range(kb):
        g0 = j - j % S
        if scheme == "absolute":
            s = (a_scale[:, j, None] * d32[None, :, j]).astype(F16)
            back = np.ones((rows, 1), f32)
        elif scheme == "normalized":
            a_norm = pow2_ceil(a_scale[:, g0:g0 + S].max(axis=1)).astype(f32)  # per row and super-block
            s = (((a_scale[:, j] / a_norm)[:, None] * (d32[None, :, j] / col_norm[None, :])) * room).astype(F16)
            back = (a_norm[:, None] * col_norm[None, :]) / room
        elif scheme == "A per super-block":  # one A scale per super-block: the B scale alone, exact, in .hp
            s = ((d32[None, :, j] / col_norm[None, :]) * room).astype(F16) + np.zeros((rows, 1), F16)
            back = (a_scale[:, j, None] * col_norm[None, :]) / room
        else:
            raise ValueError(scheme)
        subnormal += int(np.count_nonzero((s != 0) & (np.abs(s.astype(f32)) < 2.0 ** -14)))
        h = fp16_step(h, t_hi[:, :, j], (s.astype(f32) * 16).astype(F16))
        h = fp16_step(h, t_lo[:, :, j], s)
        if j % S == S - 1 or j == kb - 1:
            infinite += int(np.count_nonzero(~np.isfinite(h)))
            y = (y + (h.astype(f32) * back).astype(f32)).astype(f32)
            h = np.zeros_like(h)
    return y, {"subnormal scales": subnormal, "infinite H": infinite}


def pow2_above(x: np.ndarray) -> np.ndarray:
    """2^(e+1) with e = floor(log2 x), for x > 0: the power of two that puts x / it in [0.5, 1). Exact: frexp's
    exponent is e + 1."""
    return np.ldexp(1.0, np.frexp(x)[1])


def split3_normalizers(a_scale: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, float]:
    """split3's exact powers of two: F per row (its largest A scale, if that is a positive normal finite fp32,
    else 1) and D per tensor (the largest |fp16 B scale| over every block and column, if finite and nonzero,
    else 1). Dividing by them puts the largest normalized scale in [0.5, 1)."""
    amax = a_scale.astype(np.float64).max(axis=1)
    normal = np.isfinite(amax) & (amax >= np.finfo(np.float32).tiny)
    F = np.where(normal, pow2_above(np.where(normal, amax, 1.0)), 1.0)
    dmax = float(np.abs(d.astype(np.float64)).max())
    D = float(pow2_above(dmax)) if math.isfinite(dmax) and dmax > 0 else 1.0
    return F, D


def split3_scales(a_scale: np.ndarray, d: np.ndarray, F: np.ndarray, D: float) -> np.ndarray:
    """The `.hp` scale of block b, row m, column n: fp16(sa_n * d_n), one fp16 multiply (the product of two fp16
    values is exact in float64, so the cast is its one rounding), sa_n = fp16(sa / F), d_n = fp16(d / D) (each
    division by a power of two is exact in float64 before its rounding). Returns (rows, cols, blocks) fp16."""
    sa_n = (a_scale.astype(np.float64) / F[:, None]).astype(F16)
    d_n = (d.astype(np.float64) / D).astype(F16)
    return (sa_n.astype(np.float64)[:, None, :] * d_n.astype(np.float64)[None, :, :]).astype(F16)


def split3_dots(a_codes: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three exact dots per (row, column, block) of split3's A tile rows: the signed high nibbles hi = c >> 4,
    the low nibbles made signed lp = (c & 15) - 8, and a row of ones (so that c = 16 hi + lp + 8), against B
    read signed (w = q - 8). Each |t| <= 32 x 8 x 8 = 2048: exact in fp16."""
    w = q.astype(np.int64) - 8
    hi, lp = a_codes >> 4, (a_codes & 15) - 8
    t2 = np.broadcast_to(w.sum(axis=2)[None], (a_codes.shape[0],) + w.shape[:2])
    return np.einsum("rjk,cjk->rcj", hi, w), np.einsum("rjk,cjk->rcj", lp, w), t2


def split3_fold(G0: np.ndarray, G1: np.ndarray, G2: np.ndarray, back: np.ndarray) -> np.ndarray:
    """c = 16 hi + lp + 8, so y = (G1 + 16 G0) + 8 G2, each step in fp32 (16x and 8x are exact), then times the
    normalizers' product F x D (fp32)."""
    f32 = np.float32
    y = ((G1 + f32(16) * G0).astype(f32) + f32(8) * G2).astype(f32)
    return (y * back).astype(f32)


def split3_path(a_codes: np.ndarray, a_scale: np.ndarray, q: np.ndarray, d: np.ndarray,
                S: int) -> tuple[np.ndarray, dict]:
    """The `.hp` gemv split3 models: per block three `.hp` steps, one per tile row (high nibbles, signed low
    nibbles, ones), each into its own FP16 accumulator with the same scale s; every S blocks each accumulator
    is added to its fp32 sum G_r and zeroed; the end folds the three sums (split3_fold). No headroom factor:
    d / D is below 1 and exact in fp16, so s <= 1 - 2^-11, a block adds at most 2047 to |H_r|, and H_r stays
    finite for any codes up to S = 32 (32 x 2047 = 65504; rounding is monotonic), not beyond. Returns (y,
    events: subnormal scales, infinite H cells)."""
    f32 = np.float32
    F, D = split3_normalizers(a_scale, d)
    s = split3_scales(a_scale, d, F, D)
    t = split3_dots(a_codes, q)
    kb = s.shape[2]
    G = [np.zeros(s.shape[:2], f32) for _ in t]
    H = [np.zeros(s.shape[:2], F16) for _ in t]
    infinite = 0
    for j in range(kb):
        H = [fp16_step(h, t_r[:, :, j], s[:, :, j]) for h, t_r in zip(H, t)]
        if j % S == S - 1 or j == kb - 1:
            infinite += sum(int(np.count_nonzero(~np.isfinite(h))) for h in H)
            G = [(g + h.astype(f32)).astype(f32) for g, h in zip(G, H)]
            H = [np.zeros_like(h) for h in H]
    back = (F.astype(f32) * f32(D)).astype(f32)[:, None]
    subnormal = int(np.count_nonzero((s != 0) & (np.abs(s.astype(f32)) < 2.0 ** -14)))
    return split3_fold(*G, back), {"subnormal scales": subnormal, "infinite H": infinite}


def llama_i8i4(t_hi: np.ndarray, t_lo: np.ndarray, a_scale: np.ndarray, d: np.ndarray) -> np.ndarray:
    """llama.cpp's blocks-of-32 Q4_0 kernel: H = the block's dot through `.hp` with scales 16 and 1, then
    a_scale * (d * H) in fp32 (B read signed here; llama.cpp starts H at fp16(8 sum(a)) with B unsigned, which
    rounds the same way or worse)."""
    f32 = np.float32
    one, sixteen = np.ones(t_hi.shape[:2], F16), np.full(t_hi.shape[:2], 16, F16)
    y = np.zeros(t_hi.shape[:2], f32)
    for j in range(t_hi.shape[2]):
        h = fp16_step(np.zeros_like(one), t_hi[:, :, j], sixteen)
        h = fp16_step(h, t_lo[:, :, j], one)
        y = (y + a_scale[:, j, None] * (d.astype(f32)[None, :, j] * h.astype(f32))).astype(f32)
    return y


# ---------------------------------------------------------------- the study


@dataclass(frozen=True)
class Result:
    shape: str
    data: str
    path: str
    total: float  # max |y - y_ref| / tolerance over the sampled outputs (<= 1 keeps ORT's tolerance)
    added: float  # max |y - y_int| / tolerance: what the path adds to the exact-integer path's error
    relative: float  # max |y - y_int| / rms(y_ref): the same, against the outputs' own scale
    events: str


def super_blocks(kb: int) -> list[int]:
    return sorted({s for s in (1, 2, 4, 8, kb) if s <= kb})


def study_shape(name: str, n: int, k: int, d: Data, columns: int, rows: int, seed: int) -> list[Result]:
    rng = np.random.default_rng(seed)
    cols = min(n, columns)
    w = weights(rng, cols, k, d)  # the sampled columns of the layer: each column's error depends on it alone
    q, scale = quantize_b_symmetric(w)
    a = activations(rng, rows, k, d)
    deq = (q.astype(np.float64) - 8) * scale.astype(np.float64)[..., None]
    y_ref = a.astype(np.float64) @ deq.reshape(cols, k).T
    a_codes, a_scale = quantize_a(a)
    dot, t_hi, t_lo = dots(a_codes, q)
    tol = tolerance(y_ref)

    y_int = int_path(dot, a_scale, scale).astype(np.float64)
    rms = float(np.sqrt(np.mean(y_ref ** 2))) or 1.0

    def result(path: str, y: np.ndarray, events: str = "") -> Result:
        y = y.astype(np.float64)
        with np.errstate(invalid="ignore"):
            total, added = np.abs(y - y_ref), np.abs(y - y_int)
        total, added = (np.where(np.isfinite(e), e, np.inf) for e in (total, added))
        return Result(name, d.name, path, float(np.max(total / tol)), float(np.max(added / tol)),
                      float(np.max(added) / rms), events)

    out = [result("int32 (exact dots, fp32 fold)", y_int),
           result("llama-i8i4 (.hp 16/1, fp32 fold per block)", llama_i8i4(t_hi, t_lo, a_scale, scale))]
    for scheme in ("absolute", "normalized"):
        for S in super_blocks(k // BLOCK):
            y, ev = hp_path(t_hi, t_lo, a_scale, scale, S, scheme)
            label = "whole K" if S == k // BLOCK and S > 8 else str(S)
            out.append(result(f".hp {scheme} S={label}", y, ", ".join(f"{v} {key}" for key, v in ev.items() if v)))
    for S in super_blocks(k // BLOCK)[1:]:
        g_codes, g_scale = quantize_a(a, S)
        _, g_hi, g_lo = dots(g_codes, q)
        y, ev = hp_path(g_hi, g_lo, g_scale, scale, S, "A per super-block")
        label = "whole K" if S == k // BLOCK and S > 8 else str(S)
        out.append(result(f".hp A per super-block S={label}", y,
                          ", ".join(f"{v} {key}" for key, v in ev.items() if v)))
    for S in super_blocks(k // BLOCK):
        y, ev = split3_path(a_codes, a_scale, q, scale, S)
        label = "whole K" if S == k // BLOCK and S > 8 else str(S)
        out.append(result(f".hp split3 S={label}", y, ", ".join(f"{v} {key}" for key, v in ev.items() if v)))
    return out


def run(columns: int = 256, rows: int = 4, seed: int = 1) -> list[Result]:
    out = []
    for i, s in enumerate(shapes(QWEN25_05B)):
        for j, d in enumerate(DATA):
            out += study_shape(s.name, s.N, s.K, d, columns, rows, seed + 100 * i + j)
    return out


def table(results: list[Result]) -> str:
    paths = list(dict.fromkeys(r.path for r in results))
    cases = list(dict.fromkeys((r.shape, r.data) for r in results))
    by = {(r.shape, r.data, r.path): r for r in results}
    lines = ["Worst over the sampled outputs, tol = 0.1 + 0.02 |y_ref| (ORT's level-4 tolerance; <= 1 keeps it):",
             "  total = |y - y_ref| / tol (y_ref: fp32 A x dequantized B); added = |y - y_int| / tol (y_int: the "
             "exact-integer path, CompInt8's own result);",
             "  rel = |y - y_int| / rms(y_ref). '*': added above 0.25 (less than 4x margin)."]
    for shape, data in cases:
        lines.append(f"{shape} ({data}):")
        lines.append(f"  {'path':46s} {'total':>9s} {'added':>9s}  {'rel':>8s}")
        for p in paths:
            r = by.get((shape, data, p))
            if r is None:
                continue
            flag = "*" if r.added > 0.25 else " "
            lines.append(f"  {p:46s} {r.total:9.4f} {r.added:9.4f}{flag} {r.relative:8.1e} {r.events}")
    return "\n".join(lines)


MATRIX = (("int32 total", "int32 (exact dots, fp32 fold)", "total"),
          ("llama", "llama-i8i4 (.hp 16/1, fp32 fold per block)", "added"),
          *((f"S={s}", f".hp normalized S={s}", "added") for s in ("1", "2", "4", "8", "whole K")),
          *((f"sp3 S={s}", f".hp split3 S={s}", "added") for s in ("1", "2", "4", "8")),
          ("sp3 whole K", ".hp split3 S=whole K", "added"),
          ("abs S=1 rel", ".hp absolute S=1", "relative"),
          ("A/8 S=8", ".hp A per super-block S=8", "added"))


def matrix(results: list[Result]) -> str:
    """One line per (shape, data): the exact-integer path's total error and what each `.hp` scheme adds, in
    units of ORT's tolerance ('sp3': split3; 'abs S=1 rel': the absolute scheme's added error against the
    outputs' rms)."""
    by = {(r.shape, r.data, r.path): r for r in results}
    cases = list(dict.fromkeys((r.shape, r.data) for r in results))
    head = f"{'shape':8s} {'data':32s} " + " ".join(f"{c[0]:>11s}" for c in MATRIX)
    lines = ["Added error / tol (tol = 0.1 + 0.02 |y_ref|), normalized scales unless named; int32 total = "
             "|y_int - y_ref| / tol:", head, "-" * len(head)]
    for shape, data in cases:
        cells = []
        for _, path, attr in MATRIX:
            r = by.get((shape, data, path))
            cells.append(f"{getattr(r, attr):11.3g}" if r else f"{'-':>11s}")
        lines.append(f"{shape:8s} {data:32s} " + " ".join(cells))
    return "\n".join(lines)


def summary(results: list[Result]) -> str:
    """Per path, the worst case over every shape and data kind."""
    lines = ["Summary: worst over every shape and data kind", f"  {'path':46s} {'total':>9s} {'added':>9s}  "
             f"{'rel':>8s}  worst added at"]
    for p in dict.fromkeys(r.path for r in results):
        mine = [r for r in results if r.path == p]
        w = max(mine, key=lambda r: r.added)
        lines.append(f"  {p:46s} {max(r.total for r in mine):9.4f} {w.added:9.4f}  "
                     f"{max(r.relative for r in mine):8.1e}  {w.shape}, {w.data}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m imegen.perf.hp_study",
                                 description="accuracy of a modelled vmadot .hp decode kernel against ORT's "
                                             "MatMulNBits level-4 tolerance, per Qwen2.5-0.5B shape")
    ap.add_argument("--columns", type=int, default=256, help="sampled output columns per shape (default 256)")
    ap.add_argument("--rows", type=int, default=4, help="activation rows per shape and data (default 4)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--full", action="store_true", help="every path's total, added and relative error per case")
    args = ap.parse_args(argv)
    if args.columns < 1 or args.rows < 1:
        print("error: --columns and --rows must be at least 1", file=sys.stderr)
        return 2
    results = run(args.columns, args.rows, args.seed)
    print(table(results) if args.full else matrix(results))
    print()
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
