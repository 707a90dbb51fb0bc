"""imegen's Qwen model in the form onnxruntime-genai's model builder exports it, built with onnx.helper
from seeded random weights (no downloads), and a greedy decoding loop for it over any `feeds -> outputs`
callable.

The graph is node for node what onnxruntime-genai 0.18 writes for a Qwen2-architecture model with
`-p int4 -e cpu` (and `-p int8`, `block_size=`, `is_symmetric=false`, `shared_embeddings=false`):
tests/test_model_check_llm.py compares `layout()` of this builder's model against five real exports in
tests/data/genai/ (op types, domains, attributes, names, inputs and outputs in order, initializers).

  inputs   input_ids [batch_size, sequence_length] int64, attention_mask [batch_size, total_sequence_length]
           int64, past_key_values.{i}.key for every layer then past_key_values.{i}.value, float32
           [batch_size, kv_heads, past_sequence_length, kv_cache_dim]
  outputs  logits [batch_size, sequence_length, vocab], present.{i}.key ..., present.{i}.value ...
           [batch_size, kv_heads, total_sequence_length, kv_cache_dim]
  graph    seqlens_k = ReduceSum(attention_mask) - 1 and total_sequence_length = Shape(attention_mask)[1],
           both cast to int32; the embedding (GatherBlockQuantized over the lm_head's packed weights when
           shared, else an fp32 Gather); per layer SimplifiedLayerNormalization (the first) or
           SkipSimplifiedLayerNormalization, one fused q/k/v MatMulNBits (N = (heads + 2 kv_heads) * head_size)
           and an Add of Qwen's q/k/v bias, GroupQueryAttention with rotary inside (cos/sin caches), o_proj
           MatMulNBits, gate/up MatMulNBits, SiLU as Sigmoid * Mul, down MatMulNBits; the final
           SkipSimplifiedLayerNormalization and the lm_head MatMulNBits writing `logits`.

Debian's riscv64 onnxruntime 1.23 and the x86 wheel (1.32) run it; 1.21 does not (its GroupQueryAttention
takes at most 9 inputs, its GatherBlockQuantized has no `bits`). Weights are quantized by
imegen.reference.quantize_weights, a bit-exact port of the blockwise quantizer onnxruntime's
MatMulNBitsQuantizer calls (which genai's builder uses), so B, scales and zero points are what genai would
write for the same float weights.

Weight scales: the embedding rows are N(0, embed_std^2) and each projection N(0, proj_gain^2 / K) (defaults
EMBED_STD and PROJ_GAIN), which keeps every projection's output below the residual stream the embedding rows
dominate, so the final hidden state points at the current token's row and the logits have one clear winner
at every step (a top-2 gap far above the int8-vs-fp32 compute difference; at full size about 20, logits' std
about 4.5). Greedy decoding is so never decided by rounding: a shared-embedding (tied) model repeats its last
token; an untied one, whose lm_head is the embedding shifted by one row, counts up.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import reference as ref

OPSET = 22  # what onnxruntime-genai 0.18 writes
IR_VERSION = 10
MS = "com.microsoft"
F32 = TensorProto.FLOAT
EMBED_STD = 0.15
PROJ_GAIN = 0.35
# Above this many bytes of initializers the weights go to `<model file>.data` beside the model, as genai
# writes them (a protobuf holds at most 2 GB; a 24-layer int4 model is ~0.3 GB); below, one file.
EXTERNAL_ABOVE = 64 * 2**20
METADATA_KEY = "imegen.genai_form.config"


@dataclass(frozen=True)
class GenaiConfig:
    """A Qwen2-architecture decoder; the defaults are Qwen2.5-0.5B's sizes and genai's `-p int4 -e cpu`."""

    layers: int = 24
    hidden: int = 896
    heads: int = 14
    kv_heads: int = 2
    intermediate: int = 4864
    vocab: int = 151936
    bits: int = 4
    block: int = 32  # genai's default; 128 is the other common export
    symmetric: bool = True  # genai's default (no zero points)
    accuracy_level: int | None = 4  # genai's default on CPU; None leaves the attribute out
    qkv_bias: bool = True  # Qwen2 has q/k/v biases
    tied: bool = True  # the embedding is the lm_head's weights, read by GatherBlockQuantized (int4 only)
    context: int = 32768  # max_position_embeddings: rows of the rotary caches
    rms_eps: float = 1e-6
    rope_theta: float = 1e6
    seed: int = 0
    embed_std: float = EMBED_STD  # the random weights' scales (see the module's docstring)
    proj_gain: float = PROJ_GAIN

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads

    @property
    def matmuls(self) -> int:
        """MatMulNBits nodes: qkv, o, gate, up, down per layer and the lm_head."""
        return 5 * self.layers + 1


def check_config(c: GenaiConfig) -> None:
    """Raises ValueError for a config no genai export (or onnxruntime's ops) has."""
    if min(c.layers, c.hidden, c.heads, c.kv_heads, c.intermediate, c.vocab, c.context) < 1:
        raise ValueError(f"every size must be at least 1: {c}")
    if c.hidden % c.heads or c.heads % c.kv_heads:
        raise ValueError(f"hidden {c.hidden} / heads {c.heads} / kv_heads {c.kv_heads} do not divide")
    if c.head_size % 2:
        raise ValueError(f"head size {c.head_size} is odd: rotary rotates halves")
    if c.bits not in (4, 8) or c.block < 16 or c.block & (c.block - 1):
        raise ValueError(f"{c.bits}-bit block {c.block}: MatMulNBits takes 4 or 8 bits, blocks a power of two >= 16")
    if c.tied and c.bits != 4:
        raise ValueError("a shared (tied) embedding needs 4-bit weights (GatherBlockQuantized is 4-bit only)")


# ------------------------------------------------------------------------------------------ weights
def random_weights(c: GenaiConfig) -> Iterator[tuple[str, np.ndarray]]:
    """(name, float32 array) drawn in a fixed order from one seed: "embed" [vocab, hidden], then per layer
    layers.{i}.input_norm, .qkv [hidden, (heads + 2 kv_heads) * head_size] (MatMul's [K, N]), .qkv_bias,
    .o, .post_norm, .gate, .up, .down, then "final_norm". One layer at a time: at full size all of them are
    2 GB of float32."""
    rng = np.random.default_rng(c.seed)
    hd, kv = c.head_size, c.kv_heads * c.head_size

    def proj(k, n):
        return rng.normal(0, c.proj_gain / np.sqrt(k), (k, n)).astype(np.float32)

    def norm():
        return (1 + 0.1 * rng.standard_normal(c.hidden)).astype(np.float32)

    yield "embed", rng.normal(0, c.embed_std, (c.vocab, c.hidden)).astype(np.float32)
    for i in range(c.layers):
        p = f"layers.{i}"
        yield f"{p}.input_norm", norm()
        yield f"{p}.qkv", proj(c.hidden, c.heads * hd + 2 * kv)
        yield f"{p}.qkv_bias", rng.normal(0, 0.1, c.heads * hd + 2 * kv).astype(np.float32)
        yield f"{p}.o", proj(c.heads * hd, c.hidden)
        yield f"{p}.post_norm", norm()
        yield f"{p}.gate", proj(c.hidden, c.intermediate)
        yield f"{p}.up", proj(c.hidden, c.intermediate)
        yield f"{p}.down", proj(c.intermediate, c.hidden)
    yield "final_norm", norm()


LAYER_WEIGHTS = 8  # what random_weights yields per layer


def lm_head_weights(c: GenaiConfig, embed: np.ndarray) -> np.ndarray:
    """The lm_head's float [hidden, vocab]: the embedding's transpose when tied; untied, the embedding's rows
    shifted by one, so the winner after token t is t + 1 and greedy decoding counts up (tokens that change
    every step, each with a clear winner)."""
    return (embed if c.tied else np.roll(embed, 1, axis=0)).T.copy()


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
        qw = _quantize(W, c.bits, c.block, c.symmetric)
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


QUANTIZE_CHUNK = 2**22  # weights quantized at a time: the full lm_head's temporaries would take GBs


def _quantize(W: np.ndarray, bits: int, block: int, symmetric: bool) -> ref.QuantizedWeights:
    """reference.quantize_weights of W [K, N], a slice of columns at a time (each column is quantized on its
    own, so the result is the same)."""
    K, N = W.shape
    step = max(1, QUANTIZE_CHUNK // K)
    if N <= step:
        return ref.quantize_weights(W, bits, block, symmetric)
    parts = [ref.quantize_weights(W[:, j:j + step], bits, block, symmetric) for j in range(0, N, step)]
    zero_points = None if symmetric else np.concatenate([p.zero_points for p in parts])
    return ref.QuantizedWeights(np.concatenate([p.data for p in parts]), np.concatenate([p.scales for p in parts]),
                                zero_points, K, N, bits, block)


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


def _embedding(g: _Graph, c: GenaiConfig, embed: np.ndarray) -> str:
    """Tied: GatherBlockQuantized over the lm_head's packed B (reshaped to [vocab, bytes per row]) and its
    scales (and zero points), sliced back to `hidden` when the rows are padded to whole blocks; untied: an
    fp32 Gather."""
    base = "/model/embed_tokens"
    if not c.tied:
        table = g.init("model.embed_tokens.weight", embed)
        return g.node("Gather", f"{base}/Gather", [table, "input_ids"])
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


def genai_model(config: GenaiConfig | None = None, log: Callable[[str], None] | None = None,
                **overrides) -> onnx.ModelProto:
    """The onnxruntime-genai (0.18) export form of a Qwen2 decoder; `overrides` replace config fields
    (layers, hidden, heads, kv_heads, intermediate, vocab, bits, block, symmetric, accuracy_level, qkv_bias,
    tied, context, seed, ...). `log` hears one line per layer (a full-size build takes a minute)."""
    c = replace(config or GenaiConfig(), **overrides)
    check_config(c)
    log = log or (lambda msg: None)
    W = random_weights(c)
    _, embed = next(W)
    g = _Graph()
    seqlens, total = _attention_mask_subgraph(g)
    # Tied, the embedding reads the lm_head's quantized weights, so they come first.
    lm_head = g.quantized(c, lm_head_weights(c, embed), "lm_head.MatMul.weight") if c.tied else None
    x = _embedding(g, c, embed)
    cos, sin = rotary_caches(c.head_size, c.context, c.rope_theta)
    g.init("cos_cache", cos)
    g.init("sin_cache", sin)
    residual = None
    for i in range(c.layers):
        log(f"layer {i + 1}/{c.layers}: quantizing {c.bits}-bit, block {c.block}")
        x, residual = _layer(g, c, dict(next(W) for _ in range(LAYER_WEIGHTS)), i, x, residual, seqlens, total)
    final = f"/model/layers.{c.layers}/final_norm_layernorm"
    norm = g.init(f"model.layers.{c.layers}.final_norm_layernorm.weight", next(W)[1])
    normed = _skip_norm(g, final, residual, x, norm, c.rms_eps, with_sum=False)[0]
    if lm_head is None:
        log(f"lm_head: quantizing {c.hidden} x {c.vocab}")
        lm_head = g.quantized(c, lm_head_weights(c, embed), "lm_head.MatMul.weight")
    del embed
    g.matmul_nbits(c, normed, lm_head, c.hidden, c.vocab, "/lm_head", output="logits")
    inputs, outputs = _io(c)
    graph = helper.make_graph(g.nodes, "main_graph", inputs, outputs, g.inits)
    model = helper.make_model(graph, producer_name="imegen (onnxruntime-genai 0.18 export form)",
                              opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)])
    model.ir_version = IR_VERSION
    model.metadata_props.add(key=METADATA_KEY, value=json.dumps(asdict(c)))
    return model


