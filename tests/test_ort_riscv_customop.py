"""imegen's custom-op library inside Debian's real riscv64 onnxruntime (1.21 and 1.23) under QEMU.

Single-node MatMulNBits models (B, scales, zero points from ORT's own quantizer) run in stock ORT and,
rewritten, in ORT + imegen's library, in the same riscv64 ORT; outputs must agree within ORT's
tolerance for the node's accuracy level, and the library's counters must show its kernels ran.
CI runs a pairwise selection of target x compute x bits x zero points x bias x ORT version (each
with M = 1, M > 1 and 3-d A); `--fuzz` runs the full product.
"""

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import imegen
from imegen.ort import ort_check as oc
from imegen.ort.customop import parse_stats
from imegen.ort.riscv import OrtError, RiscvSession

# (N, K) from ort-check's shapes (matmul_4bits_test.cc, test_sqnbitgemm.cpp); odd N and K included.
SHAPES = [(288, 93), (13, 13), (95, 32), (7, 7), (77, 77)]
BLOCK = {"ime": 32, "rvv": 64, "scalar": 16}
# Pairwise over (target, compute, bits, asymmetric, bias, ORT version): every pair of values of any two
# dimensions that the hardware allows (ime is int8 only) appears in some row.
PAIRWISE = [
    ("ime", "int8", 4, True, False, "1.23"), ("ime", "int8", 8, False, True, "1.21"),
    ("ime", "int8", 4, False, True, "1.23"), ("ime", "int8", 8, True, False, "1.21"),
    ("rvv", "fp32", 4, False, True, "1.21"), ("rvv", "int8", 8, True, True, "1.23"),
    ("rvv", "fp32", 8, True, False, "1.23"), ("rvv", "int8", 4, False, False, "1.21"),
    ("scalar", "fp32", 4, True, True, "1.21"), ("scalar", "int8", 8, False, False, "1.23"),
    ("scalar", "fp32", 8, False, True, "1.23"), ("scalar", "int8", 4, True, False, "1.21"),
]
FULL = [c for c in itertools.product(("ime", "rvv", "scalar"), ("fp32", "int8"), (4, 8), (False, True),
                                     (False, True), ("1.21", "1.23")) if not (c[0] == "ime" and c[1] == "fp32")]


def spec_text(target, compute, bits, asym, bias, block):
    common = (f"bits = {bits} block = {block} compute = {compute} target = {target} "
              f"zero_point = {'asymmetric' if asym else 'symmetric'} bias = {'yes' if bias else 'no'}"
              + (" vlen = 128" if target == "rvv" else ""))
    gemm_tile = "2x16" if target == "rvv" and compute == "int8" else "4x16"
    return (f"kernel k_gemv {{ op = gemv tile = 1x16 {common} }}\n"
            f"kernel k_gemm {{ op = gemm tile = {gemm_tile} {common} }}\n")


def single_node_model(qw, bias, level, *, b_constant=True, k_dim=True):
    """MatMulNBits with A of any rank (unshaped input), B/scales/zero points/bias initializers."""
    inits = [numpy_helper.from_array(qw.scales, "scales")]
    inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)]
    if b_constant:
        inits.append(numpy_helper.from_array(qw.data, "B"))
    else:
        inputs.append(helper.make_tensor_value_info("B", TensorProto.UINT8, list(qw.data.shape)))
    names = ["A", "B", "scales", "", "", ""]
    if qw.zero_points is not None:
        inits.append(numpy_helper.from_array(qw.zero_points, "zero_points"))
        names[3] = "zero_points"
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "bias"))
        names[5] = "bias"
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["Y"], name="mm0", domain="com.microsoft", K=qw.K, N=qw.N,
                            bits=qw.bits, block_size=qw.block_size, accuracy_level=level)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def stock_version(bits, version):
    """Stock ORT 1.21 has only 4-bit MatMulNBits (test_stock_ort_121_refuses_8_bit): 8-bit nodes run in
    ORT 1.21 + imegen are compared with stock ORT 1.23, the same Debian build lineage."""
    return "1.23" if bits == 8 else version


def weights(rng, N, K, bits, block, asym):
    return oc.ort_quantized_weights(rng.normal(0, 0.25, (K, N)).astype(np.float32), bits, block, not asym)


def _config_id(c):
    return f"{c[0]}-{c[1]}-q{c[2]}-{'asym' if c[3] else 'sym'}-{'bias' if c[4] else 'nobias'}-ort{c[5]}"


