"""Test models in the layouts real exporters write, built with onnx.helper from seeded random weights.

`genai_model` writes a decoder in exactly the layout onnxruntime-genai's model builder writes for
Qwen2.5 with `-p int4 -e cpu` (checked node for node against real exports in test_model_check_llm.py):

  inputs   input_ids [batch_size, sequence_length] int64, attention_mask [batch_size, total_sequence_length]
           int64, past_key_values.{i}.key for every layer then past_key_values.{i}.value, float32
           [batch_size, kv_heads, past_sequence_length, kv_cache_dim]
  outputs  logits [batch_size, sequence_length, vocab], present.{i}.key ..., present.{i}.value ...
           [batch_size, kv_heads, total_sequence_length, kv_cache_dim]
  graph    seqlens_k = ReduceSum(attention_mask) - 1 and total_sequence_length = Shape(attention_mask)[1],
           both cast to int32; the embedding (GatherBlockQuantized over the lm_head's packed weights when tied,
           else an fp32 Gather); per layer SimplifiedLayerNormalization (the first) or
           SkipSimplifiedLayerNormalization, one fused q/k/v MatMulNBits (N = (heads + 2 kv_heads) * head_size,
           plus Add for Qwen's q/k/v bias), GroupQueryAttention with rotary (cos/sin caches), o_proj MatMulNBits,
           gate/up MatMulNBits, SiLU as Sigmoid * Mul, down MatMulNBits; the final SkipSimplifiedLayerNormalization
           and the lm_head MatMulNBits writing `logits`.

Weights are quantized by imegen.reference.quantize_weights, a bit-exact port of the blockwise quantizer
onnxruntime's MatMulNBitsQuantizer calls, so B, scales and zero points are what genai would write for the
same float weights.  Their scales (EMBED_STD, PROJ_GAIN) give greedy decoding a clear winner at every step,
so it is never decided by rounding: a tied model repeats its last token, an untied one counts up.

Also here: `ort_quantizer_model` (onnxruntime's own MatMulNBitsQuantizer at its defaults), `nbits_model`
(MatMulNBits nodes of any bits / block / accuracy level), `eight_bit_model` and `float16_model`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from imegen import reference as ref

OPSET = 22  # what onnxruntime-genai 0.18 writes
IR_VERSION = 10
MS = "com.microsoft"
F32 = TensorProto.FLOAT


# Weight scales: projections N(0, PROJ_GAIN^2 / K) keep each one's output below the residual stream, which the
# embedding rows (N(0, EMBED_STD^2)) dominate, so the final hidden state points at the current token's row and
# the logits have one clear winner (a top-2 gap > 100x the int8-vs-fp32 difference) of moderate size (std ~2,
# so level-4 agreement is judged where ORT's tolerance is meant for: O(1) outputs, not logits of 10s).
EMBED_STD = 0.15
PROJ_GAIN = 0.35


@dataclass(frozen=True)
class GenaiConfig:
    """A Qwen2-architecture decoder; the defaults are tiny so a QEMU run takes seconds."""

    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vocab: int = 512
    bits: int = 4
    block: int = 32  # genai's default; 128 is the other common export
    symmetric: bool = True  # genai's default (no zero points)
    accuracy_level: int | None = 4  # genai's default on CPU; None leaves the attribute out
    qkv_bias: bool = True  # Qwen2 has q/k/v biases
    tied: bool = True  # Qwen2.5-0.5B ties the embedding to the lm_head
    context: int = 256  # max_position_embeddings: rows of the rotary caches
    rms_eps: float = 1e-6
    rope_theta: float = 1e6
    seed: int = 0

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads


# ------------------------------------------------------------------------------------------ weights
def _random_weights(c: GenaiConfig) -> dict[str, np.ndarray]:
    """Float weights in HF orientation transposed to MatMul's [K, N], drawn in a fixed order from one seed."""
    rng = np.random.default_rng(c.seed)
    hd, kv = c.head_size, c.kv_heads * c.head_size

    def proj(k, n):
        return rng.normal(0, PROJ_GAIN / np.sqrt(k), (k, n)).astype(np.float32)

    def norm():
        return (1 + 0.1 * rng.standard_normal(c.hidden)).astype(np.float32)

    w = {"embed": rng.normal(0, EMBED_STD, (c.vocab, c.hidden)).astype(np.float32)}
    for i in range(c.layers):
        p = f"layers.{i}"
        w[f"{p}.input_norm"] = norm()
        w[f"{p}.qkv"] = proj(c.hidden, c.heads * hd + 2 * kv)
        w[f"{p}.qkv_bias"] = rng.normal(0, 0.1, c.heads * hd + 2 * kv).astype(np.float32)
        w[f"{p}.o"] = proj(c.heads * hd, c.hidden)
        w[f"{p}.post_norm"] = norm()
        w[f"{p}.gate"] = proj(c.hidden, c.intermediate)
        w[f"{p}.up"] = proj(c.hidden, c.intermediate)
        w[f"{p}.down"] = proj(c.intermediate, c.hidden)
    w["final_norm"] = norm()
    # Untied: the embedding's rows shifted by one, so the winner after token t is t + 1: greedy decoding counts
    # up (tokens that change every step, each with a clear winner).
    w["lm_head"] = (w["embed"] if c.tied else np.roll(w["embed"], 1, axis=0)).T.copy()
    return w


