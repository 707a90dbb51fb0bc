"""Move a decoder's other nodes onto imegen's operators (decoder_ops.c): RMSNorms, the SiLU-gated MLP's activation
and GroupQueryAttention, in the forms onnxruntime-genai exports; every other form stays in ORT, with the reason.

    SimplifiedLayerNormalization          -> ai.imegen SimplifiedLayerNormalization (Y only)
    com.microsoft SkipSimplifiedLayerNormalization
                                          -> ai.imegen SkipSimplifiedLayerNormalization (output, input_skip_bias_sum)
    Sigmoid(g), Mul(g, .), Mul(., u)      -> ai.imegen SiluMul(g, u)   (g and u: MatMulNBits of one input, one N)
                                             or, where u's MatMulNBits is imegen's and feeds only this Mul, that
                                             node with g as its gate input (SiluGate: the kernel applies the SiLU
                                             to each block of its output while the block is in the cache)
    com.microsoft GroupQueryAttention     -> ai.imegen GroupQueryAttention (packed qkv, past_key, past_value,
                                             seqlens_k, total_sequence_length[, cos_cache, sin_cache])
"""

from __future__ import annotations

from dataclasses import dataclass

from .customop import DOMAIN
from .rewrite import consumers

MS_DOMAIN = "com.microsoft"
SERVED = {"GroupQueryAttention": "imegen rvv fp32 (rotary and KV cache here, attention on the spec's attention kernel)"}
FLOAT = 1  # onnx.TensorProto.FLOAT
OPS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "SiluMul", "SiluGate", "GroupQueryAttention")
# GroupQueryAttention's inputs by name (ORT 1.23's 12-input form; 1.21 stops after sin_cache)
GQA_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
              "sin_cache", "position_ids", "attention_bias", "head_sink")