def pytest_generate_tests(metafunc):
    if "config" in metafunc.fixturenames:
        configs = FULL if metafunc.config.getoption("--fuzz") else PAIRWISE
        metafunc.parametrize("config", configs, ids=[_config_id(c) for c in configs])


def test_stock_ort_vs_imegen_single_node(tmp_path, config, request):
    target, compute, bits, asym, bias, version = config
    block = BLOCK[target]
    specs = imegen.load_spec(spec_text(target, compute, bits, asym, bias, block))
    lib = imegen.build_ort_library(specs)
    level = 4 if compute == "int8" else 0
    a_tol, r_tol = oc.TOLERANCE[level]
    i = PAIRWISE.index(config) if config in PAIRWISE else FULL.index(config)
    shapes = SHAPES if request.config.getoption("--fuzz") else [SHAPES[i % 5], SHAPES[(i + 2) % 5]]
    rng = np.random.default_rng(1234 + i)
    for N, K in shapes:
        qw = weights(rng, N, K, bits, block, asym)
        b = rng.uniform(1, 5, N).astype(np.float32) if bias else None
        model = single_node_model(qw, b, level)
        onnx.save(model, tmp_path / "stock.onnx")
        decisions = imegen.rewrite_model(model, specs)
        assert [d.moved for d in decisions] == [True], decisions
        onnx.save(model, tmp_path / "imegen.onnx")
        feeds = [rng.normal(0, 0.25, (1, K)), rng.normal(0, 0.25, (5, K)), rng.normal(0, 0.25, (2, 3, K))]
        with RiscvSession(tmp_path / "stock.onnx", stock_version(bits, version)) as s:
            stock = [s.run({"A": a.astype(np.float32)})["Y"] for a in feeds]
        with RiscvSession(tmp_path / "imegen.onnx", version, custom_ops=lib, threads=2) as s:
            mine = [s.run({"A": a.astype(np.float32)})["Y"] for a in feeds]
            stats = parse_stats(s.stats())
        for a, y0, y1 in zip(feeds, stock, mine):
            assert y1.shape == a.shape[:-1] + (N,)
            err = np.abs(y1.astype(np.float64) - y0)
            assert (err <= a_tol + r_tol * np.abs(y0)).all(), (N, K, a.shape, err.max())
        assert (stats["k_gemv"], stats["k_gemm"]) == (1, 2)  # M = 1 on gemv; M = 5 and 2x3 on gemm
        if target == "ime":
            assert stats["vmadots"] > 0


# ------------------------------------------------------------------------------------------ bad input
IME_SPEC = spec_text("ime", "int8", 4, True, False, 32)


@pytest.fixture(scope="module")
def ime_lib():
    specs = imegen.load_spec(IME_SPEC)
    return specs, imegen.build_ort_library(specs)


def _forced(model, tmp_path, name="forced.onnx"):
    """Move every MatMulNBits node into imegen's domain whatever the spec says (to see the library refuse)."""
    for n in model.graph.node:
        n.domain = "ai.imegen"
    model.opset_import.add(domain="ai.imegen", version=1)
    onnx.save(model, tmp_path / name)
    return tmp_path / name


def test_stock_ort_121_refuses_8_bit(tmp_path):
    model = single_node_model(weights(np.random.default_rng(0), 16, 64, 8, 32, True), None, 4)
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(OrtError, match="Only 4b quantization is supported"):
        RiscvSession(tmp_path / "m.onnx", "1.21")


def test_rewritten_model_without_the_library_is_an_ort_error(tmp_path, ime_lib):
    specs, _ = ime_lib
    model = single_node_model(weights(np.random.default_rng(0), 16, 64, 4, 32, True), None, 4)
    assert imegen.rewrite_model(model, specs)[0].moved
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(OrtError, match="ai.imegen"):
        RiscvSession(tmp_path / "m.onnx", "1.21")


def test_unsupported_block_size_is_refused_at_session_creation(tmp_path, ime_lib):
    specs, lib = ime_lib
    model = single_node_model(weights(np.random.default_rng(0), 16, 64, 4, 64, True), None, 4)
    d = imegen.rewrite_model(model, specs)[0]
    assert not d.moved and "block 64" in d.detail
    for version in ("1.21", "1.23"):
        with pytest.raises(OrtError, match="node 'mm0': no kernel .* serves bits 4, block_size 64"):
            RiscvSession(_forced(model, tmp_path), version, custom_ops=lib)