def rotary_caches(head_size: int, context: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches [context, head_size / 2] for GroupQueryAttention's rotate-half rotary."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_size, 2, dtype=np.float32) / head_size)
    freqs = np.outer(np.arange(context, dtype=np.float32), inv_freq.astype(np.float32))
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


# ------------------------------------------------------------------------------------------ graph
class _Graph:
    """Nodes and initializers in genai's naming: "/model/constants/INT64/<value>" constants made on first use."""

    def __init__(self):
        self.nodes: list = []
        self.inits: list = []
        self._constants: set[str] = set()

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op: str, name: str, inputs: list[str], outputs: list[str] | None = None, domain: str = "",
             **attrs) -> str:
        outputs = outputs or [f"{name}/output_0"]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain or None, **attrs))
        return outputs[0]

    def int64(self, value) -> str:
        """genai's constant naming: "[1]" for a 1-d tensor, "1" for a scalar."""
        array = np.asarray(value, np.int64)
        text = f"[{', '.join(str(v) for v in array.ravel())}]" if array.ndim else str(int(array))
        out = f"/model/constants/INT64/{text}"
        if out not in self._constants:
            self._constants.add(out)
            self.nodes.append(helper.make_node("Constant", [], [out], name=f"/model/constant_nodes/INT64/{text}",
                                               value=numpy_helper.from_array(array)))
        return out

    def quantized(self, c: GenaiConfig, W: np.ndarray, weight_name: str) -> list[str]:
        """W [K, N] quantized as onnxruntime's quantizer stores it: initializers `weight_name`_Q{bits},
        _scales[, _zero_points]; returns their names."""
        qw = ref.quantize_weights(W, c.bits, c.block, c.symmetric)
        names = [self.init(f"{weight_name}_Q{c.bits}", qw.data), self.init(f"{weight_name}_scales", qw.scales)]
        if qw.zero_points is not None:
            names.append(self.init(f"{weight_name}_zero_points", qw.zero_points))
        return names

    def matmul_nbits(self, c: GenaiConfig, x: str, weights: list[str], K: int, N: int, prefix: str,
                     output: str | None = None) -> str:
        """The MatMulNBits node the quantizer puts for `prefix`/MatMul: named `prefix`/MatMul_Q{bits}."""
        attrs = dict(K=K, N=N, bits=c.bits, block_size=c.block)
        if c.accuracy_level is not None:
            attrs["accuracy_level"] = c.accuracy_level
        return self.node("MatMulNBits", f"{prefix}/MatMul_Q{c.bits}", [x, *weights],
                         [output or f"{prefix}/MatMul/output_0"], domain=MS, **attrs)

    def projection(self, c: GenaiConfig, x: str, W: np.ndarray, prefix: str, weight_name: str) -> str:
        return self.matmul_nbits(c, x, self.quantized(c, W, weight_name), *W.shape, prefix)