# ai.imegen GroupQueryAttention's inputs: com.microsoft's without key, value and the inputs it does not serve
IMEGEN_GQA_INPUTS = ("query", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache")
# GroupQueryAttention's past_key, past_value input slot -> the output slot of its present_key, present_value, per
# domain: genai binds each pair to one buffer (ort-model-check, the per-node bench)
GQA_PRESENT_OF_PAST = {domain: {names.index("past_key"): 1, names.index("past_value"): 2}
                       for domain, names in ((MS_DOMAIN, GQA_INPUTS), (DOMAIN, IMEGEN_GQA_INPUTS))}
# attributes whose non-default values change what GroupQueryAttention computes, and their defaults
GQA_DEFAULTS = {"local_window_size": -1, "softcap": 0.0, "smooth_softmax": 0, "qk_output": 0}


@dataclass(frozen=True)
class DecoderDecision:
    node: str
    op: str  # the imegen operator it becomes (or would)
    moved: bool
    detail: str  # what serves it, or why it stays

    def __str__(self) -> str:
        return f"{'moved' if self.moved else 'kept '} {self.node} ({self.op}): {self.detail}"


def _name(node) -> str:
    return node.name or f"(unnamed, output {node.output[0]})"


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class _Graph:
    """What the rules ask of a graph: producers, consumers, element types that are known without inference."""

    def __init__(self, graph):
        self.graph = graph
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.consumers = consumers(graph)
        self.outputs = {o.name for o in graph.output}
        self.types = {t.name: t.data_type for t in graph.initializer}
        self.types.update({v.name: v.type.tensor_type.elem_type for v in graph.input})

    def used(self, name: str) -> bool:
        return bool(name) and (name in self.outputs or bool(self.consumers.get(name)))

    def used_as_output(self, name: str) -> bool:
        """A graph output cannot be fused away."""
        return name in self.outputs

    def not_float(self, names) -> str | None:
        """The first of `names` known to be other than float32, described; None if none is."""
        for name in names:
            t = self.types.get(name)
            if name and t not in (None, FLOAT):
                return f"{name} is not float32 (imegen's decoder operators are fp32)"
        return None


def _norm(g: _Graph, node) -> str | None:
    a = _attrs(node)
    if int(a.get("axis", -1)) != -1:
        return f"axis {a['axis']} (only the last axis, -1, is served)"
    if int(a.get("stash_type", 1)) != 1:
        return "stash_type is not 1 (float)"
    if any(g.used(o) for o in node.output[1:]):
        return "its inv_std_var output is used"
    return g.not_float(node.input[:2])


def _skip_norm(g: _Graph, node) -> str | None:
    if any(g.used(o) for o in node.output[1:3]):
        return "its mean or inv_std_var output is used"
    return g.not_float(node.input[:4])


def _gqa_inputs(node) -> dict[str, str]:
    return {name: (node.input[i] if i < len(node.input) else "") for i, name in enumerate(GQA_INPUTS)}


def _gqa(g: _Graph, node) -> str | None:
    ins, a = _gqa_inputs(node), _attrs(node)
    if ins["key"] or ins["value"]:
        return "separate key and value inputs (only packed QKV is served)"
    if not (ins["past_key"] and ins["past_value"]):
        return "no past_key/past_value inputs"
    for extra in ("position_ids", "attention_bias", "head_sink"):
        if ins[extra]:
            return f"it has a {extra} input"
    for attr, default in GQA_DEFAULTS.items():
        if attr in a and a[attr] != default:
            return f"{attr} = {a[attr]} (only {default} is served)"
    if int(a.get("do_rotary", 0)) == 1 and not (ins["cos_cache"] and ins["sin_cache"]):
        return "do_rotary = 1 without cos_cache and sin_cache"
    return g.not_float([ins["query"], ins["past_key"], ins["past_value"], ins["cos_cache"], ins["sin_cache"]])


def _is_matmul_nbits(node) -> bool:
    return node is not None and node.op_type == "MatMulNBits" and node.domain in (MS_DOMAIN, DOMAIN)


@dataclass(frozen=True)
class _SiluMul:
    sigmoid: object
    gate_mul: object
    up_mul: object
    gate: str
    up: str


def _silu_pattern(g: _Graph, sigmoid) -> tuple[_SiluMul | None, str]:
    """Sigmoid(gate) -> Mul(gate, s) -> Mul(., up), or (None, why not)."""
    gate = sigmoid.input[0]
    users = g.consumers.get(sigmoid.output[0], [])
    if len(users) != 1 or users[0].op_type != "Mul" or users[0].domain not in ("", "ai.onnx") \
            or sorted(users[0].input) != sorted([gate, sigmoid.output[0]]) or g.used_as_output(sigmoid.output[0]):
        return None, "not Sigmoid(x) * x (a SiLU)"
    gate_mul = users[0]
    nxt = g.consumers.get(gate_mul.output[0], [])
    if len(nxt) != 1 or nxt[0].op_type != "Mul" or nxt[0].domain not in ("", "ai.onnx") \
            or g.used_as_output(gate_mul.output[0]):
        return None, "the SiLU does not feed exactly one Mul (a gated MLP)"
    up_mul = nxt[0]
    up = up_mul.input[1] if up_mul.input[0] == gate_mul.output[0] else up_mul.input[0]
    pg, pu = g.producer.get(gate), g.producer.get(up)
    if not (_is_matmul_nbits(pg) and _is_matmul_nbits(pu) and pg.input[0] == pu.input[0]
            and _attrs(pg).get("N") == _attrs(pu).get("N")):
        return None, "gate and up are not MatMulNBits of one input and one N (their shapes could differ)"
    return _SiluMul(sigmoid, gate_mul, up_mul, gate, up), ""


CHECKS = {("", "SimplifiedLayerNormalization"): ("SimplifiedLayerNormalization", _norm),
          (MS_DOMAIN, "SkipSimplifiedLayerNormalization"): ("SkipSimplifiedLayerNormalization", _skip_norm),
          (MS_DOMAIN, "GroupQueryAttention"): ("GroupQueryAttention", _gqa)}


def _move_norm(node) -> None:
    del node.output[1:]
    node.domain = DOMAIN


def _move_skip_norm(node) -> None:
    outs = list(node.output) + [""] * (4 - len(node.output))
    total = outs[3] or f"{node.output[0]}_imegen_sum"  # ORT needs every declared output named; nothing reads it
    del node.output[:]
    node.output.extend([outs[0], total])
    node.domain = DOMAIN


def _move_gqa(node) -> None:
    ins = _gqa_inputs(node)
    kept = [ins[k] for k in IMEGEN_GQA_INPUTS]
    while kept and not kept[-1]:
        kept.pop()
    del node.input[:]
    node.input.extend(kept)
    node.domain = DOMAIN


MOVES = {"SimplifiedLayerNormalization": _move_norm, "SkipSimplifiedLayerNormalization": _move_skip_norm,
         "GroupQueryAttention": _move_gqa}


GATE_INPUT = 6  # ai.imegen MatMulNBits' gate input (customop_lib.c IN_GATE), after ORT's six
GATED = "imegen rvv fp32 in the up projection's MatMulNBits (the SiLU on each block of its output, in the cache)"


def _gated_up(g: _Graph, p: _SiluMul):
    """The up projection's node when the SiLU can ride in its kernel: imegen serves it, and the SiLU's Mul is all
    that reads its output."""
    up = g.producer.get(p.up)
    if up is None or up.op_type != "MatMulNBits" or up.domain != DOMAIN or len(up.input) > GATE_INPUT:
        return None
    if g.used_as_output(p.up) or len(g.consumers.get(p.up, [])) != 1:
        return None
    return up


def _gate_up(up, p: _SiluMul, graph) -> None:
    """up(x) -> up(x, gate = g), writing the SiLU's output; Sigmoid, Mul, Mul removed."""
    up.input.extend([""] * (GATE_INPUT - len(up.input)) + [p.gate])
    up.output[0] = p.up_mul.output[0]
    for old in (p.sigmoid, p.gate_mul, p.up_mul):
        graph.node.remove(old)
    # the gate is computed before the up projection reads it: move up after the gate's producer if needed
    nodes = list(graph.node)
    made = {o: i for i, n in enumerate(nodes) for o in n.output}
    if made.get(p.gate, -1) > nodes.index(up):
        graph.node.remove(up)
        graph.node.insert(made[p.gate], up)


def _fuse_silu(graph, p: _SiluMul) -> None:
    from onnx import helper

    fused = helper.make_node("SiluMul", [p.gate, p.up], [p.up_mul.output[0]], name=p.up_mul.name or None,
                             domain=DOMAIN)
    at = list(graph.node).index(p.up_mul)
    graph.node.insert(at, fused)
    for old in (p.sigmoid, p.gate_mul, p.up_mul):
        graph.node.remove(old)


def rewrite_decoder_ops(model, *, attention: bool = True, apply: bool = True) -> list[DecoderDecision]:
    """Decide, for every decoder node of the main graph, whether imegen's operators serve it; with `apply`, move
    those that are served (the model is modified in place). Graph order. `attention`: the library has an
    attention kernel (the spec's `attention` blocks), which GroupQueryAttention nodes need."""
    graph = model.graph
    g = _Graph(graph)
    decisions, moves, fusions, gates = [], [], [], []
    for node in list(graph.node):
        key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
        if key in CHECKS:
            op, check = CHECKS[key]
            why = check(g, node)
            if why is None and op == "GroupQueryAttention" and not attention:
                why = "the spec has no attention kernel (an `attention NAME { ... }` block)"
            decisions.append(DecoderDecision(_name(node), op, why is None, why or SERVED.get(op, "imegen rvv fp32")))
            if why is None:
                moves.append(node)
        elif key == ("", "Sigmoid"):
            pattern, why = _silu_pattern(g, node)
            why = why or g.not_float([pattern.gate, pattern.up])
            name = _name(pattern.up_mul) if pattern else _name(node)
            up = None if why else _gated_up(g, pattern)
            if up is not None:
                decisions.append(DecoderDecision(name, "SiluGate", True, GATED))
                gates.append((up, pattern))
            else:
                decisions.append(DecoderDecision(name, "SiluMul", not why,
                                                 why or "imegen rvv fp32 (Sigmoid, Mul, Mul fused)"))
                if not why:
                    fusions.append(pattern)
    if apply:
        for node in moves:
            MOVES[node.op_type](node)
        for p in fusions:
            _fuse_silu(graph, p)
        for up, p in gates:
            _gate_up(up, p, graph)
        if (moves or fusions or gates) and not any(o.domain == DOMAIN for o in model.opset_import):
            model.opset_import.add(domain=DOMAIN, version=1)
    return decisions
