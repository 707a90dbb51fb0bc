"""The SiLU gate in the up projection's kernel: decoder_ops.py folds genai's Sigmoid(g), Mul(g, s), Mul(., up) into
imegen's up MatMulNBits (its gate input), and the kernel applies silu(g) to each block of its output as it finishes
it (matmul_prepared_then's epilogue), so the MLP's activation never makes its own pass over DRAM.

Checked in Debian's real riscv64 onnxruntime under QEMU with the IME emulator, at M = 1 (gemv), 5 and 40 (gemm):
- tight: Y equals a NumPy (float64) silu(g) * u of the same kernels' own g and u (the model run unfused, with g and
  u as outputs), within fp32 rounding: a SiLU applied twice, to a partial sum, or to the wrong block fails it;
- against the peer: stock ORT's own Sigmoid, Mul, Mul after its MatMulNBits, within ORT's level-4 tolerance;
- the library's counters: every Run of the gated node counted, the IME kernels (or, with no IME hart, the fallback,
  run through the same epilogue) ran.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import imegen
from imegen import toolchain
from imegen.ort import ort_check as oc
from imegen.ort.customop import parse_decoder_stats, parse_stats
from imegen.ort.decoder_ops import GATE_INPUT, rewrite_decoder_ops
from imegen.ort.riscv import RiscvSession

needs_qemu = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")
K, N = 128, 96
SPEC = """
defaults { bits = 4 block = 32 zero_point = symmetric compute = int8 }
kernel gemv { op = gemv target = ime tile = 1x16 }
kernel gemm { op = gemm target = ime tile = 4x16 }
kernel fb   { op = gemm target = rvv vlen = 256 tile = 2x16 fallback = yes }
"""
ROWS = (1, 5, 40)
RTOL = 2e-5  # fp32 rounding: |got - want| <= RTOL * (1 + max |want|)


def mlp(rng, outputs=("Y",)):
    """genai's gated MLP: gate and up MatMulNBits of X, Sigmoid(gate), Mul(gate, s), Mul(., up)."""
    nodes, inits = [], []
    for name in ("gate", "up"):
        qw = oc.ort_quantized_weights(rng.normal(0, 0.3, (K, N)).astype(np.float32), 4, 32, True)
        inits += [numpy_helper.from_array(qw.data, f"{name}_B"), numpy_helper.from_array(qw.scales, f"{name}_s")]
        nodes.append(helper.make_node("MatMulNBits", ["X", f"{name}_B", f"{name}_s"], [name], name=f"{name}_proj",
                                      domain="com.microsoft", K=K, N=N, bits=4, block_size=32, accuracy_level=4))
    nodes += [helper.make_node("Sigmoid", ["gate"], ["sig"], name="act/Sigmoid"),
              helper.make_node("Mul", ["gate", "sig"], ["silu"], name="act/Mul"),
              helper.make_node("Mul", ["silu", "up"], ["Y"], name="mlp/Mul")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["M", N]) for o in outputs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def accelerated(model, specs):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    assert all(d.moved for d in imegen.rewrite_model(m, specs))
    decisions = rewrite_decoder_ops(m)
    return m, decisions


def test_the_silu_moves_into_the_up_projection():
    specs = imegen.load_spec(SPEC)
    model, decisions = accelerated(mlp(np.random.default_rng(1)), specs)
    assert [(d.op, d.moved) for d in decisions] == [("SiluGate", True)]
    assert [n.op_type for n in model.graph.node] == ["MatMulNBits", "MatMulNBits"]
    up = next(n for n in model.graph.node if n.name == "up_proj")
    assert up.domain == "ai.imegen" and up.input[GATE_INPUT] == "gate" and list(up.output) == ["Y"]
    onnx.checker.check_model(model)


