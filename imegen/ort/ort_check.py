"""`imegen ort-check`: conformance of generated kernels against onnxruntime itself.

For ORT's own test shapes (matmul_4bits_test.cc and test_sqnbitgemm.cpp, see
docs/ort-matmulnbits.md §5) this builds single-node com.microsoft MatMulNBits models, runs
them in onnxruntime's CPU EP, runs the *same bytes* (B, scales and zero points from ORT's own
quantizer binding, not imegen's) through each kernel -- scalar natively, rvv and ime under QEMU --
and compares kernel output to ORT output with ORT's operator-test tolerances:

  accuracy_level 0 (compute = fp32): |kernel - ort| <= 1e-5 + 1e-4 |ort|   (DefaultTolerance<float>)
  accuracy_level 4 (compute = int8): |kernel - ort| <= 0.1  + 0.02 |ort|   (matmul_4bits_test.cc)

If an fp32 element is outside ORT's tolerance but inside 2 x reference.forward_error_bound (the
K-dependent a-priori bound: kernel and ORT each within it of the exact result), it passes and the
row says so ("K-bound").  ORT's level-0 tolerance is not K-safe: at test_sqnbitgemm's K = 2131
ORT's own output reaches 0.99 of it, and a plain sequential fp32 dot exceeds it (docs/onnxruntime.md; the
minimal case is tests/test_ort_check.py::test_orts_fp32_tolerance_is_not_k_safe).

x86 onnxruntime quantizes A for accuracy_level 4 with 127/amax and round-half-even, while imegen's
kernels follow MLAS's reference/NEON rule (amax/127, round-half-away).  Rows where that changes
any A code say how many codes differ and give the error on the rows where all codes agree.

onnxruntime and onnx are optional (test extras); they are imported on first use.
"""

from __future__ import annotations

import itertools
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .. import reference as ref
from .. import targets
from ..ir import KernelSpec, specs_from_text
from ..plan import KernelPlan, expected_vmadots, plan_kernel
from ..toolchain import ToolchainError
from ..verify import Case, build, run_cases

F32 = np.float32
U = 2.0**-24
X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
BLOCKS = (16, 32, 64, 128, 256)
SEED = 1234  # matmul_4bits_test.cc: RandomValueGenerator random{1234}, fresh per test

# ORT's tolerances: (abs, rel) per accuracy level; tolerance = abs + rel * |expected|.
TOLERANCE = {0: (1e-5, 1e-4), 4: (0.1, 0.02)}
LEVEL = {"fp32": 0, "int8": 4}  # kernel compute -> MatMulNBits accuracy_level


# ----------------------------------------------------------------------------- onnxruntime side
def _ort():
    try:
        import onnx
        import onnxruntime
    except ImportError as e:
        raise ImportError(f"imegen ort-check needs onnxruntime and onnx ({e}); "
                          "install them with: python3 -m pip install -e '.[test]'") from None
    return onnx, onnxruntime


def ort_import_problem() -> str | None:
    """Why onnxruntime/onnx cannot be used here (None if they can): a missing module, or any error
    a broken install raises on import."""
    try:
        _ort()
        return None
    except ImportError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a broken onnxruntime can raise anything on import
        return f"importing onnxruntime/onnx failed ({type(e).__name__}: {e}); reinstall them: python3 -m pip install -e '.[test]'"


def ort_available() -> bool:
    return ort_import_problem() is None


