"""fold_bias_adds: a com.microsoft MatMulNBits followed by an Add of a constant [N] bias becomes one MatMulNBits
with that bias input (ORT's own MatMulNBitsFusion, done in the file), and nothing else does."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import genai_layout as gl
from imegen.ir import specs_from_text
from imegen.ort.rewrite import fold_bias_adds

N, K = 64, 64


def mm_add(bias_shape=(N,), *, constant=True, second_user=False, graph_output=False):
    m = gl.nbits_model(K=K, N=N, layers=1, accuracy_level=0)
    g = m.graph
    mm = next(n for n in g.node if n.op_type == "MatMulNBits")
    out = mm.output[0]
    mm.output[0] = "mm_out"
    inputs = []
    if constant:
        g.initializer.append(numpy_helper.from_array(np.linspace(-1, 1, int(np.prod(bias_shape)), dtype=np.float32)
                                                     .reshape(bias_shape), "bias"))
    else:
        inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, list(bias_shape)))
    g.input.extend(inputs)
    g.node.append(helper.make_node("Add", ["bias", "mm_out"], [out], name="add"))
    if second_user:
        g.node.append(helper.make_node("Neg", ["mm_out"], ["neg"], name="neg"))
        g.output.append(helper.make_tensor_value_info("neg", TensorProto.FLOAT, None))
    if graph_output:
        g.output.append(helper.make_tensor_value_info("mm_out", TensorProto.FLOAT, None))
    return m


def test_folds_and_computes_the_same():
    ort = pytest.importorskip("onnxruntime")
    model = mm_add()
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    assert len(fold_bias_adds(folded)) == 1
    assert [n.op_type for n in folded.graph.node] == ["MatMulNBits"]
    assert folded.graph.node[0].input[5] == "bias"
    a = np.random.default_rng(0).standard_normal((1, 3, K)).astype(np.float32)
    name = model.graph.input[0].name
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {name: a})[0]  # noqa: E731
    np.testing.assert_allclose(run(folded), run(model), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [dict(bias_shape=(1, N)), dict(bias_shape=(N + 1,)), dict(constant=False),
                                dict(second_user=True), dict(graph_output=True)])
def test_leaves_other_adds(kw):
    model = mm_add(**kw)
    assert fold_bias_adds(model) == [] and [n.op_type for n in model.graph.node][-1] != "MatMulNBits"


def test_folds_only_where_the_spec_serves_a_bias():
    without = specs_from_text("kernel g { op = gemv tile = 1x16 target = rvv vlen = 128 bits = 4 block = 32 }")
    with_bias = specs_from_text("kernel g { op = gemv tile = 1x16 target = rvv vlen = 128 bits = 4 block = 32 "
                                "bias = yes }")
    assert fold_bias_adds(mm_add(), without) == []
    assert len(fold_bias_adds(mm_add(), with_bias)) == 1


def test_genai_export_qkv_biases_fold():
    model = gl.genai_model()
    adds = sum(n.op_type == "Add" for n in model.graph.node)
    folded = fold_bias_adds(model)
    assert len(folded) == 2 and all("qkv_proj" in f for f in folded)
    assert sum(n.op_type == "Add" for n in model.graph.node) == adds - 2