def _attention_mask_subgraph(g: _Graph) -> tuple[str, str]:
    """seqlens_k = int32(ReduceSum(attention_mask, axis 1) - 1), total_sequence_length = int32(Shape(mask)[1])."""
    base = "/model/attn_mask_reformat/attn_mask_subgraph"
    one = g.int64([1])
    total = g.node("ReduceSum", f"{base}/ReduceSum", ["attention_mask", one], keepdims=0)
    seqlens = g.node("Sub", f"{base}/Sub", [total, one])
    seqlens = g.node("Cast", f"{base}/Sub/Cast", [seqlens], to=TensorProto.INT32)
    shape = g.node("Shape", f"{base}/Shape", ["attention_mask"])
    length = g.node("Gather", f"{base}/Gather", [shape, g.int64(1)], axis=0)
    return seqlens, g.node("Cast", f"{base}/Gather/Cast", [length], to=TensorProto.INT32)


def _embedding(g: _Graph, c: GenaiConfig, w: dict) -> str:
    """Tied: GatherBlockQuantized over the lm_head's packed B (reshaped to [vocab, bytes per row]) and its
    scales (and zero points), sliced back to `hidden` when the rows are padded to whole blocks; untied: an
    fp32 Gather."""
    base = "/model/embed_tokens"
    if not c.tied:
        table = g.init("model.embed_tokens.weight", w["embed"])
        return g.node("Gather", f"{base}/Gather", [table, "input_ids"])
    if c.bits != 4:
        raise ValueError("a tied embedding needs 4-bit weights (GatherBlockQuantized is 4-bit only)")
    padded = -(-c.hidden // c.block) * c.block
    data = g.node("Reshape", f"{base}/Reshape", [f"lm_head.MatMul.weight_Q{c.bits}", g.int64([c.vocab, padded // 2])])
    inputs = [data, "input_ids", "lm_head.MatMul.weight_scales"]
    if not c.symmetric:  # genai 0.18 writes a broken graph here (the fp32 weight, no scales); this is the valid form
        inputs.append("lm_head.MatMul.weight_zero_points")
    out = g.node("GatherBlockQuantized", f"{base}/GatherBlockQuantized", inputs, domain=MS, bits=c.bits,
                 block_size=c.block, gather_axis=0, quantize_axis=1)
    if padded != c.hidden:
        out = g.node("Slice", f"{base}/Slice", [out, g.int64([0]), g.int64([c.hidden]), g.int64([-1])])
    return out


def _layer(g: _Graph, c: GenaiConfig, w: dict, i: int, x: str, residual: str | None, seqlens: str, total: str):
    """One decoder layer; returns (MLP output, residual stream after attention) for the next SkipLayerNorm."""
    p, wp = f"/model/layers.{i}", f"model.layers.{i}"
    eps = c.rms_eps
    if residual is None:  # the first layer: plain RMSNorm of the embedding
        normed = g.node("SimplifiedLayerNormalization", f"{p}/input_layernorm/LayerNorm",
                        [x, g.init(f"{wp}.input_layernorm.weight", w[f"layers.{i}.input_norm"])],
                        [f"{p}/input_layernorm/output_0"], epsilon=eps, axis=-1, stash_type=1)
        residual = x
    else:
        norm = g.init(f"{wp}.input_layernorm.weight", w[f"layers.{i}.input_norm"])
        normed, _, _, residual = _skip_norm(g, f"{p}/input_layernorm", residual, x, norm, eps)
    qkv = g.projection(c, normed, w[f"layers.{i}.qkv"], f"{p}/attn/qkv_proj", f"{wp}.attn.qkv_proj.MatMul.weight")
    if c.qkv_bias:
        bias = g.init(f"{wp}.attn.qkv_proj.Add.bias", w[f"layers.{i}.qkv_bias"])
        qkv = g.node("Add", f"{p}/attn/qkv_proj/Add", [qkv, bias])
    attn = g.node("GroupQueryAttention", f"{p}/attn/GroupQueryAttention",
                  [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens, total,
                   "cos_cache", "sin_cache", "", "", ""],
                  [f"{p}/attn/GroupQueryAttention/output_0", f"present.{i}.key", f"present.{i}.value"], domain=MS,
                  num_heads=c.heads, kv_num_heads=c.kv_heads, scale=float(np.float32(1 / np.sqrt(c.head_size))),
                  local_window_size=-1, softcap=0.0, do_rotary=1, rotary_interleaved=0)
    o = g.projection(c, attn, w[f"layers.{i}.o"], f"{p}/attn/o_proj", f"{wp}.attn.o_proj.MatMul.weight")
    norm = g.init(f"{wp}.post_attention_layernorm.weight", w[f"layers.{i}.post_norm"])
    normed, _, _, residual = _skip_norm(g, f"{p}/post_attention_layernorm", residual, o, norm, eps)
    gate = g.projection(c, normed, w[f"layers.{i}.gate"], f"{p}/mlp/gate_proj",
                          f"{wp}.mlp.gate_proj.MatMul.weight")
    up = g.projection(c, normed, w[f"layers.{i}.up"], f"{p}/mlp/up_proj", f"{wp}.mlp.up_proj.MatMul.weight")
    sig = g.node("Sigmoid", f"{p}/mlp/act_fn/Sigmoid", [gate])
    act = g.node("Mul", f"{p}/mlp/act_fn/Mul", [gate, sig])
    h = g.node("Mul", f"{p}/mlp/Mul", [act, up])
    down = g.projection(c, h, w[f"layers.{i}.down"], f"{p}/mlp/down_proj", f"{wp}.mlp.down_proj.MatMul.weight")
    return down, residual


def _skip_norm(g: _Graph, prefix: str, a: str, b: str, weight: str, eps: float, with_sum: bool = True):
    """SkipSimplifiedLayerNormalization(a, b): outputs (normed, '', '', a + b) as genai wires them."""
    outputs = [f"{prefix}/output_0", "", "", f"{prefix}/output_3"] if with_sum else [f"{prefix}/output_0"]
    g.node("SkipSimplifiedLayerNormalization", f"{prefix}/SkipLayerNorm", [a, b, weight], outputs, domain=MS,
           epsilon=eps)
    return outputs + [None] * (4 - len(outputs))


def _io(c: GenaiConfig):
    def past(name, length):
        return helper.make_tensor_value_info(name, F32, ["batch_size", c.kv_heads, length, "kv_cache_dim"])

    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                            ["batch_size", "total_sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", F32, ["batch_size", "sequence_length", c.vocab])]
    for kind in ("key", "value"):
        inputs += [past(f"past_key_values.{i}.{kind}", "past_sequence_length") for i in range(c.layers)]
        outputs += [past(f"present.{i}.{kind}", "total_sequence_length") for i in range(c.layers)]
    return inputs, outputs


def genai_model(config: GenaiConfig | None = None, **overrides) -> onnx.ModelProto:
    """The onnxruntime-genai (0.18, `-p int4 -e cpu`) layout of a Qwen2 decoder; `overrides` replace config
    fields (layers, hidden, heads, kv_heads, intermediate, vocab, bits, block, symmetric, accuracy_level,
    qkv_bias, tied, context, seed, ...)."""
    c = replace(config or GenaiConfig(), **overrides)
    if c.hidden % c.heads or c.heads % c.kv_heads:
        raise ValueError(f"hidden {c.hidden} / heads {c.heads} / kv_heads {c.kv_heads} do not divide")
    w = _random_weights(c)
    g = _Graph()
    seqlens, total = _attention_mask_subgraph(g)
    # Tied, the embedding reads the lm_head's quantized weights, so they come first.
    lm_head = g.quantized(c, w["lm_head"], "lm_head.MatMul.weight") if c.tied else None
    x = _embedding(g, c, w)
    cos, sin = rotary_caches(c.head_size, c.context, c.rope_theta)
    g.init("cos_cache", cos)
    g.init("sin_cache", sin)
    residual = None
    for i in range(c.layers):
        x, residual = _layer(g, c, w, i, x, residual, seqlens, total)
    final = f"/model/layers.{c.layers}/final_norm_layernorm"
    norm = g.init(f"model.layers.{c.layers}.final_norm_layernorm.weight", w["final_norm"])
    normed = _skip_norm(g, final, residual, x, norm, c.rms_eps, with_sum=False)[0]
    lm_head = lm_head or g.quantized(c, w["lm_head"], "lm_head.MatMul.weight")
    g.matmul_nbits(c, normed, lm_head, c.hidden, c.vocab, "/lm_head", output="logits")
    inputs, outputs = _io(c)
    graph = helper.make_graph(g.nodes, "main_graph", inputs, outputs, g.inits)
    model = helper.make_model(graph, producer_name="imegen tests (onnxruntime-genai layout)",
                              opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)])
    model.ir_version = IR_VERSION
    model.metadata_props.add(key="imegen.genai_layout.config", value=json.dumps(asdict(c)))
    return model


def save_genai_model(path: str | Path, config: GenaiConfig | None = None, **overrides) -> Path:
    """genai_model(...) written to `path` (one file); returns the path."""
    path = Path(path)
    onnx.save(genai_model(config, **overrides), str(path))
    return path


def config_of(model: onnx.ModelProto) -> GenaiConfig:
    """The GenaiConfig a genai-layout model was built with, read from its graph (so it also reads a real
    export: layers, sizes, quantization, tying, bias, rotary context)."""
    nodes = list(model.graph.node)
    inits = {t.name: t for t in model.graph.initializer}
    gqa = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: helper.get_attribute_value(a) for a in gqa[0].attribute}

    def attrs_of(prefix: str) -> dict:
        """The attributes of the MatMulNBits node whose name starts with `prefix`."""
        node = next(n for n in nodes if n.op_type == "MatMulNBits" and n.name.startswith(prefix))
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    qkv, gate = attrs_of("/model/layers.0/attn/qkv_proj/"), attrs_of("/model/layers.0/mlp/gate_proj/")
    lm = attrs_of("/lm_head/")
    heads, kv = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    hidden = int(qkv["K"])
    return GenaiConfig(layers=len(gqa), hidden=hidden, heads=heads, kv_heads=kv, intermediate=int(gate["N"]),
                       vocab=int(lm["N"]), bits=int(qkv["bits"]), block=int(qkv["block_size"]),
                       symmetric=not any(n.op_type == "MatMulNBits" and len(n.input) > 3 and n.input[3]
                                         for n in nodes),
                       accuracy_level=int(qkv["accuracy_level"]) if "accuracy_level" in qkv else None,
                       qkv_bias=any(n.name == "/model/layers.0/attn/qkv_proj/Add" for n in nodes),
                       tied=any(n.op_type == "GatherBlockQuantized" for n in nodes),
                       context=int(inits["cos_cache"].dims[0]))


def layout(model: onnx.ModelProto) -> dict:
    """A model's structure with its numbers left out: graph inputs/outputs (name, type, dims), initializers
    (name, type, dims) and nodes (name, domain, op, inputs, outputs, attributes; tensors and the float
    attributes by their type and shape only), each sorted, so two models built from the same config compare
    equal exactly when their graphs are wired alike."""
    def value(vi):
        t = vi.type.tensor_type
        return vi.name, t.elem_type, tuple(d.dim_param or d.dim_value for d in t.shape.dim)

    def attr(a):
        v = helper.get_attribute_value(a)
        if isinstance(v, onnx.TensorProto):
            return a.name, ("tensor", v.data_type, tuple(v.dims))
        if isinstance(v, float):
            return a.name, round(v, 6)
        return a.name, v

    node = lambda n: (n.name, n.domain or "ai.onnx", n.op_type, tuple(n.input), tuple(n.output),
                      tuple(sorted(attr(a) for a in n.attribute)))
    return {"inputs": [value(v) for v in model.graph.input], "outputs": [value(v) for v in model.graph.output],
            "initializers": sorted((t.name, t.data_type, tuple(t.dims)) for t in model.graph.initializer),
            "nodes": sorted(node(n) for n in model.graph.node),
            "opsets": sorted((o.domain or "ai.onnx", o.version) for o in model.opset_import)}


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
