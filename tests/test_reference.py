"""Unit and property tests of the NumPy reference itself (imegen/reference.py).

The reference is checked against onnxruntime in test_ort_oracle.py; here we pin down the
layout conventions, rounding rules and the internal consistency of the two oracles.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from imegen.reference import (
    QuantizedWeights,
    _round_half_away,
    dequantize,
    exact_test_data,
    forward_error_bound,
    matmul_nbits,
    matmul_nbits_int8,
    quantize_a_int8,
    quantize_weights,
    unpack_codes,
)

F32 = np.float32
U = 2.0**-24
BLOCKS = (16, 32, 64, 128, 256)


# ---------------------------------------------------------------- rounding
def test_round_half_away_from_zero():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 7.5, 0.0], F32)
    assert _round_half_away(x).tolist() == [1, 2, 3, -1, -3, 0, 0, 8, 0]
    # the trap from the notes: in float32, 0.49999997 + 0.5 rounds to 1.0
    assert F32(0.49999997) + F32(0.5) == F32(1.0)


def test_quantizer_ties_round_away_from_zero():
    # symmetric, extreme +8 -> scale = -1, rs = -1; v = -1.5 -> 1.5 + 8 = 9.5 -> 10 (np.round: 10),
    # v = -0.5 -> 8.5 -> 9 (np.round would give 8).  Positive-side: v = 1.5 -> 6.5 -> 7 (np.round: 6).
    W = np.zeros((16, 1), F32)
    W[:4, 0] = [8.0, -1.5, -0.5, 1.5]
    q, _ = unpack_codes(quantize_weights(W, 4, 16, True))
    assert q[:4, 0].tolist() == [0, 10, 9, 7]


# ---------------------------------------------------------------- packed layout
def test_unpack_nibble_order():
    # B: even k in the low nibble; zp: even block in the low nibble (notes §1.5)
    data = np.zeros((1, 2, 8), np.uint8)
    data[0, 0, 0] = 0x21  # k=0 -> 1, k=1 -> 2
    data[0, 1, 7] = 0xF3  # k=30 -> 3, k=31 -> 15
    zps = np.array([[0x43]], np.uint8)  # block 0 -> 3, block 1 -> 4
    qw = QuantizedWeights(data, np.ones((1, 2), F32), zps, K=32, N=1, bits=4, block_size=16)
    q, zp = unpack_codes(qw)
    assert q[:2, 0].tolist() == [1, 2] and q[30:, 0].tolist() == [3, 15]
    assert zp[:, 0].tolist() == [3, 4]
    assert q.shape == (32, 1) and zp.shape == (2, 1)


def test_pack_layout_matches_codes():
    rng = np.random.default_rng(0)
    W = rng.standard_normal((64, 3)).astype(F32)
    for bits in (4, 8):
        qw = quantize_weights(W, bits, 32, False)
        q, zp = unpack_codes(qw)
        assert qw.data.shape == (3, 2, 32 * bits // 8) and qw.data.dtype == np.uint8
        if bits == 4:
            assert np.array_equal(qw.data[1, 1, :] & 0xF, q[32::2, 1])
            assert np.array_equal(qw.data[1, 1, :] >> 4, q[33::2, 1])
            assert np.array_equal(qw.zero_points[:, 0] & 0xF, zp[0])
            assert np.array_equal(qw.zero_points[:, 0] >> 4, zp[1])
        else:
            assert np.array_equal(qw.data[2].reshape(-1), q[:, 2])
            assert np.array_equal(qw.zero_points.T, zp)


def test_odd_k_blocks_zero_point_high_nibble_is_kmid():
    W = np.random.default_rng(1).standard_normal((40, 2)).astype(F32)  # 3 blocks of 16
    qw = quantize_weights(W, 4, 16, False)
    assert qw.zero_points.shape == (2, 2)
    assert np.all(qw.zero_points[:, 1] >> 4 == 8)


def test_k_not_multiple_of_block_size():
    W = np.random.default_rng(2).standard_normal((33, 5)).astype(F32)
    qw = quantize_weights(W, 4, 16, True)
    assert qw.k_blocks == 3 and qw.data.shape == (5, 3, 8) and qw.scales.shape == (5, 3)
    assert qw.zero_points is None
    q, zp = unpack_codes(qw)
    assert q.shape == (33, 5) and np.all(zp == 8)
    # padding rows 33..47: code 0 (what the Python tool pre-fills); block 2 has one valid row
    assert np.all(qw.data[:, 2, 0] >> 4 == 0) and np.all(qw.data[:, 2, 1:] == 0)
    # the last block's scale only sees row 32
    assert np.array_equal(qw.scales[:, 2], (-W[32] / F32(8)).astype(F32))
    assert dequantize(qw).shape == (33, 5)


# ---------------------------------------------------------------- quantizer semantics
def test_symmetric_scale_is_negative_for_positive_extreme():
    W = np.zeros((16, 2), F32)
    W[:3, 0] = [1.0, -0.5, 0.25]  # extreme +1 -> scale -1/8, +1 maps to code 0
    W[:2, 1] = [-1.0, 1.0]  # |max| == |min| -> min wins -> scale +1/8
    qw = quantize_weights(W, 4, 16, True)
    assert qw.scales[:, 0].tolist() == [-0.125, 0.125]
    q, _ = unpack_codes(qw)
    assert q[:3, 0].tolist() == [0, 12, 6]
    assert q[:2, 1].tolist() == [0, 15]  # -1 -> 0; +1 -> 16 clipped to 15
    deq = dequantize(qw)
    assert deq[:3, 0].tolist() == [1.0, -0.5, 0.25]
    assert deq[1, 1] == F32(0.875)  # the one clipped value


def test_symmetric_8bit():
    W = np.zeros((16, 1), F32)
    W[:2, 0] = [-2.0, 1.0]
    qw = quantize_weights(W, 8, 16, True)
    assert qw.scales[0, 0] == F32(2.0 / 128)
    q, zp = unpack_codes(qw)
    assert q[:2, 0].tolist() == [0, 192] and zp[0, 0] == 128


def test_asymmetric_zero_point_from_unrounded_scale():
    W = np.zeros((16, 1), F32)
    W[:2, 0] = [-1.0, 2.0]  # scale 3/15 = 0.2, zp = 0 - (-1)/0.2 = 5
    qw = quantize_weights(W, 4, 16, False)
    q, zp = unpack_codes(qw)
    assert qw.scales[0, 0] == F32(3.0) / F32(15.0) and zp[0, 0] == 5
    assert q[:3, 0].tolist() == [0, 15, 5]


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [4, 8])
def test_all_zero_block(bits, symmetric):
    W = np.zeros((48, 2), F32)
    W[16:32, 1] = 1.0  # one non-zero block, the rest zero
    qw = quantize_weights(W, bits, 16, symmetric)
    q, zp = unpack_codes(qw)
    assert qw.scales[0].tolist() == [0, 0, 0] and qw.scales[1, 0] == 0
    zero_blocks = [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1)]
    for b, n in zero_blocks:
        assert np.all(q[16 * b:16 * b + 16, n] == zp[b, n])
    assert np.all(dequantize(qw)[:, 0] == 0)
    if not symmetric:
        assert zp[0, 0] == 0  # min = max = 0 -> zero_point_fp = min = 0


# ---------------------------------------------------------------- round-trip property
def _weights(draw_max_k=100):
    return st.integers(1, draw_max_k).flatmap(
        lambda K: st.integers(1, 4).flatmap(
            lambda N: hnp.arrays(F32, (K, N), elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=False))))


@settings(max_examples=150, deadline=None)
@given(W=_weights(), bits=st.sampled_from([4, 8]), block_size=st.sampled_from([16, 32, 64]), symmetric=st.booleans())
def test_round_trip_error_at_most_half_a_step(W, bits, block_size, symmetric):
    W = np.where(np.abs(W) < 1e-20, F32(0), W)  # keep scales normal: 1/scale must not overflow
    qw = quantize_weights(W, bits, block_size, symmetric)
    q, zp = unpack_codes(qw)
    s = np.repeat(qw.scales.T, block_size, axis=0)[: qw.K]
    z = np.repeat(zp, block_size, axis=0)[: qw.K]
    kmax = (1 << bits) - 1
    assert np.all((q >= 0) & (q <= kmax))
    err = np.abs(dequantize(qw).astype(np.float64) - W)
    # fp32 slack: 1/scale, v*rs and +zp each round (code error <= ~(kmax+1)*2u), dequant rounds once
    eps = np.abs(s) * 4 * (kmax + 1) * U + 2 * U * np.abs(W)
    # grid range [lo, hi]; anything within half a step of it rounds (or clips) to within half a step
    lo, hi = np.minimum(-z * s, (kmax - z) * s), np.maximum(-z * s, (kmax - z) * s)
    half = np.abs(s) / 2
    inside = (W >= lo - half - eps) & (W <= hi + half + eps)
    assert np.all(err[inside] <= half[inside] + eps[inside])
    # only the symmetric quantizer clips further (its extreme maps to -2^(bits-1) steps, the other
    # side only has 2^(bits-1)-1), and by at most one step
    assert symmetric or inside.all()
    assert np.all(err <= np.abs(s) + eps)


# ---------------------------------------------------------------- oracles
def test_dequantize_formula():
    rng = np.random.default_rng(3)
    W = rng.standard_normal((40, 3)).astype(F32)
    qw = quantize_weights(W, 4, 16, False)
    q, zp = unpack_codes(qw)
    deq = dequantize(qw)
    for k in range(40):
        for n in range(3):
            b = k // 16
            assert deq[k, n] == F32(q[k, n] - zp[b, n]) * qw.scales[n, b]


def test_quantize_a_int8_formula():
    A = np.zeros((2, 20), F32)
    A[0, :3] = [0.5, -1.0, 0.25]  # block 0: amax 1 -> scale 1/127
    A[0, 16] = 3.0
    A[1, 5] = 1e-3
    qa, sc = quantize_a_int8(A, 16)
    assert qa.shape == (2, 32) and qa.dtype == np.int8 and sc.shape == (2, 2)
    assert sc[0, 0] == F32(1.0) / F32(127) and sc[1, 1] == 0
    rs = F32(1) / sc[0, 0]
    assert qa[0, :3].tolist() == [int(_round_half_away(F32(0.5) * rs)), -127, int(_round_half_away(F32(0.25) * rs))]
    assert qa[0, 16] == 127 and np.all(qa[:, 20:] == 0) and np.all(qa[1, 16:] == 0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), M=st.integers(1, 4), N=st.integers(1, 5), K=st.integers(1, 90),
       bits=st.sampled_from([4, 8]), block_size=st.sampled_from([16, 32]), symmetric=st.booleans(),
       use_bias=st.booleans())
def test_int8_oracle_consistent(seed, M, N, K, bits, block_size, symmetric, use_bias):
    rng = np.random.default_rng(seed)
    A = rng.normal(0, 1, (M, K)).astype(F32)
    qw = quantize_weights(rng.normal(0, 1, (K, N)).astype(F32), bits, block_size, symmetric)
    bias = rng.uniform(1, 5, N).astype(F32) if use_bias else None
    Y, acc = matmul_nbits_int8(A, qw, bias)
    assert acc.dtype == np.int64 and acc.shape == (M, N, qw.k_blocks)

    # acc by brute force from the codes
    qa, a_s = quantize_a_int8(A, block_size)
    q, zp = unpack_codes(qw)
    for b in range(qw.k_blocks):
        ks = range(b * block_size, min((b + 1) * block_size, K))
        ref = sum(qa[:, k, None].astype(np.int64) * (q[k] - zp[b]) for k in ks)
        assert np.array_equal(acc[:, :, b], ref)
    # Y is the scaled sum of acc
    Y2 = (acc * a_s[:, None, :].astype(np.float64) * qw.scales[None].astype(np.float64)).sum(-1)
    if bias is not None:
        Y2 = Y2 + bias
    np.testing.assert_allclose(Y, Y2, rtol=1e-12, atol=1e-12)

    # and it differs from the fp32-compute oracle only by A's quantization error (<= a_scale/2 per element)
    Y0 = matmul_nbits(A, qw, bias)
    W = dequantize(qw).astype(np.float64)
    a_err = np.repeat(a_s, block_size, axis=1)[:, :K].astype(np.float64) / 2 * (1 + 1e-5)
    assert np.all(np.abs(Y - Y0) <= a_err @ np.abs(W) + 1e-9)


def test_forward_error_bound_shape_and_scale():
    A = np.ones((2, 10), F32)
    W = np.full((10, 3), -2.0, F32)
    b = forward_error_bound(A, W, 10)
    assert b.shape == (2, 3) and np.all(b == 12 * 2.0**-24 * 20)
    assert np.all(forward_error_bound(A, W) == b)


# ---------------------------------------------------------------- exact data
def _fp32_dot_orders(A, W):
    """Y = A @ W accumulated in float32, forwards and backwards along K."""
    fwd = np.zeros((A.shape[0], W.shape[1]), F32)
    bwd = fwd.copy()
    for k in range(A.shape[1]):
        fwd = (fwd + (A[:, k, None] * W[None, k]).astype(F32)).astype(F32)
        kr = A.shape[1] - 1 - k
        bwd = (bwd + (A[:, kr, None] * W[None, kr]).astype(F32)).astype(F32)
    return fwd, bwd


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("M,N,K,block_size", [(1, 1, 16, 16), (3, 7, 40, 16), (2, 5, 300, 64), (2, 3, 1234, 16), (1, 4, 4096, 256)])
def test_exact_test_data_is_exact(M, N, K, block_size, bits, symmetric):
    rng = np.random.default_rng(K * 31 + bits + symmetric)
    A, qw = exact_test_data(rng, M, N, K, bits, block_size, symmetric)
    bias = rng.integers(-2**15, 2**15, N).astype(F32)
    assert A.dtype == np.float32 and A.shape == (M, K) and qw.K == K and qw.N == N
    scales = np.abs(qw.scales)
    assert np.all(np.exp2(np.round(np.log2(scales))) == scales)  # ±2^e
    # CompInt8: A's scale is a power of two and A quantizes losslessly
    qa, a_s = quantize_a_int8(A, block_size)
    assert np.all(np.exp2(np.round(np.log2(a_s))) == a_s)
    assert np.array_equal((qa[:, :K] * np.repeat(a_s, block_size, axis=1)[:, :K]).astype(F32), A)

    Y0 = matmul_nbits(A, qw, bias)
    Y8, acc = matmul_nbits_int8(A, qw, bias)
    assert np.array_equal(Y0, Y8)
    q, zp = unpack_codes(qw)
    W = dequantize(qw)  # (q - zp) * ±2^e: exact
    s_k = np.repeat(qw.scales.T, block_size, axis=0)[:K].astype(np.float64)
    assert np.array_equal(W.astype(np.float64), (q - np.repeat(zp, block_size, axis=0)[:K]) * s_k)
    for y in _fp32_dot_orders(A, W):  # fp32 evaluation, two summation orders
        assert np.array_equal((y + bias).astype(F32).astype(np.float64), Y0)
    # the CompInt8 formula in fp32, block by block, and a BlkSum split (Σ qa*q) + (-zp * Σ qa)
    kb, Kp = qw.k_blocks, qw.k_blocks * block_size
    qpad = np.zeros((Kp, N), np.int64)
    qpad[:K] = q
    qsum = np.einsum("mbk,bkn->mnb", qa.reshape(M, kb, -1).astype(np.int64), qpad.reshape(kb, block_size, N))
    asum = qa.reshape(M, kb, -1).astype(np.int64).sum(-1)
    y_blk = np.zeros((M, N), F32)
    y_split = np.zeros((M, N), F32)
    for b in range(kb):
        sab = (a_s[:, b, None] * qw.scales[None, :, b]).astype(F32)
        y_blk = (y_blk + (acc[:, :, b].astype(F32) * sab).astype(F32)).astype(F32)
        y_split = (y_split + (qsum[:, :, b].astype(F32) * sab).astype(F32)).astype(F32)
        y_split = (y_split + ((a_s[:, b] * asum[:, b]).astype(F32)[:, None]
                              * (-qw.scales[:, b] * zp[b]).astype(F32)[None])).astype(F32)
    assert np.array_equal((y_blk + bias).astype(np.float64), Y0)
    assert np.array_equal((y_split + bias).astype(np.float64), Y0)


def test_exact_test_data_padding_is_garbage_but_ignored():
    rng = np.random.default_rng(7)
    A, qw = exact_test_data(rng, 2, 64, 20, 4, 16, False)
    assert np.any(qw.data[:, 1, 2:] != 0)  # rows 20..31 hold random codes
    clean = QuantizedWeights(qw.data.copy(), qw.scales, qw.zero_points, qw.K, qw.N, qw.bits, qw.block_size)
    clean.data[:, 1, 2:] = 0
    assert np.array_equal(matmul_nbits(A, qw), matmul_nbits(A, clean))
    assert np.array_equal(matmul_nbits_int8(A, qw)[0], matmul_nbits_int8(A, clean)[0])


def test_exact_test_data_rejects_infeasible_k():
    with pytest.raises(ValueError):
        exact_test_data(np.random.default_rng(0), 1, 1, 2048 * 16, 8, 16, False)


def test_symmetric_all_zero_block_keeps_first_zero_sign():
    # MLAS scans with strict < / >, so an all-zero block's extreme is its *first* element's zero
    # and the scale is -(that zero)/8: W = [-0, +0] gives scale +0, W = [+0, -0] gives -0.
    W = np.array([[-0.0, 0.0], [0.0, -0.0]], F32)
    s = quantize_weights(W, 4, 16, True).scales[:, 0]
    assert np.signbit(s).tolist() == [False, True]
