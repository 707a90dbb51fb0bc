"""imegen.reference against onnxruntime itself (the x86 CPU wheel on the build host).

a) the quantizer: bit-exact against ORT's C++ MlasQuantizeBlockwise (the binding behind
   onnxruntime.quantization.matmul_nbits_quantizer);
b) numerics: a single-node com.microsoft MatMulNBits model run by onnxruntime's CPU EP, at
   accuracy_level 0 (CompFp32) and 4 (CompInt8), on shapes from ORT's matmul_4bits_test.cc.

Measured on onnxruntime 1.32.0, x86-64 AVX512-VNNI host (ORT's data recipe, 24 shapes x
bits {4,8} x sym/asym, bias U(1,5)):
  level 0 vs matmul_nbits:       max abs err 1.3e-5, at most 0.57 of ORT's own tolerance
                                 (1e-5 + 1e-4|y|, reached at M=100,K=1234) and <= 0.09 of
                                 forward_error_bound -- so the plain ORT tolerance suffices here.
  level 4 vs matmul_nbits_int8:  max abs err <= 8.3e-6, except that about one A element in 10^5
                                 gets a different int8 code (x86 MLAS quantizes A with 127/amax
                                 and round-half-even, see test_x86_int8_a_quantization_divergence),
                                 which shifts that output row by up to ~5e-3 (max rel 0.1 at
                                 |y| ~ 0.05) -- still inside ORT's tolerance.  Against an x86-style
                                 A quantization the error is <= 0.11 of an fp32 accumulation bound,
                                 i.e. ~10^4 times tighter than ORT's abs 0.1 / rel 0.02.
  exact_test_data:               both levels equal the reference bit for bit.
"""
import platform

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from imegen.reference import (
    QuantizedWeights,
    _unpack,
    dequantize,
    exact_test_data,
    forward_error_bound,
    matmul_nbits,
    matmul_nbits_int8,
    quantize_a_int8,
    quantize_weights,
)

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
# The model builder, ORT's quantizer binding and the x86 A-quantization model live in imegen.ort.ort_check
# (the `imegen ort-check` conformance suite), shared with tests/test_ort_check.py.
from imegen.ort.ort_check import int8_result, ort_quantize, quantize_a_int8_x86, run_ort  # noqa: E402

F32 = np.float32
X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


