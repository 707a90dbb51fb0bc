"""A Qwen2.5-0.5B-architecture decoder as an ONNX model, built with onnx.helper from seeded random
weights (no downloads), and a greedy decoding loop over any `feeds -> outputs` callable; and
`imegen qwen-model`, which writes either this plain form (`--form plain`) or, by default, the form
onnxruntime-genai's model builder exports (imegen/ort/genai_form.py).

Architecture (Qwen2.5-0.5B's config): hidden 896, 14 query heads and 2 KV heads of dim 64 (grouped-
query attention), SiLU-gated MLP with intermediate 4864, RMSNorm eps 1e-6, rotary embedding theta 1e6
(rotate-half form), q/k/v projections with bias, vocabulary 151936 with tied embeddings.

Graph: plain ONNX opset-17 ops plus com.microsoft MatMulNBits, which onnxruntime's own
MatMulNBitsQuantizer writes for every projection (so riscv64 ORT 1.21 and 1.23 run it, the 8-bit
model 1.23 only: 1.21's MatMulNBits is 4-bit only; and imegen's rewrite has only MatMulNBits to move).  The seven projections per layer and the lm_head
are MatMulNBits; the lm_head is the quantized transposed embedding matrix: the embedding is tied,
and the lm_head is the model's largest matmul (151936 x 896, 28% of the weights), the one that
dominates decode, so leaving it fp32 would hide the kernels where they matter most (onnxruntime-genai's
int4 export quantizes it too).  The input embedding stays an fp32 Gather of the same matrix.

Inputs  input_ids, position_ids int64 [batch, seq]; past_key_values.{i}.key/.value float32
        [batch, 2, past, 64] (past = 0 for the prefill).
Outputs logits float32 [batch, seq, vocab]; present.{i}.key/.value [batch, 2, past + seq, 64].
Attention is causal by position: query at position p sees keys 0..p (rows unpadded, positions
past..past+seq-1).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .. import cli_types

OPSET = 17
IR_VERSION = 8  # readable by ORT 1.21 and later
NEG = float(np.finfo(np.float32).min)  # masked attention score


@dataclass(frozen=True)
class QwenConfig:
    layers: int = 24
    vocab: int = 151936
    hidden: int = 896
    heads: int = 14
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 4864
    rms_eps: float = 1e-6
    rope_theta: float = 1e6

    @staticmethod
    def from_model(model) -> "QwenConfig":
        """The config build_model stored in the model's metadata (model: path or ModelProto)."""
        import onnx

        m = onnx.load(str(model), load_external_data=False) if isinstance(model, (str, Path)) else model
        meta = {p.key: p.value for p in m.metadata_props}
        if "imegen.qwen.config" not in meta:
            raise ValueError(f"{model}: not a model written by imegen.ort.qwen.build_model")
        return QwenConfig(**json.loads(meta["imegen.qwen.config"]))


# Weights: name -> (shape, std, mean); drawn in this order from one generator, so a seed fixes them.
# std 0.02 (Qwen's initializer_range) keeps every projection's output O(1) on RMS-normed inputs and
# the residual stream O(1) after 24 layers; norm weights ~1.
def _weight_shapes(c: QwenConfig) -> list[tuple[str, tuple[int, ...], float, float]]:
    h, kv = c.hidden, c.kv_heads * c.head_dim
    w = [("embed", (c.vocab, h), 0.02, 0.0)]
    for i in range(c.layers):
        p = f"layers.{i}"
        w += [(f"{p}.input_norm", (h,), 0.1, 1.0),
              (f"{p}.q_proj", (h, c.heads * c.head_dim), 0.02, 0.0), (f"{p}.q_bias", (c.heads * c.head_dim,), 0.02, 0.0),
              (f"{p}.k_proj", (h, kv), 0.02, 0.0), (f"{p}.k_bias", (kv,), 0.02, 0.0),
              (f"{p}.v_proj", (h, kv), 0.02, 0.0), (f"{p}.v_bias", (kv,), 0.02, 0.0),
              (f"{p}.o_proj", (c.heads * c.head_dim, h), 0.02, 0.0),
              (f"{p}.post_norm", (h,), 0.1, 1.0),
              (f"{p}.gate_proj", (h, c.intermediate), 0.02, 0.0), (f"{p}.up_proj", (h, c.intermediate), 0.02, 0.0),
              (f"{p}.down_proj", (c.intermediate, h), 0.02, 0.0)]
    return w + [("final_norm", (h,), 0.1, 1.0)]