@pytest.mark.parametrize("why,outputs,up_domain", [
    ("the up projection's output is also a graph output", ("Y", "up"), "ai.imegen"),
    ("ORT keeps the up projection", ("Y",), "com.microsoft"),
])
def test_the_silu_stays_a_separate_operator_otherwise(why, outputs, up_domain):
    specs = imegen.load_spec(SPEC)
    model = mlp(np.random.default_rng(1), outputs)
    if up_domain == "com.microsoft":
        _, decisions = model, rewrite_decoder_ops(model)
    else:
        model, decisions = accelerated(model, specs)
    assert [(d.op, d.moved) for d in decisions] == [("SiluMul", True)], why
    assert "SiluMul" in [n.op_type for n in model.graph.node]
    assert all(len(n.input) <= GATE_INPUT for n in model.graph.node if n.op_type == "MatMulNBits")


def test_the_gate_input_is_moved_before_its_reader_when_the_graph_computes_up_first():
    specs = imegen.load_spec(SPEC)
    model = mlp(np.random.default_rng(1))
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([nodes[1], nodes[0]] + nodes[2:])  # up_proj before gate_proj: still a valid graph
    model, _ = accelerated(model, specs)
    assert [n.name for n in model.graph.node] == ["gate_proj", "up_proj"]
    onnx.checker.check_model(model)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """X per row count, stock ORT's Y/gate/up, imegen's unfused gate/up (its own kernels) and the fused model."""
    tmp = tmp_path_factory.mktemp("silu_gate")
    specs = imegen.load_spec(SPEC)
    rng = np.random.default_rng(5)
    with_parts = mlp(rng, ("Y", "gate", "up"))
    onnx.save(with_parts, tmp / "stock.onnx")
    unfused = onnx.ModelProto()
    unfused.CopyFrom(with_parts)
    imegen.rewrite_model(unfused, specs)
    onnx.save(unfused, tmp / "unfused.onnx")
    fused, _ = accelerated(mlp(np.random.default_rng(5)), specs)
    onnx.save(fused, tmp / "fused.onnx")
    feeds = [{"X": rng.normal(0, 1, (M, K)).astype(np.float32)} for M in ROWS]
    lib = imegen.build_ort_library(specs)
    with RiscvSession(tmp / "stock.onnx", "1.23") as s:
        stock = [s.run(f) for f in feeds]
    with RiscvSession(tmp / "unfused.onnx", "1.23", custom_ops=lib) as s:
        parts = [s.run(f) for f in feeds]
    return tmp, lib, feeds, stock, parts


def silu_times(g, u):
    g = g.astype(np.float64)
    return g / (1 + np.exp(-g)) * u.astype(np.float64)


def allowed_vs_stock(want):
    """ORT's level-4 tolerance (a + r|x|) on stock's g and u, carried through y = silu(g) u to first order: both
    projections quantize A to int8 (imegen's and MLAS's differently), and silu(g) scales u's error while u scales
    g's through silu'(g)."""
    a, r = oc.TOLERANCE[4]
    g, u = want["gate"].astype(np.float64), want["up"].astype(np.float64)
    s = 1 / (1 + np.exp(-g))
    return np.abs(s * (1 + g * (1 - s))) * (a + r * np.abs(g)) * np.abs(u) + np.abs(g * s) * (a + r * np.abs(u))


def check_against_references(runs, got):
    *_, stock, parts = runs
    for out, want, mine in zip(got, stock, parts):
        tight = silu_times(mine["gate"], mine["up"])
        err = np.abs(out["Y"] - tight).max()
        assert err <= RTOL * (1 + np.abs(tight).max()), f"Y vs silu(g) * u of the same kernels: {err:.3g}"
        assert (np.abs(out["Y"] - want["Y"]) <= allowed_vs_stock(want)).all(), "Y vs stock ORT's Sigmoid, Mul, Mul"