# ---------------------------------------------------------------- a) quantizer
def assert_same_quantization(W, bits, block_size, symmetric):
    K, N = W.shape
    packed, scales, zp = ort_quantize(W, bits, block_size, symmetric)
    qw = quantize_weights(W, bits, block_size, symmetric)
    assert np.array_equal(scales.view(np.uint32), qw.scales.view(np.uint32)), "scales differ"
    if symmetric:
        assert qw.zero_points is None and not zp.any()  # ORT does not write zp when symmetric
    else:
        assert np.array_equal(zp, qw.zero_points), "zero points differ"  # incl. the kMid filler
    ours, theirs = _unpack(qw.data, bits).reshape(N, -1), _unpack(packed, bits).reshape(N, -1)
    assert np.array_equal(ours[:, :K], theirs[:, :K]), "codes differ"
    # Padding.  Codes for rows >= K are unspecified: whole padding bytes keep the caller's zeros,
    # but in the byte that holds row K-1 (K not a multiple of 8/bits) MLAS writes its per-thread
    # `vi[]` scratch, which is not reset, so the padding slots there hold the codes of the
    # previous byte in the same 2*block_size-row thread block (0 at its start), e.g. 4-bit K=35:
    # code(k=35) == code(k=33).  Kernels never read them; the reference writes 0.
    per = 8 // bits
    kr = -(-K // per) * per
    assert not theirs[:, kr:].any() and not ours[:, K:].any()


@pytest.mark.parametrize("bits", [4, 8, 2])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("K,N", [(1, 1), (15, 3), (33, 7), (35, 2), (100, 5), (257, 9), (301, 4)])
def test_quantizer_bit_exact(K, N, bits, block_size, symmetric):
    rng = np.random.default_rng(K * 1000 + N * 10 + bits + block_size + symmetric)
    for W in (
        rng.normal(0, 0.25, (K, N)),  # ORT's test distribution
        rng.normal(0, 1, (K, N)) * 10.0 ** rng.integers(-6, 6, (1, N)),  # magnitudes per column
        rng.integers(-16, 17, (K, N)) / 2,  # lots of exact .5 ties (incl. negative scales)
        rng.integers(-(1 << bits), 1 << bits, (K, N)) / 4,
        np.abs(rng.normal(0, 1, (K, N))) + 1,  # all positive: zp clamps to 0
        -np.abs(rng.normal(0, 1, (K, N))) - 1,  # all negative: zp = kmax
        rng.choice([0.0, 0.0, 0.0, 1.0, -1.0], (K, N)),  # all-zero blocks, |max| == |min| ties
        rng.normal(0, 1, (K, N)) * 1e-40,  # subnormals: scale 0 or subnormal, 1/scale = inf
    ):
        assert_same_quantization(W.astype(F32), bits, block_size, symmetric)


@settings(max_examples=100, deadline=None)
@given(
    W=st.integers(1, 80).flatmap(lambda K: st.integers(1, 3).flatmap(
        lambda N: hnp.arrays(F32, (K, N), elements=st.floats(-1e6, 1e6, width=32)))),
    bits=st.sampled_from([4, 8]), block_size=st.sampled_from([16, 32, 64]), symmetric=st.booleans())
def test_quantizer_bit_exact_property(W, bits, block_size, symmetric):
    assert_same_quantization(W, bits, block_size, symmetric)


# ---------------------------------------------------------------- b) MatMulNBits numerics
# (M, N, K, block_size) from matmul_4bits_test.cc Float32_4b_Accuracy{0,4}; all run in < 0.2 s
SHAPES = [(1, 1, 16, 16), (1, 288, 93, 32), (2, 2, 16, 16), (100, 32, 16, 128), (3, 33, 40, 16),
          (1, 288, 1234, 16), (100, 288, 1234, 16), (100, 288, 1024, 128), (100, 288, 192, 64)]


def ort_test_data(M, N, K, bits, block_size, symmetric, seed):
    """ORT's recipe: A, B ~ N(0, 0.25), bias ~ U(1, 5), B through the (bit-exact) quantizer."""
    rng = np.random.default_rng(seed)
    A = rng.normal(0, 0.25, (M, K)).astype(F32)
    qw = quantize_weights(rng.normal(0, 0.25, (K, N)).astype(F32), bits, block_size, symmetric)
    return A, qw, rng.uniform(1, 5, N).astype(F32)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("M,N,K,block_size", SHAPES)
def test_accuracy_level_0(M, N, K, block_size, bits, symmetric, use_bias):
    A, qw, bias = ort_test_data(M, N, K, bits, block_size, symmetric, seed=M * N + K + bits)
    bias = bias if use_bias else None
    y = run_ort(A, qw, bias, 0)
    expected = matmul_nbits(A, qw, bias)
    err = np.abs(y - expected)
    assert np.all(err <= 1e-5 + 1e-4 * np.abs(expected))  # ORT's DefaultTolerance<float>
    # and the K-dependent a-priori fp32 bound (this is what generated kernels are held to)
    assert np.all(err <= forward_error_bound(A, dequantize(qw), K, bias))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("M,N,K,block_size", SHAPES)
def test_accuracy_level_4(M, N, K, block_size, bits, symmetric, use_bias):
    A, qw, bias = ort_test_data(M, N, K, bits, block_size, symmetric, seed=M * N + K + bits)
    bias = bias if use_bias else None
    y = run_ort(A, qw, bias, 4)
    expected, _ = matmul_nbits_int8(A, qw, bias)
    assert np.all(np.abs(y - expected) <= 0.1 + 0.02 * np.abs(expected))  # ORT's tolerance
    # Much tighter: with the A codes x86 MLAS actually uses, ORT is within an fp32 bound.
    if X86:
        y_x86, bound = int8_result(*quantize_a_int8_x86(A, block_size), qw, bias)
        assert np.all(np.abs(y - y_x86) <= bound)
    # and the reference's own A codes differ from those only in rare elements
    qa, _ = quantize_a_int8(A, block_size)
    assert np.count_nonzero(qa != quantize_a_int8_x86(A, block_size)[0]) <= max(2, qa.size // 20000)


@pytest.mark.skipif(not X86, reason="documents the x86 MLAS A quantizer")
def test_x86_int8_a_quantization_divergence():
    # Minimal case.  A block [127, 0.5, 0...]: amax 127, a_scale 1, and 0.5 * 1 is an exact tie.
    # MLAS's reference/NEON (and matmul_nbits_int8) use roundf -> code 1; x86 AVX2/512 rounds
    # half to even -> code 0.  With B = 1.0 at k = 1 the two differ by exactly 1 * 1 * 1.
    A = np.zeros((1, 16), F32)
    A[0, :2] = [127.0, 0.5]
    data = np.full((1, 1, 8), 0x88, np.uint8)  # all codes 8 == default zp -> W = 0 ...
    data[0, 0, 0] = 0x98  # ... except k = 1: code 9 -> W = (9 - 8) * 1 = 1
    qw = QuantizedWeights(data, np.ones((1, 1), F32), None, K=16, N=1, bits=4, block_size=16)
    assert matmul_nbits(A, qw)[0, 0] == 0.5
    assert matmul_nbits_int8(A, qw)[0][0, 0] == 1.0  # reference: roundf(0.5) = 1
    assert run_ort(A, qw, None, 4)[0, 0] == 0.0  # ORT x86: rint(0.5) = 0
    assert run_ort(A, qw, None, 0)[0, 0] == 0.5


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("M,N,K,block_size", SHAPES + [(7, 40, 4096, 64), (4, 9, 300, 256), (64, 64, 1024, 32)])
def test_exact_data_bit_exact_in_ort(M, N, K, block_size, bits, symmetric):
    # exact_test_data also puts random codes in the padding and the unused zp slot: ORT must ignore them
    rng = np.random.default_rng(M + N + K + block_size + bits + symmetric)
    A, qw = exact_test_data(rng, M, N, K, bits, block_size, symmetric)
    bias = rng.integers(-1000, 1000, N).astype(F32)
    expected = matmul_nbits(A, qw, bias)
    assert np.array_equal(expected, matmul_nbits_int8(A, qw, bias)[0])
    assert np.array_equal(run_ort(A, qw, bias, 0), expected)
    assert np.array_equal(run_ort(A, qw, bias, 4), expected)