# ------------------------------------------------------------------------------------------ files
def data_file(path: str | Path) -> Path:
    """Where genai puts a model's external weights: `<model file name>.data` beside it."""
    path = Path(path)
    return path.with_name(path.name + ".data")


def save(model: onnx.ModelProto, path: str | Path, external: bool | None = None) -> list[Path]:
    """Writes `model` to `path`, its initializers to data_file(path) when `external` (None: when they hold
    more than EXTERNAL_ABOVE bytes); returns the files written. Moving the weights out changes `model`."""
    path = Path(path)
    data = data_file(path)
    if external is None:
        external = sum(len(t.raw_data) for t in model.graph.initializer) > EXTERNAL_ABOVE
    path.parent.mkdir(parents=True, exist_ok=True)
    if not external:
        onnx.save(model, str(path))
        return [path]
    data.unlink(missing_ok=True)  # onnx appends to an existing data file: the old weights would stay in it
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name,
              size_threshold=0)
    data.chmod(path.stat().st_mode & 0o777)  # onnx creates it owner-only; readable like the model
    return [path, data]


def genai_config(c: GenaiConfig, filename: str = "model.onnx") -> dict:
    """genai_config.json as onnxruntime-genai's builder writes it for this model (greedy search). The
    special token ids are Qwen2.5's when the vocabulary has them, else the test fixtures' (bos 1, eos 2,
    pad 0): the weights are random, so no id means anything."""
    qwen_ids = c.vocab > 151645
    return {
        "model": {
            "bos_token_id": 151643 if qwen_ids else 1,
            "context_length": c.context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": filename,
                "head_size": c.head_size,
                "hidden_size": c.hidden,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "num_attention_heads": c.heads,
                "num_hidden_layers": c.layers,
                "num_key_value_heads": c.kv_heads,
            },
            "eos_token_id": [151645, 151643] if qwen_ids else 2,
            "pad_token_id": 151643 if qwen_ids else 0,
            "type": "qwen2",
            "vocab_size": c.vocab,
        },
        "search": {
            "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
            "max_length": c.context, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
            "num_return_sequences": 1, "past_present_share_buffer": True, "repetition_penalty": 1.0,
            "temperature": 1.0, "top_k": 50, "top_p": 1.0,
        },
    }


