"""Independent NumPy reference for ONNX Runtime's com.microsoft MatMulNBits.

Deliberately self-contained (imports nothing else from imegen): it is the oracle the
generated kernels are judged against, so it must not share code with them.

Orientation follows ORT: W is [K, N] (MatMul's B), the packed B input is column-major by n,
``[N, k_blocks, blob_size]``, blocks run along K.  See docs/ort-matmulnbits.md §2 (layouts,
dequantization), §3 (ORT's quantizer) and §4.2 (the CompInt8 model).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F32 = np.float32
FLT_MAX = np.finfo(F32).max
U = 2.0**-24  # unit roundoff of float32


@dataclass(frozen=True)
class QuantizedWeights:
    data: np.ndarray  # uint8 [N, k_blocks, blob_size] (ORT B layout)
    scales: np.ndarray  # float32 [N, k_blocks]
    zero_points: np.ndarray | None  # uint8 packed [N, ceil(k_blocks*bits/8)]; None when symmetric
    K: int
    N: int
    bits: int
    block_size: int

    @property
    def k_blocks(self) -> int:
        return -(-self.K // self.block_size)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    # C roundf semantics. np.round is half-to-even. Done in float64 because a float32
    # x + 0.5 can itself round (0.49999997f + 0.5f == 1.0f); float64 holds it exactly.
    x = np.asarray(x, np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack uint codes along the last axis, LSB first (element i of a byte at bits [bits*i, bits*i+bits))."""
    per = 8 // bits
    c = codes.astype(np.uint8).reshape(*codes.shape[:-1], -1, per)
    out = np.zeros(c.shape[:-1], np.uint8)
    for i in range(per):
        out |= (c[..., i] << (bits * i)).astype(np.uint8)
    return out


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    per = 8 // bits
    parts = [(packed >> (bits * i)) & ((1 << bits) - 1) for i in range(per)]
    return np.stack(parts, -1).reshape(*packed.shape[:-1], -1).astype(np.int32)