def test_non_constant_b_is_refused(tmp_path, ime_lib):
    specs, lib = ime_lib
    model = single_node_model(weights(np.random.default_rng(0), 16, 64, 4, 32, True), None, 4, b_constant=False)
    d = imegen.rewrite_model(model, specs)[0]
    assert not d.moved and "not a constant initializer" in d.detail
    with pytest.raises(OrtError, match="node 'mm0': B is not a constant initializer"):
        RiscvSession(_forced(model, tmp_path), "1.23", custom_ops=lib)


def test_wrong_input_shapes_are_errors_not_crashes(tmp_path, ime_lib):
    specs, lib = ime_lib
    model = single_node_model(weights(np.random.default_rng(0), 16, 64, 4, 32, True), None, 4)
    imegen.rewrite_model(model, specs)
    onnx.save(model, tmp_path / "m.onnx")
    with RiscvSession(tmp_path / "m.onnx", "1.21", custom_ops=lib) as s:
        with pytest.raises(OrtError, match="node 'mm0': A's last dimension is 63, expected K = 64"):
            s.run({"A": np.zeros((2, 63), np.float32)})
        # the session still works afterwards, on imegen's kernel
        assert s.run({"A": np.ones((2, 64), np.float32)})["Y"].shape == (2, 16)
        assert parse_stats(s.stats())["k_gemm"] == 1
    # a B initializer of the wrong size (the node's N says 17)
    bad = single_node_model(weights(np.random.default_rng(0), 16, 64, 4, 32, True), None, 4)
    next(a for a in bad.graph.node[0].attribute if a.name == "N").i = 17
    with pytest.raises(OrtError, match="node 'mm0': B has 512 elements, expected 544"):
        RiscvSession(_forced(bad, tmp_path), "1.21", custom_ops=lib)


def test_ime_kernels_refuse_a_hart_without_ime(tmp_path, ime_lib):
    specs, lib = ime_lib
    model = single_node_model(weights(np.random.default_rng(0), 16, 64, 4, 32, True), None, 4)
    imegen.rewrite_model(model, specs)
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(OrtError, match=r"node .mm0.: kernel k_gemv uses SpacemiT IME .*VLEN is not 256"):
        RiscvSession(tmp_path / "m.onnx", "1.21", custom_ops=lib, vlen=128)


# ------------------------------------------------------------------------------------------ commands, API
def test_model_check_command(tmp_path, capsys):
    spec = tmp_path / "k.imegen"
    spec.write_text(IME_SPEC)
    model = single_node_model(weights(np.random.default_rng(0), 40, 96, 4, 32, True), None, 4)
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("A", TensorProto.FLOAT, ["batch", 96]))
    onnx.save(model, tmp_path / "m.onnx")
    from imegen.cli import main

    assert main(["ort-model-check", str(spec), str(tmp_path / "m.onnx"), "--ort-version", "1.21", "--dim", "batch=3"]) == 0
    out = capsys.readouterr().out
    assert "1 of 1 rewritten" in out and "k_gemm 1" in out and "PASS" in out
    assert main(["ort-rewrite", str(spec), str(tmp_path / "m.onnx"), "-o", str(tmp_path / "r.onnx")]) == 0
    assert "moved mm0: M=1 k_gemv, M=2+ k_gemm" in capsys.readouterr().out
    assert main(["ort-model-check", str(spec), str(tmp_path / "missing.onnx")]) == 2


def test_public_api_runs_a_kernel_on_ort_initializers():
    rng = np.random.default_rng(3)
    specs = imegen.load_spec("kernel k { op = gemm target = scalar tile = 4x8 bits = 4 block = 32 "
                             "zero_point = asymmetric compute = fp32 }")
    qw = weights(rng, 24, 80, 4, 32, True)
    A = rng.normal(0, 0.25, (2, 3, 80)).astype(np.float32)
    k = imegen.build_kernel(specs, host=True)
    Y = k.run(A, qw.data, qw.scales.ravel(), qw.zero_points.ravel(), K=80)
    assert Y.shape == (2, 3, 24)
    np.testing.assert_allclose(Y.reshape(6, 24), oc.run_ort(A.reshape(6, 80), qw), rtol=1e-4, atol=1e-5)
    assert k.compare(A, qw.data, qw.scales, qw.zero_points, K=80).ok