def random_weights(c: QwenConfig, seed: int = 0):
    """Yields (name, float32 array) in a fixed order; projections are [K, N] (MatMul's B)."""
    rng = np.random.default_rng(seed)
    for name, shape, std, mean in _weight_shapes(c):
        yield name, (mean + std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)


class _Graph:
    """Appends nodes and initializers straight into `graph` (a GraphProto: at full size every extra
    copy of the initializers is 0.8 GB); each node returns its (first) output name."""

    def __init__(self, graph):
        self.graph, self._n, self._consts = graph, 0, set()

    def op(self, op_type: str, *inputs: str, outputs: int = 1, name: str | None = None, **attrs):
        from onnx import helper

        self._n += 1
        base = name or f"{op_type.lower()}_{self._n}"
        outs = [base] if outputs == 1 and name else [f"{base}:{j}" for j in range(outputs)]
        self.graph.node.append(helper.make_node(op_type, list(inputs), outs, name=base, **attrs))
        return outs[0] if outputs == 1 else outs

    def const(self, name: str, value) -> str:
        """An initializer; a name already added is reused (shape and axis constants repeat per layer)."""
        from onnx import numpy_helper

        if name not in self._consts:
            self._consts.add(name)
            self.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name


def _quantize_matmuls(g: _Graph, weights: dict[str, np.ndarray], inputs: dict[str, str],
                      bits: int, block: int, symmetric: bool, accuracy_level: int) -> None:
    """Adds MatMulNBits nodes (output named like the weight) made by onnxruntime's MatMulNBitsQuantizer.

    The quantizer runs on a model of just these MatMuls (one layer at a time), so the full fp32 model,
    over protobuf's 2 GB at full size, never exists; its nodes and initializers are moved over as is.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    nodes = [helper.make_node("MatMul", [inputs[n], n + ".weight"], [n], name=n) for n in weights]
    acts = sorted(set(inputs[n] for n in weights))
    graph = helper.make_graph(
        nodes, "matmuls",
        [helper.make_tensor_value_info(a, TensorProto.FLOAT, None) for a in acts],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in weights],
        [numpy_helper.from_array(w, n + ".weight") for n, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    q = MatMulNBitsQuantizer(model, bits=bits, block_size=block, is_symmetric=symmetric,
                             accuracy_level=accuracy_level)
    qlog = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = qlog.level
    qlog.setLevel(logging.WARNING)  # it logs two INFO lines per MatMul
    try:
        q.process()
    finally:
        qlog.setLevel(level)
    out: onnx.GraphProto = q.model.model.graph
    got = [n for n in out.node if n.op_type == "MatMulNBits"]
    if len(got) != len(weights):
        raise RuntimeError(f"MatMulNBitsQuantizer quantized {len(got)} of {len(weights)} MatMuls")
    g.graph.node.extend(got)
    g.graph.initializer.extend(out.initializer)


def build_model(path, layers: int = 24, vocab: int = 151936, bits: int = 4, block: int = 32,
                symmetric: bool = False, accuracy_level: int = 4, seed: int = 0, log=None,
                **overrides) -> QwenConfig:
    """Writes the model to `path` and returns its config (also stored in the model's metadata).

    overrides: other QwenConfig fields (hidden, heads, ...) for tiny test models."""
    import onnx
    from onnx import TensorProto, helper

    c = QwenConfig(layers=layers, vocab=vocab, **overrides)
    if c.heads % c.kv_heads or c.head_dim % 2:
        raise ValueError(f"heads ({c.heads}) must be a multiple of kv_heads ({c.kv_heads}), head_dim even")
    group, hd = c.heads // c.kv_heads, c.head_dim
    log = log or (lambda msg: None)
    quant = dict(bits=bits, block=block, symmetric=symmetric, accuracy_level=accuracy_level)
    W = random_weights(c, seed)
    model = helper.make_model(helper.make_graph([], "qwen2.5-0.5b-architecture", [], []), ir_version=IR_VERSION,
                              producer_name="imegen",
                              opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)])
    g = _Graph(model.graph)

    def rms_norm(x, weight_name, weight):
        var = g.op("ReduceMean", g.op("Mul", x, x), axes=[-1], keepdims=1)
        y = g.op("Div", x, g.op("Sqrt", g.op("Add", var, g.const("rms.eps", np.float32(c.rms_eps)))))
        return g.op("Mul", y, g.const(weight_name, weight))

    def rope(x, cos, sin):  # x [B, heads, S, hd]; rotate-half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
        x1, x2 = g.op("Split", x, axis=-1, outputs=2)
        return g.op("Concat", g.op("Sub", g.op("Mul", x1, cos), g.op("Mul", x2, sin)),
                    g.op("Add", g.op("Mul", x2, cos), g.op("Mul", x1, sin)), axis=-1)

    ax = lambda *a: g.const(f"axes_{'_'.join(map(str, a))}", np.array(a, np.int64))  # noqa: E731
    shape = lambda name, *d: g.const(name, np.array(d, np.int64))  # noqa: E731

    # Embedding (fp32 Gather of the tied matrix) and, below, its quantized transpose as lm_head.
    _, embed = next(W)
    x = g.op("Gather", g.const("embed", embed), "input_ids", axis=0)

    # Rotary tables for the given positions, shared by all layers: [B, 1, S, hd/2].
    inv_freq = (1.0 / c.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)).astype(np.float32)
    freqs = g.op("Mul", g.op("Unsqueeze", g.op("Cast", "position_ids", to=TensorProto.FLOAT), ax(-1)),
                 g.const("rope.inv_freq", inv_freq))
    cos, sin = (g.op("Unsqueeze", g.op(f, freqs), ax(1)) for f in ("Cos", "Sin"))

    # Causal mask by position: key j (0..past+S-1) visible to a query at position p iff j <= p. [B, 1, 1, S, T]
    total = g.op("Add", g.op("Gather", g.op("Shape", "past_key_values.0.key"), g.const("dim2", np.int64(2))),
                 g.op("Gather", g.op("Shape", "input_ids"), g.const("dim1", np.int64(1))))
    key_pos = g.op("Range", g.const("zero", np.int64(0)), total, g.const("one", np.int64(1)))
    visible = g.op("LessOrEqual", key_pos, g.op("Unsqueeze", "position_ids", ax(-1)))
    visible = g.op("Unsqueeze", visible, ax(1, 2))
    neg = g.const("mask.neg", np.float32(NEG))

    for i in range(c.layers):
        p = f"layers.{i}"
        lw = dict(next(W) for _ in range(12))
        log(f"layer {i + 1}/{c.layers}: quantizing {bits}-bit, block {block}")
        h = rms_norm(x, f"{p}.input_norm", lw[f"{p}.input_norm"])
        _quantize_matmuls(g, {f"{p}.{n}": lw[f"{p}.{n}"] for n in ("q_proj", "k_proj", "v_proj")},
                          dict.fromkeys((f"{p}.{n}" for n in ("q_proj", "k_proj", "v_proj")), h), **quant)

        def heads(proj, n):  # [B, S, n*hd] (+ bias) -> [B, n, S, hd]
            y = g.op("Add", f"{p}.{proj}_proj", g.const(f"{p}.{proj}_bias", lw[f"{p}.{proj}_bias"]))
            return g.op("Transpose", g.op("Reshape", y, shape(f"shape.bs{n}h", 0, 0, n, hd)), perm=[0, 2, 1, 3])

        q = rope(heads("q", c.heads), cos, sin)
        k = rope(heads("k", c.kv_heads), cos, sin)
        present_k = g.op("Concat", f"past_key_values.{i}.key", k, axis=2, name=f"present.{i}.key")
        present_v = g.op("Concat", f"past_key_values.{i}.value", heads("v", c.kv_heads), axis=2,
                         name=f"present.{i}.value")
        # Grouped-query attention by broadcasting: q heads kv*group+r share kv head kv.
        q5 = g.op("Reshape", q, shape("shape.gqa_q", 0, c.kv_heads, group, -1, hd))  # [B, kv, group, S, hd]
        k5 = g.op("Transpose", g.op("Unsqueeze", present_k, ax(2)), perm=[0, 1, 2, 4, 3])  # [B, kv, 1, hd, T]
        scores = g.op("Mul", g.op("MatMul", q5, k5), g.const("attn.scale", np.float32(hd ** -0.5)))
        probs = g.op("Softmax", g.op("Where", visible, scores, neg), axis=-1)
        ctx = g.op("MatMul", probs, g.op("Unsqueeze", present_v, ax(2)))  # [B, kv, group, S, hd]
        ctx = g.op("Reshape", g.op("Transpose", g.op("Reshape", ctx, shape("shape.heads", 0, c.heads, -1, hd)),
                                   perm=[0, 2, 1, 3]), shape("shape.bsd", 0, 0, c.heads * hd))
        _quantize_matmuls(g, {f"{p}.o_proj": lw[f"{p}.o_proj"]}, {f"{p}.o_proj": ctx}, **quant)
        x = g.op("Add", x, f"{p}.o_proj")

        h = rms_norm(x, f"{p}.post_norm", lw[f"{p}.post_norm"])
        _quantize_matmuls(g, {f"{p}.gate_proj": lw[f"{p}.gate_proj"], f"{p}.up_proj": lw[f"{p}.up_proj"]},
                          {f"{p}.gate_proj": h, f"{p}.up_proj": h}, **quant)
        gate = f"{p}.gate_proj"
        act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), f"{p}.up_proj")
        _quantize_matmuls(g, {f"{p}.down_proj": lw[f"{p}.down_proj"]}, {f"{p}.down_proj": act}, **quant)
        x = g.op("Add", x, f"{p}.down_proj")

    _, final_norm = next(W)
    log(f"lm_head: quantizing the tied embedding ({c.vocab} x {c.hidden})")
    h = rms_norm(x, "final_norm", final_norm)
    _quantize_matmuls(g, {"logits": np.ascontiguousarray(embed.T)}, {"logits": h}, **quant)

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv_shape = ["batch", c.kv_heads, "past", hd]
    inputs = [helper.make_tensor_value_info(n, i64, ["batch", "seq"]) for n in ("input_ids", "position_ids")]
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch", "seq", c.vocab])]
    for i in range(c.layers):
        for kv in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kv}", f32, kv_shape))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kv}", f32, ["batch", c.kv_heads, "total", hd]))
    model.graph.input.extend(inputs)
    model.graph.output.extend(outputs)
    helper.set_model_props(model, {"imegen.qwen.config": json.dumps(asdict(c)),
                                   "imegen.qwen.build": json.dumps({"seed": seed, **quant})})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return c


Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def empty_past(c: QwenConfig, batch: int = 1) -> dict[str, np.ndarray]:
    z = np.zeros((batch, c.kv_heads, 0, c.head_dim), np.float32)
    return {f"past_key_values.{i}.{kv}": z for i in range(c.layers) for kv in ("key", "value")}


def step_feeds(c: QwenConfig, ids, past: dict[str, np.ndarray] | None, start: int) -> dict[str, np.ndarray]:
    """Feeds for tokens `ids` (one sequence) at positions start.. after the cache `past` (None: empty)."""
    ids = np.asarray(ids, np.int64).reshape(1, -1)
    pos = np.arange(start, start + ids.shape[1], dtype=np.int64).reshape(1, -1)
    return {"input_ids": ids, "position_ids": pos, **(past if past is not None else empty_past(c))}


def presents_as_past(c: QwenConfig, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"past_key_values.{i}.{kv}": outputs[f"present.{i}.{kv}"] for i in range(c.layers) for kv in ("key", "value")}


def greedy_decode(run: Run, prompt_ids, steps: int, config: QwenConfig) -> tuple[list[int], np.ndarray]:
    """Prefill the prompt (M = prompt length), then decode one token per run (M = 1).

    Returns the `steps` generated token ids and float32 [steps, vocab]: row t holds the logits token t
    was chosen from (row 0 from the prefill's last position)."""
    prompt = [int(t) for t in prompt_ids]
    out = run(step_feeds(config, prompt, None, 0))
    logits, tokens = [out["logits"][0, -1]], []
    for t in range(steps):
        tokens.append(int(np.argmax(logits[-1])))
        if t + 1 == steps:
            break
        out = run(step_feeds(config, tokens[-1:], presents_as_past(config, out), len(prompt) + t))
        logits.append(out["logits"][0, -1])
    return tokens, np.stack(logits).astype(np.float32)


def host_runner(session) -> Run:
    """`run` for an onnxruntime.InferenceSession."""
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="imegen qwen-model", description=SUMMARY)
    add_arguments(ap)
    return run_command(ap.parse_args(argv))


SUMMARY = ("write a Qwen2.5-0.5B-architecture ONNX model (random weights, int4/int8 MatMulNBits) in the form "
           "onnxruntime-genai exports, or in plain ops")
# What qwen-model offers: MatMulNBits' bit widths and block sizes (powers of two, 16-256), its accuracy levels.
BITS, BLOCKS, LEVELS = (4, 8), (16, 32, 64, 128, 256), (0, 1, 2, 3, 4)
FORMS = ("genai", "plain")
GENAI_ONLY = ("--untied", "--context")  # options of the genai form alone


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("output", help="model file to write (.onnx)")
    ap.add_argument("--form", choices=FORMS, default="genai", help=(
        "genai (default): the graph onnxruntime-genai's model builder exports (GroupQueryAttention with "
        "rotary, SimplifiedLayerNormalization, fused q/k/v MatMulNBits, the int4 embedding shared with the "
        "lm_head; onnxruntime 1.23 runs it, 1.21 does not), weights in OUTPUT.data beside it when over 64 MiB, and "
        "genai_config.json beside it; plain: opset-17 ops and MatMulNBits from onnxruntime's quantizer, "
        "inputs input_ids and position_ids, one file (any onnxruntime runs it, 1.21 too)"))
    ap.add_argument("--layers", type=cli_types.at_least(1), default=24, help="decoder layers (default 24, as Qwen2.5-0.5B)")
    ap.add_argument("--vocab", type=cli_types.at_least(1), default=151936,
                    help="vocabulary size (default 151936, as Qwen2.5-0.5B)")
    ap.add_argument("--bits", type=cli_types.one_of(BITS), choices=BITS, default=4, help="weight bits (default 4)")
    ap.add_argument("--block", type=cli_types.one_of(BLOCKS), choices=BLOCKS, default=32,
                    help="quantization block size (default 32)")
    zero = ap.add_mutually_exclusive_group()
    zero.add_argument("--symmetric", action="store_true", default=None,
                      help="no zero points (the default of --form genai, as genai exports)")
    zero.add_argument("--asymmetric", dest="symmetric", action="store_false",
                      help="uint8 zero points (the default of --form plain, as onnxruntime's quantizer writes)")
    ap.add_argument("--accuracy-level", type=cli_types.one_of(LEVELS), choices=LEVELS, default=4,
                    help="MatMulNBits accuracy_level of every node (default 4: int8 compute)")
    ap.add_argument("--untied", action="store_true", help=(
        "--form genai: the embedding as its own fp32 Gather, not read from the lm_head's int4 weights (genai's "
        "shared_embeddings=false); 8-bit or asymmetric weights are always untied, as genai exports them"))
    ap.add_argument("--context", type=cli_types.at_least(1), default=None,
                    help="--form genai: positions the rotary caches hold (default 32768, as Qwen2.5-0.5B)")
    ap.add_argument("--seed", type=cli_types.seed, default=0, help="seed of the random weights (default 0)")


def run_command(args) -> int:
    t0 = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    if args.form == "plain":
        given = [opt for opt, value in (("--untied", args.untied), ("--context", args.context)) if value]
        if given:
            print(f"error: {' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to --form genai only",
                  file=sys.stderr)
            return 2
        return _write_plain(args, log)
    return _write_genai(args, log)


def _write_plain(args, log) -> int:
    symmetric = bool(args.symmetric)  # onnxruntime's quantizer defaults to zero points
    c = build_model(args.output, layers=args.layers, vocab=args.vocab, bits=args.bits, block=args.block,
                    symmetric=symmetric, accuracy_level=args.accuracy_level, seed=args.seed, log=log)
    size = Path(args.output).stat().st_size
    print(f"wrote {args.output}: {c.layers} layers, vocab {c.vocab}, {args.bits}-bit block {args.block} "
          f"{'symmetric' if symmetric else 'asymmetric'}, accuracy_level {args.accuracy_level}, "
          f"{(c.layers * 7 + 1)} MatMulNBits, {size / 2**20:.1f} MiB")
    return 0


def _write_genai(args, log) -> int:
    from . import genai_form

    symmetric = args.symmetric is not False  # genai's default: no zero points
    # genai shares the embedding only for symmetric int4 (GatherBlockQuantized is 4-bit; its asymmetric
    # shared form does not load in onnxruntime, so the working asymmetric export turns sharing off).
    tied = args.bits == 4 and symmetric and not args.untied
    c = genai_form.GenaiConfig(layers=args.layers, vocab=args.vocab, bits=args.bits, block=args.block,
                               symmetric=symmetric, accuracy_level=args.accuracy_level, tied=tied, seed=args.seed,
                               context=args.context or genai_form.GenaiConfig.context)
    try:
        c, files = genai_form.write_genai_model(args.output, c, log=log)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in files)
    print(f"wrote {', '.join(map(str, files))}: genai form, {c.layers} layers, vocab {c.vocab}, {c.bits}-bit block "
          f"{c.block} {'symmetric' if symmetric else 'asymmetric'}, accuracy_level {c.accuracy_level}, "
          f"{'embedding shared with the lm_head' if tied else 'own fp32 embedding'}, {c.matmuls} MatMulNBits, "
          f"{size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