def write_genai_model(path: str | Path, config: GenaiConfig | None = None, *, external: bool | None = None,
                      config_json: bool = True, log: Callable[[str], None] | None = None,
                      **overrides) -> tuple[GenaiConfig, list[Path]]:
    """Builds genai_model(config, **overrides) and writes it as genai does: `path`, its weights in
    `path`.data when large (see save), and genai_config.json beside it (`config_json`). Returns the config
    and the files written."""
    c = replace(config or GenaiConfig(), **overrides)
    model = genai_model(c, log=log)
    files = save(model, path, external)
    del model
    if config_json:
        json_path = Path(path).with_name("genai_config.json")
        json_path.write_text(json.dumps(genai_config(c, Path(path).name), indent=4) + "\n")
        files.append(json_path)
    return c, files


# ------------------------------------------------------------------------------------------ reading one
def config_of(model: onnx.ModelProto) -> GenaiConfig:
    """The GenaiConfig of a model in genai's export form, read from its graph (so it also reads a real
    export: layers, sizes, quantization, tying, bias, rotary context); rms_eps, rope_theta, the seed and the
    weight scales are left at their defaults."""
    nodes = list(model.graph.node)
    inits = {t.name: t for t in model.graph.initializer}
    gqa = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    if not gqa:
        raise ValueError("not in onnxruntime-genai's export form: no GroupQueryAttention node")
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

    def node(n):
        return (n.name, n.domain or "ai.onnx", n.op_type, tuple(n.input), tuple(n.output),
                tuple(sorted(attr(a) for a in n.attribute)))

    return {"inputs": [value(v) for v in model.graph.input], "outputs": [value(v) for v in model.graph.output],
            "initializers": sorted((t.name, t.data_type, tuple(t.dims)) for t in model.graph.initializer),
            "nodes": sorted(node(n) for n in model.graph.node),
            "opsets": sorted((o.domain or "ai.onnx", o.version) for o in model.opset_import)}


