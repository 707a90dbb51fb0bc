"""Test models in the layouts real exporters write, built with onnx.helper from seeded random weights.

The onnxruntime-genai export form is imegen's own (imegen/ort/genai_form.py: `imegen qwen-model` writes it);
here it is at the size of the real exports in tests/data/genai/ (GenaiConfig's defaults below), checked node
for node against them in test_model_check_llm.py.

Also here: `ort_quantizer_model` (onnxruntime's own MatMulNBitsQuantizer at its defaults), `nbits_model`
(MatMulNBits nodes of any bits / block / accuracy level), `eight_bit_model` and `float16_model`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from imegen import reference as ref
from imegen.ort import genai_form as form
from imegen.ort.genai_form import EMBED_STD, IR_VERSION, MS, OPSET, PROJ_GAIN, layout, rotary_caches  # noqa: F401

F32 = TensorProto.FLOAT


@dataclass(frozen=True)
class GenaiConfig(form.GenaiConfig):
    """genai_form's config at the size of the real exports in tests/data/genai/, so a QEMU run takes seconds."""

    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vocab: int = 512
    context: int = 256


def genai_model(config: form.GenaiConfig | None = None, **overrides) -> onnx.ModelProto:
    """genai_form.genai_model at GenaiConfig's defaults; `overrides` replace config fields (layers, hidden,
    heads, kv_heads, intermediate, vocab, bits, block, symmetric, accuracy_level, qkv_bias, tied, context,
    seed, ...). Without a config the weight scales are this module's EMBED_STD and PROJ_GAIN, which a test
    may raise (monkeypatch) for a model with large logits."""
    if config is None:
        config = GenaiConfig(embed_std=EMBED_STD, proj_gain=PROJ_GAIN)
    return form.genai_model(replace(config, **overrides))


def save_genai_model(path: str | Path, config: form.GenaiConfig | None = None, **overrides) -> Path:
    """genai_model(...) written to `path` (one file); returns the path."""
    path = Path(path)
    onnx.save(genai_model(config, **overrides), str(path))
    return path


def config_of(model: onnx.ModelProto) -> GenaiConfig:
    """genai_form.config_of as this module's GenaiConfig (equal to GenaiConfig() for the b32 export)."""
    return GenaiConfig(**asdict(form.config_of(model)))


# ------------------------------------------------------------------------------------------ small models
def nbits_model(K: int = 256, N: int = 128, *, bits: int = 4, block: int = 32, symmetric: bool = True,
                accuracy_level: int | None = 4, float16: bool = False, layers: int = 2, seed: int = 0,
                bias: bool = False) -> onnx.ModelProto:
    """`layers` MatMulNBits nodes in a chain, A ["batch", "sequence_length", K] -> Y [..., N or K]: node i
    maps K -> N when i is even, N -> K when odd. B / scales / zero points from imegen.reference's port of
    ORT's quantizer; with `float16` T is float16 (A, scales, bias and Y in fp16: the quantizer's fp32 scales
    rounded to fp16). Nodes are named mm0, mm1, ..."""
    rng = np.random.default_rng(seed)
    t = TensorProto.FLOAT16 if float16 else F32
    ft = np.float16 if float16 else np.float32
    inits, nodes, x, width = [], [], "A", K
    for i in range(layers):
        n_out = N if i % 2 == 0 else K
        qw = ref.quantize_weights(rng.normal(0, 1 / np.sqrt(width), (width, n_out)).astype(np.float32), bits, block,
                                  symmetric)
        names = [x, f"mm{i}.B", f"mm{i}.scales", "", "", ""]
        inits += [numpy_helper.from_array(qw.data, names[1]), numpy_helper.from_array(qw.scales.astype(ft), names[2])]
        if qw.zero_points is not None:
            names[3] = f"mm{i}.zero_points"
            inits.append(numpy_helper.from_array(qw.zero_points, names[3]))
        if bias:
            names[5] = f"mm{i}.bias"
            inits.append(numpy_helper.from_array(rng.normal(0, 0.1, n_out).astype(ft), names[5]))
        while names[-1] == "":
            names.pop()
        attrs = dict(K=width, N=n_out, bits=bits, block_size=block)
        if accuracy_level is not None:
            attrs["accuracy_level"] = accuracy_level
        y = "Y" if i == layers - 1 else f"mm{i}/output_0"
        nodes.append(helper.make_node("MatMulNBits", names, [y], name=f"mm{i}", domain=MS, **attrs))
        x, width = y, n_out
    graph = helper.make_graph(nodes, "nbits", [helper.make_tensor_value_info("A", t, ["batch", "sequence_length", K])],
                              [helper.make_tensor_value_info("Y", t, ["batch", "sequence_length", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    model.ir_version = IR_VERSION
    return model


def eight_bit_model(K: int = 256, N: int = 128, *, block: int = 32, symmetric: bool = True,
                    accuracy_level: int | None = 4, seed: int = 0) -> onnx.ModelProto:
    """Two 8-bit MatMulNBits nodes (bits = 8), as genai's `-p int8` or the quantizer's bits=8 write them.
    Stock ORT 1.21's MatMulNBits is 4-bit only: run it in 1.23."""
    return nbits_model(K, N, bits=8, block=block, symmetric=symmetric, accuracy_level=accuracy_level, seed=seed)


def float16_model(K: int = 256, N: int = 128, *, bits: int = 4, block: int = 32, symmetric: bool = True,
                  accuracy_level: int | None = 4, seed: int = 0) -> onnx.ModelProto:
    """Two MatMulNBits nodes with T = float16 (A, scales and Y fp16), as fp16 exports write them.
    imegen's kernels are fp32-only, so a rewrite must keep these nodes in ORT."""
    return nbits_model(K, N, bits=bits, block=block, symmetric=symmetric, accuracy_level=accuracy_level,
                       float16=True, seed=seed)


def ort_quantizer_model(K: int = 256, N: int = 256, *, seed: int = 0) -> onnx.ModelProto:
    """A float MatMul -> MatMul model (A ["batch", "sequence_length", K]) quantized by onnxruntime's own
    MatMulNBitsQuantizer at its defaults: 4 bits, block 128, asymmetric (uint8 zero points), no
    accuracy_level attribute (level 0: fp32 compute). Needs onnxruntime and onnx-ir (the test extra)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rng = np.random.default_rng(seed)
    w0 = rng.normal(0, 1 / np.sqrt(K), (K, N)).astype(np.float32)
    w1 = rng.normal(0, 1 / np.sqrt(N), (N, K)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["A", "w0"], ["h"], name="mm0"),
             helper.make_node("MatMul", ["h", "w1"], ["Y"], name="mm1")]
    graph = helper.make_graph(nodes, "float_mlp",
                              [helper.make_tensor_value_info("A", F32, ["batch", "sequence_length", K])],
                              [helper.make_tensor_value_info("Y", F32, ["batch", "sequence_length", K])],
                              [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = IR_VERSION
    quantizer = MatMulNBitsQuantizer(model)
    quantizer.process()
    return quantizer.model.model