@needs_qemu
@pytest.mark.parametrize("version", ["1.23", "1.21"])
def test_gated_up_projection_matches_its_references(runs, version, monkeypatch):
    tmp, lib, feeds, *_ = runs
    monkeypatch.delenv("IMEGEN_IME_HARTS", raising=False)
    with RiscvSession(tmp / "fused.onnx", version, custom_ops=lib, threads=2) as s:
        got = [s.run(f) for f in feeds]
        text = s.stats()
    check_against_references(runs, got)
    stats = parse_stats(text)
    assert parse_decoder_stats(text) == {"SiluGate": (1, len(ROWS))}
    assert stats["gemv"] > 0 and stats["gemm"] > 0 and stats["vmadots"] > 0 and stats["slices_fallback"] == 0


@needs_qemu
@pytest.mark.parametrize("vlen", [256, 1024])
def test_gated_up_projection_on_the_fallback(runs, monkeypatch, vlen):
    """No IME hart in the process: the node runs on its RVV fallback kernel, gated through the same epilogue (at
    VLEN 1024 a block's 16 columns take the SiLU's m1 copy, at 256 its m2 one)."""
    tmp, lib, feeds, *_ = runs
    monkeypatch.setenv("IMEGEN_IME_HARTS", "none")
    with RiscvSession(tmp / "fused.onnx", "1.23", custom_ops=lib, threads=2, vlen=vlen) as s:
        got = [s.run(f) for f in feeds]
        stats = parse_stats(s.stats())
    *_, stock, _ = runs
    for out, want in zip(got, stock):
        assert (np.abs(out["Y"] - want["Y"]) <= allowed_vs_stock(want)).all()
    assert stats["vmadots"] == 0 and stats["fb"] > 0 and stats["slices_fallback"] > 0


@needs_qemu
def test_gated_up_projection_slice_by_slice_on_the_fallback(runs, monkeypatch):
    """IME harts that no thread can reach (IMEGEN_IME_HARTS names a hart this machine lacks): the node keeps its
    IME kernels, and each slice falls back to the RVV kernel on its own, which has no prepared workspace to hand an
    epilogue and gates its output after its matmul. Tight against the same fallback's unfused g and u."""
    tmp, lib, feeds, stock, _ = runs
    monkeypatch.setenv("IMEGEN_IME_HARTS", "63")
    with RiscvSession(tmp / "unfused.onnx", "1.23", custom_ops=lib, threads=2) as s:
        parts = [s.run(f) for f in feeds]
    with RiscvSession(tmp / "fused.onnx", "1.23", custom_ops=lib, threads=2) as s:
        got = [s.run(f) for f in feeds]
        stats = parse_stats(s.stats())
    for out, mine, want in zip(got, parts, stock):
        tight = silu_times(mine["gate"], mine["up"])
        assert np.abs(out["Y"] - tight).max() <= RTOL * (1 + np.abs(tight).max())
        assert (np.abs(out["Y"] - want["Y"]) <= allowed_vs_stock(want)).all()
    assert stats["vmadots"] == 0 and stats["slices_on_ime"] == 0 and stats["slices_fallback"] > 0 and stats["fb"] > 0


@needs_qemu
def test_a_gate_not_shaped_as_the_output_fails_the_run(runs, tmp_path):
    """The gate is read element for element with Y: one of Y's element count in another shape is refused, named."""
    from imegen.ort.riscv import OrtError

    _, lib, *_ = runs
    model, _ = accelerated(mlp(np.random.default_rng(5)), imegen.load_spec(SPEC))
    del model.graph.node[0]  # gate_proj: the gate becomes a graph input
    model.graph.input.append(helper.make_tensor_value_info("gate", TensorProto.FLOAT, ["A", "B"]))
    onnx.save(model, tmp_path / "m.onnx")
    x = np.ones((5, K), np.float32)
    with RiscvSession(tmp_path / "m.onnx", "1.23", custom_ops=lib) as s:
        assert s.run({"X": x, "gate": np.zeros((5, N), np.float32)})["Y"].shape == (5, N)
        with pytest.raises(OrtError, match=r"node 'up_proj': the gate's shape is not the output's"):
            s.run({"X": x, "gate": np.zeros((N, 5), np.float32)})