# ------------------------------------------------------------------------------------------ decoding
Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def decoder(c: GenaiConfig):
    """How model_check's decoder driving feeds this model (its model_check.Decoder), read off the config."""
    from .model_check import Decoder

    past = tuple((f"past_key_values.{i}.{kind}", (1, c.kv_heads, "P", c.head_size))
                 for kind in ("key", "value") for i in range(c.layers))
    present = tuple((name, name.replace("past_key_values", "present", 1)) for name, _ in past)
    return Decoder("input_ids", "attention_mask", None, past, present, "logits", c.vocab)


def empty_past(c: GenaiConfig) -> dict[str, np.ndarray]:
    """past_key_values.* of length 0 (a prefill): float32 [1, kv_heads, 0, head_size]."""
    z = np.zeros((1, c.kv_heads, 0, c.head_size), np.float32)
    return {name: z for name, _ in decoder(c).past}


def step_feeds(c: GenaiConfig, ids, past: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Feeds for tokens `ids` (one sequence) after the KV cache `past` (None: empty): input_ids int64
    [1, S], attention_mask int64 ones [1, past + S] (the model reads positions and the cache length off it),
    past_key_values.{i}.key/.value float32 [1, kv_heads, past, head_size]."""
    ids = np.asarray(ids, np.int64).reshape(1, -1)
    past = past if past is not None else empty_past(c)
    length = next(iter(past.values())).shape[2]
    return {"input_ids": ids, "attention_mask": np.ones((1, length + ids.shape[1]), np.int64), **past}


def presents_as_past(c: GenaiConfig, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A step's present.* outputs as the next step's past_key_values.* feeds."""
    return {past: outputs[present] for past, present in decoder(c).present}


def greedy_decode_genai(run: Run, prompt_ids, steps: int, config: GenaiConfig) -> tuple[list[int], np.ndarray]:
    """Prefill the prompt (M = prompt length), then decode one token per run (M = 1), each step fed the last
    one's presents as its past (model_check.decode_feeds, as ort-model-check drives a decoder). `run` maps
    feeds to outputs: a RiscvSession's run, or imegen.ort.qwen.host_runner(InferenceSession).

    Returns the `steps` generated token ids and float32 [steps, vocab]: row t holds the last position's
    logits token t was chosen from (row 0 from the prefill)."""
    from .model_check import decode_feeds

    if steps < 1 or not len(prompt_ids):
        raise ValueError(f"need a prompt and at least one step (prompt of {len(prompt_ids)}, {steps} steps)")
    dec = decoder(config)
    feeds = step_feeds(config, [int(t) for t in prompt_ids])
    out = run(feeds)
    logits, tokens = [out["logits"][0, -1]], []
    for t in range(steps):
        tokens.append(int(np.argmax(logits[-1])))
        if t + 1 == steps:
            break
        feeds = decode_feeds(dec, feeds, out, tokens[-1])
        out = run(feeds)
        logits.append(out["logits"][0, -1])
    return tokens, np.stack(logits).astype(np.float32)