def ort_quantize(W: np.ndarray, bits: int, block_size: int, symmetric: bool):
    """ORT's C++ MlasQuantizeBlockwise through its Python binding, exactly as
    matmul_nbits_quantizer.DefaultWeightOnlyQuantizer.qbits_block_quant calls it (that module
    itself needs onnx_ir, which we do not depend on).  Returns (packed B, scales, zero points);
    zero points are left all 0 when symmetric."""
    _ort()
    from onnxruntime.capi import _pybind_state as C

    W = np.asarray(W, F32)
    K, N = W.shape
    kb, per = -(-K // block_size), 8 // bits
    Wp = np.pad(W, ((0, kb * block_size - K), (0, 0)))
    packed = np.zeros((N, kb, block_size // per), np.uint8)
    zp = np.zeros((N, -(-kb // per)), np.uint8)
    scales = np.zeros((N, kb), F32)
    fn = {2: C.quantize_matmul_2bits, 4: C.quantize_matmul_4bits, 8: C.quantize_matmul_8bits}[bits]
    fn(packed, Wp, scales, zp, block_size, N, K, symmetric)
    return packed, scales, zp


def ort_quantized_weights(W: np.ndarray, bits: int, block_size: int, symmetric: bool) -> ref.QuantizedWeights:
    packed, scales, zp = ort_quantize(W, bits, block_size, symmetric)
    K, N = np.shape(W)
    return ref.QuantizedWeights(packed, scales, None if symmetric else zp, K, N, bits, block_size)


def matmulnbits_model(M: int, qw: ref.QuantizedWeights, bias: np.ndarray | None = None, accuracy_level: int = 0):
    """A checked single-node model: Y[M, N] = MatMulNBits(A[M, K], B, scales[, zero_points][, bias])
    with B / scales / zero points / bias as initializers."""
    onnx, _ = _ort()
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(qw.data, "B"), numpy_helper.from_array(qw.scales, "scales")]
    names = ["A", "B", "scales", "", "", ""]  # A, B, scales, zero_points, g_idx, bias
    if qw.zero_points is not None:
        inits.append(numpy_helper.from_array(qw.zero_points, "zero_points"))
        names[3] = "zero_points"
    if bias is not None:
        inits.append(numpy_helper.from_array(np.asarray(bias, F32), "bias"))
        names[5] = "bias"
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=qw.K, N=qw.N,
                            bits=qw.bits, block_size=qw.block_size, accuracy_level=accuracy_level)
    graph = helper.make_graph(
        [node], "matmulnbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [M, qw.K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [M, qw.N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def run_ort(A: np.ndarray, qw: ref.QuantizedWeights, bias=None, accuracy_level: int = 0) -> np.ndarray:
    """Run the model in onnxruntime's CPU EP (graph optimizations off); float64 [M, N]."""
    _, ort = _ort()
    A = np.ascontiguousarray(A, F32)
    model = matmulnbits_model(A.shape[0], qw, bias, accuracy_level)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"A": A})[0].astype(np.float64)


def quantize_a_int8_x86(A: np.ndarray, block_size: int):
    """x86 MLAS (QuantizeARow_CompInt8_avx2/avx512): multiplier 127/amax (not 1/(amax/127)) and
    round-half-to-even.  Used only to explain x86 ORT's accuracy_level 4 output."""
    a, amax = ref.a_blocks(A, block_size)
    M = a.shape[0]
    with np.errstate(divide="ignore"):
        mul = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    qa = np.clip(np.rint((a * mul[:, :, None]).astype(F32)), -128, 127).astype(np.int8)
    return qa.reshape(M, -1), (amax / F32(127)).astype(F32)


def int8_result(qa, a_scale, qw: ref.QuantizedWeights, bias):
    """Σ_b acc*a_s*b_s + bias for given A codes, plus an fp32 error bound for any evaluation order
    of it, including BlkSum splits: (kb+3)u * (Σ_b a_s |b_s| kmax Σ|qa| + |Y|)."""
    q, zp = ref.unpack_codes(qw)
    kb, bs = qw.k_blocks, qw.block_size
    w = np.zeros((kb * bs, qw.N), np.int64)
    w[: qw.K] = q - np.repeat(zp, bs, axis=0)[: qw.K]
    qa3 = qa.astype(np.int64).reshape(qa.shape[0], kb, bs)
    acc = np.einsum("mbk,bkn->mnb", qa3, w.reshape(kb, bs, qw.N))
    Y = np.einsum("mnb,mb,nb->mn", acc.astype(np.float64), a_scale.astype(np.float64), qw.scales.astype(np.float64))
    Y = Y + (0 if bias is None else np.asarray(bias, np.float64))
    mag = np.einsum("mb,mb,nb->mn", np.abs(qa3).sum(-1).astype(np.float64), a_scale.astype(np.float64),
                    np.abs(qw.scales.astype(np.float64))) * ((1 << qw.bits) - 1)
    return Y, (kb + 3) * U * (mag + np.abs(Y))


# ----------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Shape:
    M: int
    N: int
    K: int
    block: int
    bias: tuple[bool, ...]  # the bias modes ORT tests this shape with
    source: str


# matmul_4bits_test.cc Float32_4b_Accuracy0 / Accuracy4 (M, N, K, block); the last one is Accuracy4's
# extra.  The op test runs each shape without bias and (with g_idx) with bias.
MATMUL_4BITS = [
    (1, 1, 16, 16), (1, 2, 16, 16), (1, 32, 16, 16), (1, 32, 32, 16), (1, 32, 16, 128), (1, 288, 16, 16),
    (1, 288, 1024, 16), (1, 288, 1024, 128), (1, 288, 93, 32), (1, 288, 93, 128), (1, 288, 1234, 16),
    (2, 1, 16, 16), (2, 2, 16, 16), (100, 1, 16, 16), (100, 2, 16, 16), (100, 32, 16, 16), (100, 32, 32, 16),
    (100, 32, 16, 128), (100, 288, 16, 16), (100, 288, 1024, 16), (100, 288, 1024, 128), (100, 288, 93, 32),
    (100, 288, 93, 128), (100, 288, 1234, 16), (100, 288, 192, 64),
]
BOTH, BIAS, NOBIAS = (False, True), (True,), (False,)


def sqnbitgemm_shapes(block: int) -> list[tuple[int, int, int, tuple[bool, ...]]]:
    """test_sqnbitgemm.cpp's short-execute grid (registered per BlkLen): (M, N, K, bias modes)."""
    s = [(b, b, b, BOTH) for b in range(1, 16)]
    s += [(b, b, b, BOTH) for b in (16, 32, 64, 128, 256)]
    s += [(288, 288, 288, BIAS)]  # (256, 256, 256, bias) is already above
    for b in range(1, 96):
        s += [(1, b, 32, NOBIAS), (1, 32, b, BIAS), (1, b, b, NOBIAS)]
    s += [(43, 500, 401, BIAS), (1, 2, 16, BOTH)]
    s += [(m, n, k, BOTH) for m in (1, 11) for n, k in ((1027, 1031), (527, 2131))]
    return s


def _merge(entries) -> list[Shape]:
    """Union of (M, N, K, block, bias modes, source), merging bias modes and sources of duplicates."""
    out: dict[tuple[int, int, int, int], tuple[set, list]] = {}
    for M, N, K, block, bias, source in entries:
        modes, sources = out.setdefault((M, N, K, block), (set(), []))
        modes.update(bias)
        if source not in sources:
            sources.append(source)
    return [Shape(*key, tuple(sorted(modes)), "+".join(src)) for key, (modes, src) in out.items()]


def full_shapes() -> list[Shape]:
    """Every shape ORT's two tests use, at the block size(s) they use it with."""
    entries = [(M, N, K, b, BOTH, "matmul_4bits") for M, N, K, b in MATMUL_4BITS]
    entries += [(M, N, K, b, bias, "sqnbitgemm") for b in BLOCKS for M, N, K, bias in sqnbitgemm_shapes(b)]
    return _merge(entries)


# The CI subset: per block size a few of ORT's shapes -- M = 1 and M up to 100, odd N and K, K < block,
# K not a multiple of the block, the largest K (2131) -- each a member of full_shapes().
FAST = {
    16: [(1, 1, 16, BOTH), (2, 2, 16, BOTH), (100, 288, 1234, BOTH), (1, 288, 1234, BOTH), (13, 13, 13, BOTH)],
    32: [(1, 288, 93, BOTH), (100, 288, 93, BOTH), (15, 15, 15, BOTH), (1, 32, 67, BIAS), (1, 77, 77, NOBIAS)],
    64: [(100, 288, 192, BOTH), (7, 7, 7, BOTH), (43, 500, 401, BIAS), (1, 95, 32, NOBIAS), (64, 64, 64, BOTH)],
    128: [(1, 32, 16, BOTH), (100, 32, 16, BOTH), (1, 288, 93, BOTH), (1, 1027, 1031, BOTH), (1, 3, 3, NOBIAS)],
    256: [(11, 527, 2131, BOTH), (1, 93, 93, NOBIAS), (1, 32, 89, BIAS), (3, 3, 3, BOTH), (1, 2, 16, BOTH)],
}


def fast_shapes() -> list[Shape]:
    full = {(s.M, s.N, s.K, s.block): s for s in full_shapes()}
    out = []
    for block, shapes in FAST.items():
        for M, N, K, bias in shapes:
            src = full[(M, N, K, block)]
            assert set(bias) <= set(src.bias), (M, N, K, block)
            out.append(Shape(M, N, K, block, bias, src.source))
    return out


# ----------------------------------------------------------------------------- kernel configs
TARGETS = ("scalar", "rvv", "ime")
# Per target: the built-in kernels' tiles (gemm, gemv; rvv's gemm tile by compute), the computes they are
# built with (those the target accepts) and settings of their own.
_TILES = {"scalar": {"fp32": ("4x8", "1x16"), "int8": ("4x8", "1x16")},
          "rvv": {"fp32": ("4x16", "1x16"), "int8": ("2x16", "1x16")},
          "ime": {"int8": ("4x16", "1x16")}}
_OWN_SETTINGS = {"rvv": {"vlen": 128}}


def _builtin_kernel(target: str, compute: str, bits: int, asym: bool, bias: bool) -> tuple[str, dict]:
    """One built-in kernel; op / unpack / scales are varied over the 8 (bits, zp, bias) variants so
    each target meets gemm and gemv, both nibble orders and both scale placements."""
    i = (bits == 8) * 4 + asym * 2 + bias
    op = ("gemm", "gemv")[(i ^ (i >> 1)) & 1]
    tiles = _TILES[target][compute]
    settings = {
        "op": op, "compute": compute, "target": target, "tile": tiles[op == "gemv"],
        "bits": bits, "zero_point": "asymmetric" if asym else "symmetric", "bias": "yes" if bias else "no",
        "k_unroll": 2, "unpack": ("planar", "interleaved")[((i >> 1) ^ (i >> 2)) & 1],
        "scales": ("inline", "separate")[(i ^ (i >> 2)) & 1],
    }
    settings.update(_OWN_SETTINGS.get(target, {}))
    name = f"ort_{target}_{compute}_q{bits}_{'asym' if asym else 'sym'}{'_bias' if bias else ''}"
    return name, settings


def builtin_configs() -> list[tuple[str, dict]]:
    """every target x compute (ime: int8 only) x bits 4/8 x symmetric/asymmetric x bias."""
    out = []
    for target in TARGETS:
        for compute in _TILES[target]:
            for bits, asym, bias in itertools.product((4, 8), (False, True), (False, True)):
                out.append(_builtin_kernel(target, compute, bits, asym, bias))
    return out


def builtin_spec_text(block: int, names: list[str] | None = None) -> str:
    """The built-in kernel set at one block size, as DSL text (optionally only some kernels)."""
    lines = [f"# imegen ort-check built-in kernels, block {block}", f"defaults {{ block = {block} }}", ""]
    for name, settings in builtin_configs():
        if names is None or name in names:
            lines.append(f"kernel {name} {{")
            lines += [f"  {k} = {v}" for k, v in settings.items()]
            lines += ["}", ""]
    return "\n".join(lines)


def builtin_specs(full: bool) -> list[KernelSpec]:
    """--full: every built-in kernel at every block size.  Fast: each kernel at one block size,
    rotating through 16..256 so every block size and every target meet several kernels."""
    specs = []
    names = [n for n, _ in builtin_configs()]
    for bi, block in enumerate(BLOCKS):
        chosen = names if full else [n for j, n in enumerate(names) if j % len(BLOCKS) == bi]
        for s in specs_from_text(builtin_spec_text(block, chosen), f"<ort-check block {block}>"):
            specs.append(s)
    return specs


def runs_for(spec: KernelSpec, full: bool) -> list[tuple[str, bool, list[int | None]]]:
    """(compiler, host, VLENs) per build of a kernel: scalar natively (host cc); rvv with clang under
    QEMU at VLEN 128 and 256 (those the kernel accepts); ime under QEMU at 256 with clang (--full:
    also GCC).  One build runs at all its VLENs (so no two threads build the same sources)."""
    target = targets.of(spec)
    if target.host_build:
        return [("host cc", True, [None])]
    vlens = [v for v in (128, 256) if target.accepts_vlen(spec, v)] or [spec.vlen]
    return [(c, False, vlens) for c in (target.compilers if full else target.compilers[:1])]


# ----------------------------------------------------------------------------- comparison
@dataclass(frozen=True)
class Verdict:
    ok: bool
    max_abs: float
    max_rel: float
    worst: float  # max err / tolerance
    tolerance: str
    note: str = ""
    a_codes_differ: int = 0  # int8 on x86: A codes where ORT's quantizer and the kernel's differ
    err_where_differ: float = 0.0  # max abs err on the rows holding such codes
    err_elsewhere: float = 0.0  # ... and on all other rows


def tolerance_text(level: int) -> str:
    a, r = TOLERANCE[level]
    return f"{a:g}+{r:g}|y|"


def compare_to_ort(C: np.ndarray, Y: np.ndarray, level: int, *, A: np.ndarray, qw: ref.QuantizedWeights,
                   bias: np.ndarray | None, status: int = 0, vmadots: tuple[int, int] | None = None) -> Verdict:
    """Kernel output C against ORT's Y for the same inputs, with ORT's tolerance for `level`."""
    tol_text = tolerance_text(level)
    if status != 0:
        return Verdict(False, np.inf, np.inf, np.inf, tol_text, f"kernel returned status {status}")
    if vmadots is not None and vmadots[0] != vmadots[1]:
        return Verdict(False, np.inf, np.inf, np.inf, tol_text, f"executed {vmadots[0]} vmadot, expected {vmadots[1]}")
    a, r = TOLERANCE[level]
    C64 = np.asarray(C, np.float64)
    err = np.abs(C64 - Y)
    tol = a + r * np.abs(Y)
    max_abs = float(err.max(initial=0.0))
    max_rel = float((err / np.maximum(np.abs(Y), 1e-30)).max(initial=0.0))
    bad = ~(err <= tol)  # also NaN
    notes = []
    if level == 0 and bad.any():  # a K-dependent bound, if the plain one is not enough
        kbound = 2 * ref.forward_error_bound(A, ref.dequantize(qw), qw.K, bias)
        rescued = bad & (err <= kbound)
        if rescued.any():
            tol = np.where(rescued, kbound, tol)
            bad &= ~rescued
            tol_text += "|K-bound"
            notes.append(f"{int(rescued.sum())} elements only within 2x forward_error_bound (K={qw.K})")
    worst = float((err / tol).max(initial=0.0)) if np.isfinite(err).all() else np.inf
    a_diff, err_diff, err_other = 0, 0.0, max_abs
    if level == 4 and X86:
        qa_ref, _ = ref.quantize_a_int8(A, qw.block_size)
        diff = qa_ref != quantize_a_int8_x86(A, qw.block_size)[0]
        if diff.any():
            rows = diff.any(axis=1)
            a_diff = int(diff.sum())
            err_diff, err_other = float(err[rows].max(initial=0.0)), float(err[~rows].max(initial=0.0))
            notes.append(f"x86 A-quant: {a_diff} A codes differ in {int(rows.sum())}/{len(rows)} rows "
                         f"(max abs err there {err_diff:.1e}, on other rows {err_other:.1e})")
    if bad.any():
        m, n = np.argwhere(bad)[0]
        notes.insert(0, f"C[{m},{n}] = {C64[m, n]!r}, ORT {Y[m, n]!r}, tolerance {tol[m, n]:.3g}; "
                        f"{int(bad.sum())} of {bad.size} elements off")
    return Verdict(not bad.any(), max_abs, max_rel, worst, tol_text, "; ".join(notes), a_diff, err_diff, err_other)


# ----------------------------------------------------------------------------- the suite
@dataclass(frozen=True)
class Row:
    shape: Shape
    bits: int
    zero_point: str
    bias: bool
    compute: str
    kernel: str
    target: str
    build: str  # compiler/vlen
    verdict: Verdict


@dataclass
class Suite:
    """The cases of one run: per kernel the shapes of its block size it is checked on."""
    specs: list[KernelSpec]
    shapes: list[Shape]
    full: bool = False
    seed: int = SEED
    _inputs: dict = field(default_factory=dict)
    _ort: dict = field(default_factory=dict)
    ort_self: list = field(default_factory=list)  # OrtSelfCheck per ORT model run

    def shapes_for(self, spec: KernelSpec) -> list[Shape]:
        return [s for s in self.shapes if s.block == spec.block and spec.bias in s.bias]

    def inputs(self, shape: Shape, bits: int, symmetric: bool):
        """ORT's recipe: a fresh generator per shape (RandomValueGenerator{1234}); A ~ N(0, 0.25)
        [M, K], B ~ N(0, 0.25) [K, N], bias ~ U(1, 5); B through ORT's quantizer binding."""
        key = (shape.M, shape.N, shape.K, shape.block, bits, symmetric)
        if key not in self._inputs:
            rng = np.random.default_rng(self.seed)
            A = rng.normal(0, 0.25, (shape.M, shape.K)).astype(F32)
            W = rng.normal(0, 0.25, (shape.K, shape.N)).astype(F32)
            bias = rng.uniform(1, 5, shape.N).astype(F32)
            self._inputs[key] = (A, ort_quantized_weights(W, bits, shape.block, symmetric), bias)
        return self._inputs[key]

    def case(self, spec: KernelSpec, shape: Shape) -> Case:
        A, qw, bias = self.inputs(shape, spec.bits, spec.zero_point == "symmetric")
        return Case(A, qw, bias if spec.bias else None)

    def ort_output(self, spec: KernelSpec, shape: Shape) -> np.ndarray:
        return self.ort_y(shape, spec.bits, spec.zero_point == "symmetric", spec.bias, LEVEL[spec.compute])

    def ort_y(self, shape: Shape, bits: int, symmetric: bool, bias: bool, level: int) -> np.ndarray:
        key = (shape.M, shape.N, shape.K, shape.block, bits, "symmetric" if symmetric else "asymmetric", bias, level)
        if key not in self._ort:
            A, qw, b = self.inputs(shape, bits, symmetric)
            c = Case(A, qw, b if bias else None)
            self._ort[key] = Y = run_ort(c.A, c.qw, c.bias, level)
            self.ort_self.append(check_ort_itself(key, level, c, Y))
        return self._ort[key]

    def dispatch_cases(self, group) -> list[tuple[Shape, bool, bool]]:
        """abi=mlas kernels take zero points and bias at run time: every (shape, zp mode, bias mode)
        ORT tests at the group's block size."""
        return [(s, sym, bias) for s in self.shapes if s.block == group.block for sym in (True, False) for bias in s.bias]


@dataclass(frozen=True)
class OrtSelfCheck:
    key: tuple
    level: int
    max_abs: float  # |ORT - imegen.reference model|
    worst: float  # ... / ORT's tolerance
    within_bound: bool  # ... <= the a-priori fp32 bound of that model


def check_ort_itself(key: tuple, level: int, c: Case, Y: np.ndarray) -> OrtSelfCheck:
    """ORT against the NumPy model of what it computes, no kernel involved: level 0 against the
    float64 dequantize-then-matmul (bound: forward_error_bound); level 4 against the exact int8
    model with the A codes this platform's MLAS produces (x86: 127/amax, round-half-even)."""
    a, r = TOLERANCE[level]
    if level == 0:
        exp = ref.matmul_nbits(c.A, c.qw, c.bias)
        bound = ref.forward_error_bound(c.A, ref.dequantize(c.qw), c.qw.K, c.bias)
    else:
        qa, s = (quantize_a_int8_x86 if X86 else ref.quantize_a_int8)(c.A, c.qw.block_size)
        exp, bound = int8_result(qa, s, c.qw, c.bias)
    err = np.abs(Y - exp)
    return OrtSelfCheck(key, level, float(err.max(initial=0.0)), float((err / (a + r * np.abs(exp))).max(initial=0.0)),
                        bool(np.all(err <= bound)))


def _run_build(suite: Suite, spec: KernelSpec, plan: KernelPlan, compiler: str, host: bool, vlens, log) -> list[Row]:
    """Build one kernel once, run all its shapes at each VLEN (one process per VLEN), compare to ORT."""
    shapes = suite.shapes_for(spec)
    cases = [suite.case(spec, s) for s in shapes]
    level = LEVEL[spec.compute]
    rows = []
    for vlen in vlens:
        label = "host cc" if host else f"{compiler}/{vlen}"
        t = time.perf_counter()
        try:
            b = build(plan, f"<ort-check {plan.name}>", compiler="clang" if host else compiler, host=host)
            results = run_cases(b, cases, vlen=vlen)
        except (ToolchainError, OSError) as e:
            if log:
                log(f"  {plan.name} [{label}]: FAILED\n{e}")
            rows += [Row(s, spec.bits, spec.zero_point, spec.bias, spec.compute, plan.name, spec.target, label,
                         Verdict(False, np.inf, np.inf, np.inf, tolerance_text(level),
                                 f"build/run failed: {str(e).splitlines()[0]}")) for s in shapes]
            continue
        mine = []
        for s, c, r in zip(shapes, cases, results):
            v = compare_to_ort(r.C, suite.ort_output(spec, s), level, A=c.A, qw=c.qw, bias=c.bias,
                               status=r.status, vmadots=(r.vmadots, expected_vmadots(plan, s.M, s.N, s.K)))
            mine.append(Row(s, spec.bits, spec.zero_point, spec.bias, spec.compute, plan.name, spec.target, label, v))
        if log:
            bad = sum(not x.verdict.ok for x in mine)
            log(f"  {plan.name} [{label}] block {spec.block}: {len(mine)} shapes, "
                f"{'ok' if not bad else f'{bad} FAILED'} ({time.perf_counter() - t:.1f} s)")
        rows += mine
    return rows


def run_suite(suite: Suite, *, jobs: int | None = None, log=None) -> list[Row]:
    """ORT outputs first (in this thread; ORT has its own thread pool), then every kernel build x
    VLEN in a pool of `jobs` threads (each one compiles and runs one process)."""
    jobs = jobs or os.cpu_count() or 1
    own = [s for s in suite.specs if getattr(s, "abi", "imegen") == "imegen"]
    dispatch = _dispatch_plan([s for s in suite.specs if s not in own])
    work = []
    for spec in own:
        if suite.shapes_for(spec):
            plan = plan_kernel(spec)
            work += [(_run_build, (suite, spec, plan, *run)) for run in runs_for(spec, suite.full)]
    needed = [(s, spec.bits, spec.zero_point == "symmetric", spec.bias, LEVEL[spec.compute])
              for spec in own for s in suite.shapes_for(spec)]
    if dispatch:
        for compiler, vlens in dispatch_runs(dispatch, suite.full):
            work.append((_run_dispatch, (suite, dispatch, compiler, vlens)))
        needed += [(s, g.bits, sym, bias, _group_level(g)) for g in dispatch.groups for s, sym, bias in suite.dispatch_cases(g)]
    t = last = time.perf_counter()
    for i, args in enumerate(needed, 1):
        suite.ort_y(*args)
        if log and (i == len(needed) or time.perf_counter() - last > 10):
            last = time.perf_counter()
            log(f"onnxruntime: {i}/{len(needed)} kernel cases ({len(suite._ort)} models run, {last - t:.1f} s)")
    if log:
        log(f"kernels: {len(work)} builds on {jobs} threads")
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = [pool.submit(fn, *args, log) for fn, args in work]
        return [row for f in futures for row in f.result()]
    finally:  # on Ctrl-C (or a failure) do not start the queued builds
        pool.shutdown(cancel_futures=True)


# ----------------------------------------------------------------------------- abi = mlas kernels
def _dispatch_plan(specs: list[KernelSpec]):
    """The MLAS dispatch of a spec's abi=mlas kernels (as `imegen generate` would emit it), or None."""
    if not specs:
        return None
    from ..abi.mlas import plan_dispatch

    spec_file = specs[0].source.file if specs[0].source else "ort_check.imegen"
    return plan_dispatch([plan_kernel(s) for s in specs], spec_file)


def _group_level(group) -> int:
    from ..abi.mlas import COMPUTE_FP32

    return 0 if group.compute == COMPUTE_FP32 else 4


def _group_plans(group) -> list[KernelPlan]:
    return [p for p in (group.m1, group.dequant, group.gemv, group.gemm) if p is not None]


def dispatch_runs(d, full: bool) -> list[tuple[str, list[int]]]:
    """Like `imegen check`: IME at VLEN 256, RVV at 128 and 256 (those all kernels accept); clang,
    and with --full also GCC when no kernel is rvv."""
    vlens = [v for v in (128, 256) if all(p.target.accepts_vlen(p.spec, v) for p in d.kernels)] or \
        [max(p.spec.vlen or 128 for p in d.kernels)]
    compilers = [c for c in ("clang", "gcc") if all(c in p.target.compilers for p in d.kernels)]
    return [(c, vlens) for c in (compilers if full else compilers[:1])]


def _run_dispatch(suite: Suite, d, compiler: str, vlens, log) -> list[Row]:
    """abi=mlas kernels through their generated dispatch, driven the way MLAS drives it
    (imegen/runtime/mlas_driver.c: packing, thread ranges, M = 1 vs gemm routing), on ORT's inputs."""
    from ..abi import mlas_check
    from ..abi.mlas import COMPUTE_INT8

    cases, meta = [], []
    for g in d.groups:
        for s, sym, bias in suite.dispatch_cases(g):
            A, qw, b = suite.inputs(s, g.bits, sym)
            cases.append(mlas_check.MlasCase(Case(A, qw, b if bias else None), g.compute))
            meta.append((g, s, sym, bias))
    rows = []
    for vlen in vlens:
        label = f"{compiler}/{vlen}"
        t = time.perf_counter()
        try:
            exe = mlas_check.build(d, d.kernels[0].spec.source.file if d.kernels[0].spec.source else "<ort-check>",
                                   compiler=compiler)
            results = mlas_check.run(exe, cases, vlen=vlen)
        except (ToolchainError, OSError) as e:
            if log:
                log(f"  dispatch {d.prefix} [{label}]: FAILED\n{e}")
            results = None
        for (g, s, sym, bias), c, r in zip(meta, cases, results or [None] * len(cases)):
            plans = _group_plans(g)
            level = _group_level(g)
            if r is None:
                v = Verdict(False, np.inf, np.inf, np.inf, tolerance_text(level), "build/run failed")
            else:
                v = compare_to_ort(r.C, suite.ort_y(s, g.bits, sym, bias, level), level, A=c.case.A, qw=c.case.qw,
                                   bias=c.case.bias, status=r.status)
                ime = any(p.target.needs_ime for p in plans)
                if v.ok and ime and g.compute == COMPUTE_INT8 and r.vmadots == 0:
                    v = Verdict(False, v.max_abs, v.max_rel, v.worst, v.tolerance, "IME kernels were not executed (no vmadot)")
            rows.append(Row(s, g.bits, "symmetric" if sym else "asymmetric", bias, "fp32" if level == 0 else "int8",
                            "+".join(p.name for p in plans),
                            "mlas:" + "/".join(sorted({p.spec.target for p in plans})), label, v))
        if log:
            bad = sum(not x.verdict.ok for x in rows[-len(cases):])
            log(f"  dispatch {d.prefix} [{label}]: {len(cases)} cases, {'ok' if not bad else f'{bad} FAILED'} "
                f"({time.perf_counter() - t:.1f} s)")
    return rows


# ----------------------------------------------------------------------------- report
def unchecked(suite: Suite, rows: list[Row]) -> list[str]:
    """Kernels of the suite that no row compared to ORT (a dispatch row names its kernels joined by "+")."""
    seen = {name for r in rows for name in r.kernel.split("+")}
    return [s.name for s in suite.specs if s.name not in seen]


def _fmt_err(x: float) -> str:
    return "inf" if not np.isfinite(x) else f"{x:.2e}"


def format_table(rows: list[Row]) -> str:
    head = ("M,N,K", "block", "bits", "zp", "bias", "compute", "target", "compiler/vlen", "max abs err",
            "max rel err", "err/tol", "tolerance", "result", "note")
    body = [(f"{r.shape.M},{r.shape.N},{r.shape.K}", str(r.shape.block), str(r.bits), r.zero_point[:4],
             "yes" if r.bias else "no", f"{r.compute} (level {LEVEL[r.compute]})", r.target, r.build,
             _fmt_err(r.verdict.max_abs), _fmt_err(r.verdict.max_rel), _fmt_err(r.verdict.worst),
             r.verdict.tolerance, "PASS" if r.verdict.ok else "FAIL", r.verdict.note) for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])


def summarize(rows: list[Row]) -> str:
    """One line per target x compiler/vlen x compute: worst errors over all its cases."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.target, r.build, r.compute), []).append(r)
    head = ("target", "compiler/vlen", "compute", "cases", "max abs err", "max rel err", "max err/tol", "failed")
    body = []
    for (target, b, compute), rs in sorted(groups.items()):
        body.append((target, b, compute, str(len(rs)), _fmt_err(max(r.verdict.max_abs for r in rs)),
                     _fmt_err(max(r.verdict.max_rel for r in rs)), _fmt_err(max(r.verdict.worst for r in rs)),
                     str(sum(not r.verdict.ok for r in rs))))
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])


def stderr_log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def footer(rows: list[Row], suite: Suite) -> str:
    """What the table cannot show: ORT against the NumPy models on its own, and the x86 A-quantization
    divergence summed over the run."""
    lines = []
    for level, what in ((0, "float64 dequantize-then-matmul (reference.matmul_nbits)"),
                        (4, "exact int8 model with " + ("x86 MLAS's A quantization (127/amax, round-half-even)"
                                                        if X86 else "MLAS's reference A quantization"))):
        checks = [c for c in suite.ort_self if c.level == level]
        if not checks:
            continue
        outside = [c for c in checks if not c.within_bound]
        worst = max(checks, key=lambda c: c.worst)
        lines.append(f"onnxruntime itself, accuracy_level {level}: {len(checks)} models vs the {what}: max abs err "
                     f"{max(c.max_abs for c in checks):.2e}, {worst.worst:.2g} of ORT's tolerance "
                     f"(at M,N,K,block,bits,zp,bias = {worst.key[:-1]}); "
                     + ("all within the a-priori fp32 bound" if not outside else
                        f"{len(outside)} NOT within the a-priori fp32 bound, e.g. (M,N,K,block,bits,zp,bias,level) = {outside[0].key}"))
    int8 = [r for r in rows if r.compute == "int8" and np.isfinite(r.verdict.max_abs)]
    if int8 and X86:
        hit = [r for r in int8 if r.verdict.a_codes_differ]
        msg = (f"x86 A quantization: onnxruntime on this host quantizes A with 127/amax and round-half-even, imegen's int8 "
               f"kernels (like MLAS's reference and NEON code) with amax/127 and round-half-away; in this run "
               f"{sum(r.verdict.a_codes_differ for r in hit)} A codes differed, in {len(hit)} of {len(int8)} int8 cases")
        if hit:
            msg += (f"; max abs err on rows with a differing code {max(r.verdict.err_where_differ for r in hit):.2e}, "
                    f"on all other rows of int8 cases {max(r.verdict.err_elsewhere for r in int8):.2e}")
        lines.append(msg + ".")
    kb = [r for r in rows if "K-bound" in r.verdict.tolerance]
    if kb:
        lines.append(f"{len(kb)} fp32 cases needed the K-dependent bound 2 x forward_error_bound for some elements "
                     "(outside ORT's 1e-5 + 1e-4|y|).")
    return "\n".join(lines)