def quantize_weights(W: np.ndarray, bits: int, block_size: int, symmetric: bool) -> QuantizedWeights:
    """Bit-exact port of MlasQuantizeBlockwise<float, bits>(columnwise) as used by
    onnxruntime.quantization.matmul_nbits_quantizer (range2scale / range2scalezp in q4_dq.cpp).
    MLAS itself only handles block sizes 16..256; larger powers of two get the same rule here."""
    assert bits in (2, 4, 8) and block_size >= 16 and block_size & (block_size - 1) == 0
    W = np.asarray(W, F32)
    K, N = W.shape
    kb = -(-K // block_size)
    kmax, kmid = (1 << bits) - 1, 1 << (bits - 1)
    # Pad with NaN: fmin/fmax ignore NaN, exactly like C++'s `if (v < min)` scan over valid rows.
    blk = np.full((kb * block_size, N), np.nan, F32)
    blk[:K] = W
    blk = blk.reshape(kb, block_size, N)
    mn = np.fmin.reduce(blk, axis=1, initial=FLT_MAX)  # [kb, N]
    mx = np.fmax.reduce(blk, axis=1, initial=-FLT_MAX)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if symmetric:
            m = np.where(np.abs(mx) > np.abs(mn), mx, mn)  # signed extreme; tie -> min
            # All-zero block: C++'s strict `<`/`>` scan keeps the *first* element's signed zero
            # (fmin/fmax may not), and the sign of the zero scale is part of bit-exactness.
            m = np.where(m == 0, blk[:, 0, :], m)
            scale = (-m / F32(kmid)).astype(F32)  # negative when the extreme is positive
            zp = np.full(scale.shape, kmid, np.int32)
        else:
            mn, mx = np.minimum(mn, F32(0)), np.maximum(mx, F32(0))
            scale = ((mx - mn) / F32(kmax)).astype(F32)
            # zp from this unrounded-to-storage scale (identical here since ElementT is float).
            zpf = np.where(scale != 0, F32(0) - mn / scale, mn).astype(F32)
            zp = np.where(zpf < 0, 0, np.where(zpf > kmax, kmax, _round_half_away(zpf))).astype(np.int32)
        # Quantize with the *stored* scale: v * (1/scale) then + zp, two float32 roundings
        # (the x86 wheel is not FMA-contracted; checked bit-exactly in tests/test_ort_oracle.py).
        rs = np.where(scale != 0, F32(1) / scale, F32(0)).astype(F32)
        v = (blk * rs[:, None, :]).astype(F32) + zp[:, None, :].astype(F32)
        q = np.clip(_round_half_away(v), 0, kmax)
    q = np.nan_to_num(q, nan=0).astype(np.uint8).reshape(kb * block_size, N)
    q[K:] = 0  # padding rows: the Python tool pre-fills zeros and MLAS never writes them
    data = _pack(q.T.reshape(N, kb, block_size), bits)
    zero_points = None
    if not symmetric:
        per = 8 // bits
        zp_t = np.full((N, -(-kb // per) * per), kmid, np.int32)  # unused slots keep kMid
        zp_t[:, :kb] = zp.T
        zero_points = _pack(zp_t, bits)
    return QuantizedWeights(data, np.ascontiguousarray(scale.T), zero_points, K, N, bits, block_size)


def unpack_codes(qw: QuantizedWeights) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes q int32 [K, N] and zero points zp int32 [k_blocks, N]."""
    q = _unpack(qw.data, qw.bits).reshape(qw.N, -1)[:, : qw.K].T
    if qw.zero_points is None:
        zp = np.full((qw.k_blocks, qw.N), 1 << (qw.bits - 1), np.int32)
    else:
        zp = _unpack(qw.zero_points, qw.bits)[:, : qw.k_blocks].T
    return np.ascontiguousarray(q), np.ascontiguousarray(zp)


def _per_k(x: np.ndarray, qw: QuantizedWeights) -> np.ndarray:
    """Expand a per-block [k_blocks, N] array to per-row [K, N]."""
    return np.repeat(x, qw.block_size, axis=0)[: qw.K]


def dequantize(qw: QuantizedWeights) -> np.ndarray:
    """float32 [K, N] = float(q - zp) * scale: integer subtract, one float32 multiply (MlasDequantizeBlockwise)."""
    q, zp = unpack_codes(qw)
    return ((q - _per_k(zp, qw)).astype(F32) * _per_k(qw.scales.T, qw)).astype(F32)


def matmul_nbits(A: np.ndarray, qw: QuantizedWeights, bias: np.ndarray | None = None) -> np.ndarray:
    """CompFp32 oracle: float64 [..., M, N] = A @ dequantize(qw) (+ bias), evaluated in float64."""
    Y = np.asarray(A, np.float64) @ dequantize(qw).astype(np.float64)
    return Y if bias is None else Y + np.asarray(bias, np.float64)


def a_blocks(A: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A as float32 [M, k_blocks, block_size] (zero-padded) and each block's max |a|."""
    A = np.asarray(A, F32)
    M, K = A.shape
    kb = -(-K // block_size)
    a = np.zeros((M, kb * block_size), F32)
    a[:, :K] = A
    a = a.reshape(M, kb, block_size)
    return a, np.abs(a).max(axis=2)  # zero padding never raises the max


def fp16_ceil(x: np.ndarray) -> np.ndarray:
    """The least fp16 value >= x (x >= 0), as float32; +inf above 65504 (no such value)."""
    x = np.asarray(x, F32)
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)  # nearest, ties to even; 65504 < x < 65520 -> 65504, above -> inf
        h = np.where(h.astype(F32) < x, np.nextafter(h, np.float16(np.inf)), h)
    return h.astype(F32)


def quantize_a_int8(A: np.ndarray, block_size: int, a_scale_type: str = "fp32") -> tuple[np.ndarray, np.ndarray]:
    """MLAS CompInt8 A quantization (NEON QuantizeBlock / test reference), per row per K block.

    Returns qa int8 [M, k_blocks*block_size] (zero-padded) and scales float32 [M, k_blocks].
    a_scale_type "fp16": each scale max|a| / 127 rounded up to an fp16 value (fp16_ceil), A quantized
    with exactly that scale (so codes stay within +-127), as imegen's a_scale_type = fp16 kernels do.
    Note: x86 AVX2/512 multiplies by 127/amax and rounds half-to-even instead; that only differs on
    rounding ties and 1-ulp multiplier differences, both covered by the CompInt8 tolerance.
    """
    a, amax = a_blocks(A, block_size)
    M = a.shape[0]
    scale = (amax / F32(127)).astype(F32)
    if a_scale_type == "fp16":
        scale = fp16_ceil(scale)
    with np.errstate(divide="ignore"):
        rs = np.where(scale != 0, F32(1) / scale, F32(0)).astype(F32)
    q = np.clip(_round_half_away((a * rs[:, :, None]).astype(F32)), -128, 127)
    return q.astype(np.int8).reshape(M, -1), scale


def matmul_nbits_int8(A: np.ndarray, qw: QuantizedWeights, bias: np.ndarray | None = None, a_scale_type: str = "fp32"):
    """CompInt8 oracle (MLAS CallReferenceGemm_CompInt8 semantics, accumulated in float64).

    acc int64 [M, N, k_blocks] = exact Σ_{k in b} qa[m,k] * (q[k,n] - zp[b,n]);
    Y float64 [M, N] = Σ_b acc * a_scale[m,b] * b_scale[n,b] (+ bias). a_scale_type: quantize_a_int8's.
    """
    qa, a_scale = quantize_a_int8(A, qw.block_size, a_scale_type)
    q, zp = unpack_codes(qw)
    w = np.zeros((qw.k_blocks * qw.block_size, qw.N), np.int64)
    w[: qw.K] = q - _per_k(zp, qw)  # padding rows stay 0 (qa is 0 there anyway)
    w = w.reshape(qw.k_blocks, qw.block_size, qw.N)
    acc = np.einsum("mbk,bkn->mnb", qa.astype(np.int64).reshape(qa.shape[0], qw.k_blocks, -1), w)
    Y = np.einsum("mnb,mb,nb->mn", acc.astype(np.float64), a_scale.astype(np.float64),
                  qw.scales.astype(np.float64))
    return (Y if bias is None else Y + np.asarray(bias, np.float64)), acc


def forward_error_bound(A: np.ndarray, W: np.ndarray, K: int | None = None, bias=None) -> np.ndarray:
    """Per-element bound on |fp32 kernel - matmul_nbits| for a CompFp32 kernel.

    gamma * (|A| @ |W| + |bias|) with gamma = (K+2) * 2^-24: the classical bound for a K-term fp32
    dot product (K-1 roundings, valid for *any* summation order, FMA or not, blocked or tree),
    +1 rounding for a kernel that dequantizes as q*s + (-zp*s) instead of (q-zp)*s, +1 for the
    bias add / final store.  Second-order terms ((K u)^2) are negligible for K << 2^24.
    """
    K = np.asarray(A).shape[-1] if K is None else K
    mag = np.abs(np.asarray(A, np.float64)) @ np.abs(np.asarray(W, np.float64))
    if bias is not None:
        mag = mag + np.abs(np.asarray(bias, np.float64))
    return (K + 2) * U * mag


def exact_test_data(rng: np.random.Generator, M: int, N: int, K: int, bits: int, block_size: int,
                    symmetric: bool) -> tuple[np.ndarray, QuantizedWeights]:
    """(A float32 [M, K], qw) for which every fp32 operation of both compute types is exact,
    so kernels can be compared with ``==``.  qw is built directly in ORT's packed layout.

    Invariant: A[m,k] = i * 2^ea[m,b], integer |i| <= 127, and each A block holds one |i| = 127,
    so its CompInt8 scale amax/127 is exactly 2^ea and qa == i whatever the rounding mode or
    1/scale vs 127/amax; B scales are ±2^eb.  Every product is then c * i * 2^(ea+eb) with
    integer |c| <= kmax = 2^bits-1, for c = q - zp and also for the pieces q, zp, q-kmid, kmid-zp
    that BlkSum-style kernels accumulate separately.  A's magnitudes are capped so that
    2^(ea+eb-emin) * kmax * Σ_k |i| < 2^22 for every row: any partial sum, in any order, of at
    most two such decompositions is a multiple of 2^emin below 2^23 * 2^emin -- exact in fp32,
    with room left for an integer bias |bias| < 2^16.  The exponent spread (ea in [-sa, 0],
    eb in [-sb, 0]) is narrowed, then the A range, until that holds.
    Padding codes (last partial block) and unused zero-point slots are random on purpose:
    a kernel must not read them.
    """
    assert bits in (2, 4, 8)
    kb = -(-K // block_size)
    Kp, kmax = kb * block_size, (1 << bits) - 1
    for sa, sb in ((1, 2), (1, 1), (0, 1), (0, 0)):
        budget = 2**22 // (kmax << (sa + sb))  # max allowed Σ_k |i| per row
        amag = min(15, (budget - 1 - kb * 127) // K)
        if amag >= 1:
            break
    else:
        raise ValueError(f"K={K} too large for exact data")
    ai = rng.integers(-amag, amag + 1, size=(M, Kp))
    ai[:, K:] = 0
    for b in range(kb):  # one ±127 per block inside K, so amax = 127 * 2^ea
        pos = rng.integers(b * block_size, min((b + 1) * block_size, K), size=M)
        ai[np.arange(M), pos] = rng.choice([-127, 127], size=M)
    ea = rng.integers(-sa, 1, size=(M, kb))
    A = (ai * np.exp2(np.repeat(ea, block_size, axis=1)))[:, :K].astype(F32)

    q = rng.integers(0, kmax + 1, size=(N, Kp))  # full code range; padding rows are garbage
    scales = (rng.choice([-1.0, 1.0], size=(N, kb)) * np.exp2(rng.integers(-sb, 1, size=(N, kb)))).astype(F32)
    zps = None
    if not symmetric:
        per = 8 // bits
        zp = rng.integers(0, kmax + 1, size=(N, -(-kb // per) * per))  # garbage in unused slots
        zps = _pack(zp, bits)
    qw = QuantizedWeights(_pack(q.reshape(N, kb, block_size), bits), scales, zps, K, N, bits, block_size)
    return A, qw
