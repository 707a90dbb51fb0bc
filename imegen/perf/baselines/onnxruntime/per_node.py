"""A per-node account of the graph users run: onnxruntime-genai's export form of Qwen2.5-0.5B
(imegen/ort/genai_form.py, what `imegen qwen-model` writes) in three engines, by phase and context.

  stock-ort            Debian's riscv64 onnxruntime 1.23, every node stock.
  ort-imegen-matmul    MatMulNBits moved to imegen's custom-op library, the rest stock: the model and library
                       `imegen ort-accelerate --flavour qemu --matmul-only` writes (setup runs it).
  ort-imegen-decoder   also the decoder nodes on imegen's RVV operators (RMSNorms, GroupQueryAttention on the spec's
                       attention kernel; Sigmoid-Mul-Mul inside the up projection's MatMulNBits, its gate input):
                       `imegen ort-accelerate --flavour qemu`.

Stages (frozen dataclasses between them):
 1. partition: every node of the model belongs to exactly one Unit: the nodes ORT runs as one after its own
    graph optimizer (its MatMulNBitsFusion folds the q/k/v bias Add into a com.microsoft MatMulNBits, which a
    node in imegen's domain never gets; its QuickGeluFusion makes Sigmoid+Mul one QuickGelu, so the SiLU gate
    Sigmoid, Mul, Mul is one unit; where imegen's decoder operators folded it into the up projection's MatMulNBits,
    that MatMulNBits and the three are one unit, _gated), or a folded unit (Constant nodes, the embedding's
    Reshape of the lm_head weights: computed once at session creation, no per-Run work).
 2. distinct_nodes: each unit's signature (ops, attributes, input shapes and types at the phase); units of one
    signature are one distinct node with a multiplicity. The account is enumerated on a model of >= 2 layers
    and scaled to LAYERS: layer 0 (its first RMSNorm is the plain one) once, each later layer's units
    (LAYERS - 1) / (layers - 1) times, the rest (embedding, attention mask, final norm, lm_head) once.
 3. unit_model: the unit's nodes from the engine's graph with their real initializers (the form's seeded random
    weights, quantized by imegen.reference's bit-exact port of ORT's quantizer), folded inputs materialized,
    every other input a graph input fed seeded data at the phase's shapes; the attention-mask values are the
    real ones (all-ones mask of past + new positions). GroupQueryAttention runs as onnxruntime-genai runs it on
    CPU (its builder sets past_present_share_buffer): each present output written into its past input's own
    buffer (Phase.kv_buffer), so neither ORT's operator nor imegen's copies the past; only the new tokens' rows
    are written.
 4. count: per-Run instructions in ORT 1.23 under QEMU, 1 intra-op thread (run_counts.cached_count_runs; a unit
    with a shared KV buffer shared_runs.cached_count_runs, the same counts with present pre-allocated in past), the
    imegen engines' units with the qemu-flavour library; an imegen unit's outputs must agree with the same
    unit in stock ORT before its count is used (both imegen engines' MatMulNBits run the same kernels: they are
    counted once, with the matmul-only library). The node's own work = its per-Run count minus the per-Run
    count of a trivial one-node model (Neg of one float) counted the same way (ORT's Run overhead), class by
    class (floored at 0); the whole graph's one Run overhead is added once per token/prefill.
 5. time: MODELED per node max(core cycles / threads / clock, DRAM bytes / bandwidth) (nodes.modeled_time,
    x60.py), summed over the graph with multiplicities.
"""

from __future__ import annotations

import inspect
import math
import re
import tempfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .... import cache
from ....ort.decoder_ops import GATE_INPUT, GQA_PRESENT_OF_PAST
from ....ort.rewrite import bias_add, constant_initializers
from ....ort.rewrite import consumers as graph_consumers
from ...model import x60
from . import run_counts, shared_runs
from .nodes import mean_counts, modeled_time

LAYERS = 24
CONTEXTS = (128, 512)
ENGINES = ("stock-ort", "ort-imegen-matmul", "ort-imegen-decoder")
STOCK, MATMUL, DECODER = ENGINES
MS = "com.microsoft"
IMEGEN = "ai.imegen"
SEED = 4321
OVERHEAD_RUNS = 3  # the trivial model's per-Run count moves by ~1%: a mean of three
MATMUL_CATEGORY = "MatMulNBits"
RUN_CATEGORY = "ORT Run"
MASK_OPS = ("ReduceSum", "Sub", "Cast", "Shape", "Gather")  # genai's attention-mask subgraph: integers only
DECODER_RTOL = 2e-5  # |imegen - stock| <= DECODER_RTOL * (1 + max |stock|): fp32 rounding (tests/test_decoder_ops.py)
IME_CORES = x60.X60.ime_cores


# ------------------------------------------------------------------------------------------ phases
@dataclass(frozen=True)
class Phase:
    kind: str  # "decode": one new token after `context` cached; "prefill": `context` tokens, empty cache
    context: int

    @property
    def past(self) -> int:
        return self.context if self.kind == "decode" else 0

    @property
    def new(self) -> int:
        return 1 if self.kind == "decode" else self.context

    @property
    def label(self) -> str:
        return f"{self.kind} {self.context}"

    @property
    def kv_buffer(self) -> int:
        """Positions of the KV buffer genai binds as both past and present. genai's holds max_length positions;
        GroupQueryAttention (ORT's and imegen's) reads the valid past rows and writes the new tokens' rows,
        whatever the buffer's length beyond them, so the account's buffer is exactly past + new positions (the
        rows the new tokens take are fed as NaN: a count whose output still holds one was not written in place,
        and its check fails)."""
        return self.past + self.new


PHASES = tuple(Phase(k, c) for k in ("decode", "prefill") for c in CONTEXTS)


# ------------------------------------------------------------------------------------------ 1. partition
@dataclass(frozen=True)
class Unit:
    nodes: tuple[str, ...]  # names of the model's nodes that run as one
    category: str
    layer: int | None  # decoder layer, None outside the layers
    folded: bool = False  # computed once at session creation: no per-Run work


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def layer_count(model) -> int:
    return sum(n.op_type == "GroupQueryAttention" for n in model.graph.node)


def layer_of(name: str, layers: int) -> int | None:
    """genai names a layer's nodes /model/layers.{i}/...; the final norm is /model/layers.{layers}/."""
    m = re.match(r"/model/layers\.(\d+)/", name)
    return int(m.group(1)) if m and int(m.group(1)) < layers else None


def folded_nodes(graph) -> set[str]:
    """Nodes whose inputs are all constant: ORT's constant folding computes them at session creation."""
    const = {t.name for t in graph.initializer} - {i.name for i in graph.input}
    folded = set()
    for n in graph.node:
        if all(not i or i in const for i in n.input):
            folded.add(n.name)
            const.update(o for o in n.output if o)
    return folded


def _silu_triples(graph, consumers) -> list[tuple]:
    """Sigmoid(g) -> Mul(g, s) -> Mul(., u): the SiLU gate genai writes (one unit in every engine)."""
    out = []
    for s in graph.node:
        if s.op_type != "Sigmoid":
            continue
        first = consumers.get(s.output[0], [])
        if len(first) == 1 and first[0].op_type == "Mul" and s.input[0] in first[0].input:
            second = consumers.get(first[0].output[0], [])
            if len(second) == 1 and second[0].op_type == "Mul":
                out.append((s, first[0], second[0]))
    return out


def _gated(triple: tuple, producer: dict, engine_nodes: dict) -> tuple:
    """A SiLU triple with the up projection's MatMulNBits in front when the engine runs them as one node (imegen's
    decoder operators fold the SiLU into that node's gate input: decoder_ops.py), else the triple.
    engine_nodes: the engine's graph nodes by name."""
    sigmoid, gate_mul, up_mul = triple
    up = producer.get(next(i for i in up_mul.input if i != gate_mul.output[0]))
    mine = engine_nodes.get(up.name) if up is not None else None
    if mine is not None and mine.op_type == "MatMulNBits" and len(mine.input) > GATE_INPUT and mine.input[GATE_INPUT]:
        return (up, *triple)
    return triple


def _bias_pairs(graph, consumers) -> list[tuple]:
    """com.microsoft MatMulNBits whose only consumer is an Add of a constant [N]: ORT's MatMulNBitsFusion, the pairs
    imegen's rewrite folds by the same rule (rewrite.bias_add)."""
    inits = constant_initializers(graph)
    pairs = []
    for n in graph.node:
        if n.op_type == "MatMulNBits" and n.domain == MS:
            found = bias_add(graph, n, consumers, inits)
            if found is not None:
                pairs.append((n, found[0]))
    return pairs


def _bias_taken(pair: tuple, nodes: dict) -> bool:
    """Whether the engine runs a bias pair of the model as one node: ORT fuses it where the MatMulNBits stayed
    com.microsoft; imegen ort-accelerate folded the Add into its MatMulNBits in the file (the Add is gone).
    nodes: the engine's graph nodes by name."""
    mm, add = pair
    if mm.name not in nodes:
        return False
    return add.name not in nodes or nodes[mm.name].domain == MS


def category_of(nodes) -> str:
    ops = [n.op_type for n in nodes]
    if "MatMulNBits" in ops:
        return MATMUL_CATEGORY
    if "Sigmoid" in ops or "SiluMul" in ops:
        return "SiLU gate"
    if ops[0] in MASK_OPS:
        return "attention mask"
    return ops[0]


def partition(model, engine_model) -> list[Unit]:
    """Every node of `model` (genai's form, not rewritten) in exactly one Unit as ORT runs `engine_model` (the
    model as an engine rewrote it: a MatMulNBits and its bias Add are one unit where ORT fuses them or the file
    folded them, _bias_taken), graph order."""
    graph = model.graph
    layers = layer_count(model)
    consumers = graph_consumers(graph)
    folded = folded_nodes(graph)
    producer = {o: n for n in graph.node for o in n.output if o}
    engine_nodes = {n.name: n for n in engine_model.graph.node}
    groups = [_gated(t, producer, engine_nodes) for t in _silu_triples(graph, consumers)]
    groups += [pair for pair in _bias_pairs(graph, consumers) if _bias_taken(pair, engine_nodes)]
    group_of = {n.name: g for g in groups for n in g}
    units, seen = [], set()
    for n in graph.node:
        if n.name in seen:
            continue
        members = group_of.get(n.name, (n,))
        seen.update(m.name for m in members)
        units.append(Unit(tuple(m.name for m in members), "folded" if n.name in folded else category_of(members),
                          layer_of(n.name, layers), n.name in folded))
    return units


def multiplicity(unit: Unit, layers: int, target: int = LAYERS) -> float:
    """How often a unit of a `layers`-layer model runs in a `target`-layer one (see the module doc)."""
    if unit.layer is None or unit.layer == 0:
        return 1.0
    return (target - 1) / (layers - 1)


# ------------------------------------------------------------------------------------------ 2. shapes and signatures
@dataclass(frozen=True)
class Tensor:
    dtype: int  # onnx TensorProto element type
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        from onnx import helper

        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(helper.tensor_dtype_to_np_dtype(self.dtype)).itemsize


def _dims(vi, phase: Phase, head_size: int) -> tuple[int, ...]:
    sizes = {"batch_size": 1, "sequence_length": phase.new, "total_sequence_length": phase.past + phase.new,
             "past_sequence_length": phase.kv_buffer, "kv_cache_dim": head_size}
    return tuple(d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in vi.type.tensor_type.shape.dim)


def head_size(model) -> int:
    """Of the first GroupQueryAttention: its packed query's width (the N of the MatMulNBits feeding it, through
    the bias Add) / (num_heads + 2 kv_num_heads)."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    gqa = next(n for n in graph.node if n.op_type == "GroupQueryAttention")
    a = _attrs(gqa)
    node = producer[gqa.input[0]]
    while node.op_type != "MatMulNBits":
        node = producer[node.input[0]]
    return _attrs(node)["N"] // (a["num_heads"] + 2 * a["kv_num_heads"])


def _reshaped(src: tuple[int, ...], dims) -> tuple[int, ...]:
    """Reshape's output dims: 0 keeps the input's dim, -1 takes what is left."""
    out = [int(d) if d else src[i] for i, d in enumerate(dims)]
    if -1 in out:
        out[out.index(-1)] = int(np.prod(src, dtype=np.int64)) // -int(np.prod(out, dtype=np.int64))
    return tuple(out)


def _np_rule(node, x: list):
    """numpy for the nodes ORT folds or that compute the attention mask's integers; None: not evaluated."""
    from onnx import numpy_helper

    a, op = _attrs(node), node.op_type
    if op == "Constant":
        return numpy_helper.to_array(a["value"])
    if any(v is None for v in x):
        return None
    if op == "Reshape":
        return x[0].reshape(_reshaped(x[0].shape, x[1]))
    if op == "ReduceSum":
        return x[0].sum(axis=tuple(int(i) for i in x[1]), keepdims=bool(a.get("keepdims", 1)))
    if op == "Sub":
        return x[0] - x[1]
    if op == "Cast":
        from onnx import helper

        return x[0].astype(helper.tensor_dtype_to_np_dtype(a["to"]))
    if op == "Shape":
        return np.array(x[0].shape, np.int64)
    if op == "Gather":
        return np.take(x[0], x[1], axis=a.get("axis", 0))
    return None


def _shape_rule(node, x: list[Tensor], head: int) -> list[Tensor | None]:
    """Output types of the float ops of genai's form from their input types."""
    from onnx import TensorProto

    a, op = _attrs(node), node.op_type
    if op == "MatMulNBits":
        return [Tensor(x[0].dtype, x[0].shape[:-1] + (a["N"],))]
    if op == "GatherBlockQuantized":
        return [Tensor(x[2].dtype, x[1].shape + (x[0].shape[1] * 8 // a.get("bits", 4),))]
    if op in ("SimplifiedLayerNormalization", "Sigmoid", "QuickGelu", "SiluMul"):
        return [x[0]]
    if op == "SkipSimplifiedLayerNormalization":
        return [x[0], None, None, x[0]]
    if op in ("Add", "Mul", "Sub"):
        return [Tensor(x[0].dtype, tuple(np.broadcast_shapes(x[0].shape, x[1].shape)))]
    if op == "Cast":
        return [Tensor(a["to"], x[0].shape)]
    if op == "Gather":
        axis = a.get("axis", 0) % len(x[0].shape)
        return [Tensor(x[0].dtype, x[0].shape[:axis] + x[1].shape + x[0].shape[axis + 1:])]
    if op == "GroupQueryAttention":  # present: the very buffer past is (Phase.kv_buffer)
        b, s, _ = x[0].shape
        present = Tensor(TensorProto.FLOAT, (b, a["kv_num_heads"], x[3].shape[2], head))
        return [Tensor(x[0].dtype, (b, s, a["num_heads"] * head)), present, present]
    raise ValueError(f"no shape rule for {node.domain or 'ai.onnx'} {op} ({node.name})")


@dataclass(frozen=True)
class Types:
    """Every tensor of the model at a phase: its type, and its value where it is known before the Run
    (initializers, folded outputs) or computed from the attention mask alone (integers)."""

    tensors: dict[str, Tensor]
    values: dict[str, np.ndarray]


def tensor_types(model, phase: Phase) -> Types:
    from onnx import TensorProto, numpy_helper

    graph = model.graph
    head = head_size(model)
    tensors, values = {}, {}
    for t in graph.initializer:
        tensors[t.name] = Tensor(t.data_type, tuple(t.dims))
    for vi in graph.input:
        tensors[vi.name] = Tensor(vi.type.tensor_type.elem_type, _dims(vi, phase, head))
    values["attention_mask"] = np.ones(tensors["attention_mask"].shape, np.int64)
    lazy = {t.name: t for t in graph.initializer}

    def value(name):
        if name in values:
            return values[name]
        if name in lazy and lazy[name].data_type in (TensorProto.INT64, TensorProto.INT32):
            return numpy_helper.to_array(lazy[name])
        return None

    for n in graph.node:
        x = [value(i) for i in n.input]
        v = _np_rule(n, x) if n.op_type == "Constant" or n.op_type in MASK_OPS else None
        if v is not None:
            values[n.output[0]] = v
            tensors[n.output[0]] = Tensor(numpy_helper.from_array(np.asarray(v)).data_type, tuple(np.shape(v)))
            continue
        if n.op_type == "Reshape":  # of a constant (the lm_head weights): the shape input is a constant
            src = tensors[n.input[0]]
            tensors[n.output[0]] = Tensor(src.dtype, _reshaped(src.shape, value(n.input[1])))
            continue
        outs = _shape_rule(n, [tensors.get(i) for i in n.input], head)
        for name, t in zip(n.output, outs):
            if name and t is not None:
                tensors[name] = t
    return Types(tensors, values)


def logits_rows_last_only(model, unit: Unit, phase: Phase) -> bool:
    """The lm_head (the unit writing the graph output `logits`) at prefill computes the last position's logits
    only (as llama.cpp does): M = 1."""
    if phase.kind != "prefill" or "logits" not in {o.name for o in model.graph.output}:
        return False
    nodes = {n.name: n for n in model.graph.node}
    return any("logits" in nodes[name].output for name in unit.nodes)


# ------------------------------------------------------------------------------------------ 3. unit models
@dataclass(frozen=True)
class UnitModel:
    model: object  # onnx.ModelProto
    feeds: dict[str, np.ndarray]
    wanted: tuple[str, ...]
    digest: str  # of the model, feeds, wanted outputs and sharing: what a count depends on
    share: tuple[tuple[str, str], ...] = ()  # (output, input): the output written into the input's buffer

    def make(self, d: Path, check):
        import onnx

        path = d / "unit.onnx"
        onnx.save(self.model, str(path))
        return path, self.feeds, list(self.wanted), check


def _io_of(nodes) -> tuple[list[str], list[str]]:
    made = {o for n in nodes for o in n.output if o}
    used = {i for n in nodes for i in n.input if i}
    inputs = list(dict.fromkeys(i for n in nodes for i in n.input if i and i not in made))
    outputs = [o for n in nodes for o in n.output if o and o not in used]
    return inputs, outputs


def _feed(name: str, t: Tensor, types: Types, rng, index_bound: int | None) -> np.ndarray:
    from onnx import helper

    dtype = helper.tensor_dtype_to_np_dtype(t.dtype)
    if name in types.values:
        return np.asarray(types.values[name], dtype).reshape(t.shape)
    if index_bound is not None:
        return rng.integers(0, index_bound, size=t.shape).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(t.shape).astype(dtype)
    raise ValueError(f"no feed rule for {name} ({dtype})")


def _digest(model, feeds: dict, wanted, share=()) -> str:
    chunks = [model.SerializeToString(deterministic=True)]
    for k in sorted(feeds):
        chunks.append(k.encode() + str(feeds[k].dtype).encode() + repr(feeds[k].shape).encode() + feeds[k].tobytes())
    chunks.append(repr(tuple(wanted)).encode())
    if share:
        chunks.append(repr(tuple(share)).encode())
    return cache.sha256_hex(*chunks)[:32]


def kv_sharing(nodes, feeds: dict, wanted) -> tuple[tuple[str, str], ...]:
    """(present, past) of each GroupQueryAttention whose past is fed and present wanted: genai's binding."""
    pairs = []
    for n in nodes:
        if n.op_type == "GroupQueryAttention":
            pairs += [(n.output[o], n.input[i]) for i, o in GQA_PRESENT_OF_PAST[n.domain].items()
                      if n.output[o] in wanted and n.input[i] in feeds]
    return tuple(pairs)


def _unwritten_rows_nan(feeds: dict, share, past: int) -> None:
    """The rows of each shared buffer the new tokens take (from `past` on): NaN until written in place."""
    for _, name in share:
        feeds[name] = feeds[name].copy()
        feeds[name][:, :, past:] = np.nan


def unit_model(engine_model, unit: Unit, types: Types, phase: Phase, last_row_only: bool = False) -> UnitModel:
    """The unit's nodes as `engine_model` holds them (names absent there were fused into another: imegen's
    SiluMul keeps the second Mul's name) with what they read: initializers copied, folded values materialized,
    the rest graph inputs fed seeded data at the phase's shapes."""
    from onnx import helper, numpy_helper

    graph = engine_model.graph
    by_name = {n.name: n for n in graph.node}
    nodes = [by_name[name] for name in unit.nodes if name in by_name]
    inputs, outputs = _io_of(nodes)
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    folded = folded_nodes(graph)
    rng = np.random.default_rng([SEED, int(cache.sha256_hex(repr(unit.nodes).encode())[:8], 16)])
    index_users = {n.input[1] for n in nodes if n.op_type in ("Gather", "GatherBlockQuantized")}
    initializers, graph_inputs, feeds = [], [], {}
    for name in inputs:
        if name in inits:
            initializers.append(inits[name])
        elif name in producer and producer[name].name in folded:
            initializers.append(numpy_helper.from_array(_folded_value(graph, name), name))
        else:
            t = types.tensors[name]
            if last_row_only:
                t = Tensor(t.dtype, (1,) * (len(t.shape) - 1) + t.shape[-1:])
            bound = _index_bound(nodes, name, types) if name in index_users else None
            feeds[name] = _feed(name, t, types, rng, bound)
            graph_inputs.append(helper.make_tensor_value_info(name, t.dtype, list(t.shape)))
    wanted = [o for o in outputs if o in types.tensors]
    share = kv_sharing(nodes, feeds, wanted)
    _unwritten_rows_nan(feeds, share, phase.past)
    outs = [helper.make_tensor_value_info(o, types.tensors[o].dtype, None) for o in wanted]
    g = helper.make_graph(nodes, "unit", graph_inputs, outs, initializers)
    m = helper.make_model(g, opset_imports=list(engine_model.opset_import))
    m.ir_version = engine_model.ir_version
    return UnitModel(m, feeds, tuple(wanted), _digest(m, feeds, wanted, share), share)


def _index_bound(nodes, name: str, types: Types) -> int:
    """Indices a Gather reads stay inside its table."""
    users = [n for n in nodes if n.op_type in ("Gather", "GatherBlockQuantized") and n.input[1] == name]
    return min(types.tensors[n.input[0]].shape[0] for n in users)


def _folded_value(graph, name: str) -> np.ndarray:
    from onnx import numpy_helper

    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}

    def value(x):
        if x in inits:
            return numpy_helper.to_array(inits[x])
        node = producer[x]
        v = _np_rule(node, [value(i) for i in node.input])
        if v is None:
            raise ValueError(f"no numpy rule for the folded node {node.op_type} ({node.name})")
        return v

    return value(name)


def signature(unit_model_: UnitModel) -> str:
    """A distinct node: the unit's ops, domains and attributes with its inputs' types and shapes (names and
    weight values left out)."""
    from onnx import helper

    m = unit_model_.model
    parts = []
    for n in m.graph.node:
        attrs = sorted((a.name, repr(helper.get_attribute_value(a))) for a in n.attribute)
        parts.append((n.domain, n.op_type, tuple(attrs), len(n.input), len(n.output)))
    parts.append(tuple(sorted((t.data_type, tuple(t.dims)) for t in m.graph.initializer)))
    parts.append(tuple((str(v.dtype), v.shape) for v in unit_model_.feeds.values()))
    return cache.sha256_hex(repr(parts).encode())[:24]


@dataclass(frozen=True)
class DistinctNode:
    signature: str
    category: str
    multiplicity: float
    unit: Unit  # the first of its units
    stock: UnitModel  # the unit in stock ORT
    mine: UnitModel  # the unit in the engine (== stock when the engine leaves it alone)
    rows: int  # rows of its activations (new tokens; 1 for the prefill lm_head)

    @property
    def moved(self) -> bool:
        return self.mine.digest != self.stock.digest


def _same_nodes(a: UnitModel, b: UnitModel) -> bool:
    return [n.SerializeToString() for n in a.model.graph.node] == [n.SerializeToString() for n in b.model.graph.node]


def distinct_nodes(model, engines_models: dict[str, object], engine: str, phase: Phase,
                   target_layers: int = LAYERS) -> list[DistinctNode]:
    """The engine's distinct nodes at `phase` with their multiplicities in a `target_layers`-layer model.
    `engines_models`: the model as each engine runs it (engine_model), keyed by engine."""
    types = tensor_types(model, phase)
    layers = layer_count(model)
    if layers < 2:
        raise ValueError("enumerate a model of at least 2 layers (layer 0 differs from the others)")
    out: dict[str, DistinctNode] = {}
    for unit in partition(model, engines_models[engine]):
        if unit.folded:
            continue
        last = logits_rows_last_only(model, unit, phase)
        stock = unit_model(engines_models[STOCK], unit, types, phase, last)
        mine = stock if engine == STOCK else unit_model(engines_models[engine], unit, types, phase, last)
        if _same_nodes(mine, stock):  # the engine left the unit in ORT: the very same Run
            mine = stock
        sig = signature(mine)
        mult = multiplicity(unit, layers, target_layers)
        if sig in out:
            d = out[sig]
            out[sig] = DistinctNode(sig, d.category, d.multiplicity + mult, d.unit, d.stock, d.mine, d.rows)
        else:
            out[sig] = DistinctNode(sig, unit.category, mult, unit, stock, mine, 1 if last else phase.new)
    return list(out.values())


# ------------------------------------------------------------------------------------------ engines
def imegen_specs(model) -> list:
    """What `imegen ort-accelerate` derives for the model's MatMulNBits nodes (imegen's tuning table)."""
    from ....ort.accelerate import derive, inspect_model

    return derive(inspect_model(model), model_name="qwen2.5-0.5b genai form").specs


def engine_model(model, engine: str, specs: list):
    """The model as `engine` runs it (a copy), by the rewrites `imegen ort-accelerate` applies, without building a
    library: enough to enumerate (the account itself takes ort-accelerate's own outputs: setup)."""
    import onnx

    from ....ort.decoder_ops import rewrite_decoder_ops
    from ....ort.rewrite import fold_bias_adds, rewrite

    m = onnx.ModelProto()
    m.CopyFrom(model)
    if engine in (MATMUL, DECODER):
        fold_bias_adds(m, specs)
        if not any(d.moved for d in rewrite(m, specs)):
            raise RuntimeError("imegen's derived spec serves none of the model's MatMulNBits nodes")
    if engine == DECODER:
        refused = [str(d) for d in rewrite_decoder_ops(m) if not d.moved]
        if refused:
            raise RuntimeError(f"imegen's decoder operators refuse {refused[0]}")
    return m


def engine_models(model, specs: list) -> dict[str, object]:
    return {e: engine_model(model, e, specs) for e in ENGINES}


# ------------------------------------------------------------------------------------------ 4. counts
@dataclass(frozen=True)
class Counted:
    counts: dict[str, float]  # per Run (mean), every plugin counter
    outputs: dict[str, np.ndarray]
    check: dict
    version: str

    @property
    def instructions(self) -> float:
        return x60.total_instructions(self.counts)


def trivial_model(d: Path):
    """One Neg of one float: what any Run costs besides its nodes' work (ORT's executor, the runner's call)."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Neg", ["X"], ["Y"], name="neg")], "trivial",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(d / "trivial.onnx"))
    return d / "trivial.onnx", {"X": np.ones(1, np.float32)}, ["Y"], lambda out: {"worst": 0.0}


def count_overhead(library: Path | None = None) -> Counted:
    """ORT's per-Run overhead: the trivial model, counted as every unit is (the library loaded or not)."""
    rc = run_counts.cached_count_runs(("per-node-trivial", inspect.getsource(trivial_model)), trivial_model,
                                      threads=1, runs=OVERHEAD_RUNS, custom_ops=library)
    return Counted(mean_counts(rc.runs), rc.outputs, rc.check, rc.version)


def finite_check(outputs: dict) -> dict:
    bad = [k for k, v in outputs.items() if np.issubdtype(v.dtype, np.floating) and not np.isfinite(v).all()]
    if bad:
        raise RuntimeError(f"non-finite output {bad[0]}")
    return {"worst": 0.0}


def agreement(stock: dict, mine: dict, matmul: bool) -> float:
    """Worst disagreement of imegen's outputs with stock ORT's as a fraction of the allowed: ORT's level-4
    tolerance for MatMulNBits (int8 compute against stock's fp32), DECODER_RTOL for the decoder operators."""
    from ....ort.ort_check import TOLERANCE

    worst = 0.0
    for name, want in stock.items():
        got = mine[name]
        if got.shape != want.shape:
            return float("inf")
        if not np.issubdtype(want.dtype, np.floating):
            worst = max(worst, 0.0 if np.array_equal(got, want) else float("inf"))
            continue
        w, g = want.astype(np.float64), got.astype(np.float64)
        if matmul:
            a, r = TOLERANCE[4]
            frac = np.abs(g - w) / (a + r * np.abs(w))
        else:
            frac = np.abs(g - w) / (DECODER_RTOL * (1 + float(np.abs(w).max(initial=0))))
        worst = max(worst, float(frac.max(initial=0)) if np.isfinite(g).all() else float("inf"))
    return worst


def agreement_check(stock_outputs: dict, matmul: bool):
    def check(outputs: dict) -> dict:
        worst = agreement(stock_outputs, outputs, matmul)
        if not worst <= 1.0:
            raise RuntimeError(f"imegen's unit differs from stock ORT's: {worst:.3g} x the tolerance")
        return {"worst": worst}

    return check


def count_unit(um: UnitModel, library: Path | None = None, check=finite_check, check_key: str = "finite") -> Counted:
    """A unit's per-Run counts; a unit with a shared KV buffer run as genai runs it (shared_runs)."""
    key = ("per-node-unit", um.digest, check_key)
    if um.share:
        rc = shared_runs.cached_count_runs(key, lambda d: um.make(d, check), um.share, runs=1, custom_ops=library)
    else:
        rc = run_counts.cached_count_runs(key, lambda d: um.make(d, check), threads=1, runs=1, custom_ops=library)
    return Counted(mean_counts(rc.runs), rc.outputs, rc.check, rc.version)


def count_distinct(node: DistinctNode, library: Path | None) -> tuple[Counted, Counted | None]:
    """(the count the engine's account uses, stock's count when the engine moved the unit). An imegen unit
    is counted only once stock's outputs for the same feeds are known, and must agree with them."""
    stock = count_unit(node.stock)
    if not node.moved:
        return stock, None
    matmul = node.category == MATMUL_CATEGORY
    key = f"agrees with stock {node.stock.digest} ({'level 4' if matmul else f'rtol {DECODER_RTOL}'})"
    return count_unit(node.mine, library, agreement_check(stock.outputs, matmul), key), stock


def own_work(counts: dict[str, float], overhead: dict[str, float]) -> dict[str, float]:
    """The node's own work: its per-Run counters less the trivial model's, each floored at 0."""
    return {k: max(0.0, v - overhead.get(k, 0.0)) for k, v in counts.items()}


# ------------------------------------------------------------------------------------------ 5. time
def parallel_tasks(node_model, rows: int) -> int:
    """What a node can split over cores, in this engine (ASSUMPTIONS stated in METHOD): MatMulNBits 4 (MLAS's
    and imegen's 4 slices); imegen's GroupQueryAttention its attention kernel's row tiles, ORT's batch x heads; the
    attention mask's integer ops 1; the rest (norms, SiLU gate, bias Add, embedding) its rows."""
    ops = {(n.domain, n.op_type) for n in node_model.graph.node}
    if any(op == "MatMulNBits" for _, op in ops):
        return IME_CORES
    for domain, op in ops:
        if op == "GroupQueryAttention":
            a = _attrs(next(n for n in node_model.graph.node if n.op_type == op))
            if domain != IMEGEN:
                return a["num_heads"]
            # imegen's: tiles of the query rows sharing a KV head, R rows each (the derived attention kernel's tile)
            return a["kv_num_heads"] * math.ceil(a["num_heads"] // a["kv_num_heads"] * rows / attention_rows())
    if {op for _, op in ops} <= set(MASK_OPS):
        return 1
    return rows


def attention_rows() -> int:
    """Query rows per call of the attention kernel ort-accelerate derives (imegen/ort/attention_tuning.json)."""
    import json

    from ....ort.accelerate import ATTENTION_TUNING

    return int(json.loads(ATTENTION_TUNING.read_text())["tile"].split("x")[0])


def threads_for(node_model, rows: int) -> int:
    return max(1, min(IME_CORES, parallel_tasks(node_model, rows)))


def _initializer_bytes(node, inits: dict, rows: int, positions: int) -> float:
    """Initializer bytes a node reads: a gathered table only its rows, the rotary caches the positions used;
    a stock MatMulNBits' B, scales (and zero points, bias) are ORT's stored format (x60.ort_weight_bytes)."""
    from onnx import helper

    total = 0.0
    for i, name in enumerate(node.input):
        if name not in inits:
            continue
        t = inits[name]
        size = int(np.prod(t.dims, dtype=np.int64)) * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        if node.op_type in ("Gather", "GatherBlockQuantized") and i != 1:
            size = size / t.dims[0] * rows
        elif node.op_type == "GroupQueryAttention":  # its only constant inputs: the cos/sin caches
            size = size / t.dims[0] * min(positions, t.dims[0])
        total += size
    return total


def imegen_matmul_bytes(node, rows: int, specs: list) -> float:
    """DRAM bytes of an imegen MatMulNBits call: the serving kernel's own traffic (x60.dram_traffic: its packed
    weights, x60.packed_b_bytes, once per M block; A; A's workspace; C) and a SiLU gate's input (M x N fp32)."""
    from ....ort.serving import NodeNeeds, serve
    from ....plan import plan_kernel

    a = _attrs(node)
    ins = list(node.input) + [""] * 7
    need = NodeNeeds(bits=a.get("bits", 4), block=a["block_size"], accuracy_level=a.get("accuracy_level", 0),
                     asymmetric=bool(ins[3]), bias=bool(ins[5]), N=a["N"], K=a["K"])
    name = serve(specs, need).kernel_for(rows)
    spec = next(s for s in specs if s.name == name)
    gate = rows * a["N"] * 4 if ins[GATE_INPUT] else 0  # read once, beside the block of C it gates (in the cache)
    return x60.dram_traffic(plan_kernel(spec), rows, a["N"], a["K"]).dram + gate


def dram_bytes(um: UnitModel, outputs: dict[str, np.ndarray], rows: int, positions: int, specs: list) -> float:
    """DRAM bytes one Run of the unit moves (MODELED): an imegen MatMulNBits its kernel's traffic; any other
    unit its activation inputs and `outputs` and the initializers it reads; a shared KV buffer (attention, as
    genai runs it) its past rows read and the new tokens' `rows` written, no copy of the past."""
    g = um.model.graph
    mine = [n for n in g.node if n.op_type == "MatMulNBits" and n.domain == IMEGEN]
    if mine:
        if len(g.node) != 1:
            raise ValueError("an imegen MatMulNBits unit holds that one node")
        return float(imegen_matmul_bytes(mine[0], rows, specs))
    inits = {t.name: t for t in g.initializer}
    reads = sum(_initializer_bytes(n, inits, rows, positions) for n in g.node)
    past_of, new_of = {i for _, i in um.share}, {o for o, _ in um.share}

    def part(v: np.ndarray, taken: int) -> float:  # of a BNSH buffer, `taken` of its positions
        return v.nbytes * taken / v.shape[2]

    ins = sum(part(v, positions - rows) if k in past_of else v.nbytes for k, v in um.feeds.items())
    outs = sum(part(v, rows) if k in new_of else v.nbytes for k, v in outputs.items())
    return float(ins + reads + outs)


# ------------------------------------------------------------------------------------------ the account
@dataclass(frozen=True)
class NodeFigure:
    category: str
    signature: str
    multiplicity: float
    counts: dict[str, float]  # the node's own work per Run (overhead subtracted)
    threads: int
    dram_bytes: float
    check: float = 0.0  # imegen vs stock, fraction of the tolerance (0: stock's own node)

    @property
    def instructions(self) -> float:
        return x60.total_instructions(self.counts)

    @property
    def seconds(self) -> float:
        return modeled_time(self.counts, self.dram_bytes, self.threads)[0]

    @property
    def core_seconds(self) -> float:
        """The node's core-side time alone (DRAM ignored): its counts over the cores it runs on."""
        return x60.core_seconds(self.counts) / self.threads

    @property
    def bound(self) -> str:
        return modeled_time(self.counts, self.dram_bytes, self.threads)[1]


@dataclass(frozen=True)
class Account:
    engine: str
    phase: Phase
    nodes: tuple[NodeFigure, ...]
    version: str = ""

    @property
    def instructions(self) -> float:
        return sum(n.multiplicity * n.instructions for n in self.nodes)

    @property
    def seconds(self) -> float:
        return sum(n.multiplicity * n.seconds for n in self.nodes)

    @property
    def core_seconds(self) -> float:
        """Core-side time with DRAM ignored, node by node: what llama.cpp's whole-call figure is compared on."""
        return sum(n.multiplicity * n.core_seconds for n in self.nodes)

    def time_shares(self) -> dict[str, float]:
        """Each category's share of the modeled time, largest first."""
        total = self.seconds
        by: Counter = Counter()
        for n in self.nodes:
            by[n.category] += n.multiplicity * n.seconds
        return {k: v / total for k, v in by.most_common()}

    def instruction_shares(self) -> dict[str, float]:
        total = self.instructions
        by: Counter = Counter()
        for n in self.nodes:
            by[n.category] += n.multiplicity * n.instructions
        return {k: v / total for k, v in by.most_common()}

    @property
    def non_matmul_share(self) -> float:
        return 1.0 - self.time_shares().get(MATMUL_CATEGORY, 0.0)


@dataclass(frozen=True)
class Setup:
    """The model the account enumerates (the form at Qwen2.5-0.5B's sizes with ENUMERATED_LAYERS layers) and what
    `imegen ort-accelerate --flavour qemu` makes of it: the model per engine, the MatMulNBits kernel specs and each
    imegen engine's library."""

    model: object
    specs: list
    libraries: dict[str, Path]  # engine -> its libimegen_ort.so
    engines: dict[str, object]

    def library_for(self, engine: str, node: DistinctNode) -> Path | None:
        """A MatMulNBits node runs the same kernel in both imegen engines (one derived kernel spec; setup checks
        it), so it is counted once, in the matmul-only engine's library."""
        if engine == STOCK or not node.moved:
            return None
        return self.libraries[MATMUL if node.category == MATMUL_CATEGORY else engine]


ENUMERATED_LAYERS = 2  # layer 0 and one of the 23 identical others: the rest is multiplicity


def accelerated(model_path: Path, out_dir: Path, decoder: bool, log=None):
    """(rewritten model, MatMulNBits kernel specs, library) of `imegen ort-accelerate MODEL -o OUT --flavour qemu`
    [--matmul-only]."""
    import onnx

    from ....ir import load_specs
    from ....ort.accelerate import Options, accelerate

    outcome = accelerate(Options(model_path, out_dir, flavour="qemu", decoder=decoder))
    if log:
        log(f"ort-accelerate{'' if decoder else ' --matmul-only'}: {outcome.report.strip().splitlines()[-1]}")
    model = onnx.load(str(out_dir / "model.onnx"))
    if not any(n.domain == IMEGEN and n.op_type == "MatMulNBits" for n in model.graph.node):
        raise RuntimeError("imegen ort-accelerate served none of the model's MatMulNBits nodes")
    return model, load_specs(out_dir / "model.imegen"), built_library(out_dir / "libimegen_ort.so")


def built_library(copy: Path) -> Path:
    """The cached build a library was copied from (ort-accelerate copies it into its output folder):
    run_counts tells the IME emulator's code apart by the ime_emu.o beside the built library, so counted
    from a copy, every trapped vmadot's emulation would count as the kernel's work."""
    data = copy.read_bytes()
    for so in sorted(cache.root().glob("ort-customop-qemu-*/libimegen_ort*.so")):
        if so.stat().st_size == len(data) and so.read_bytes() == data and (so.parent / "ime_emu.o").exists():
            return so
    raise RuntimeError(f"no cached build of {copy} with its IME emulator beside it")


@contextmanager
def setup(config=None, log=None):
    """The Setup of a genai-form model (default: Qwen2.5-0.5B's sizes, ENUMERATED_LAYERS layers); its files live in
    a temporary folder for the `with` block."""
    import onnx

    from ....ort import genai_form

    c = config or genai_form.GenaiConfig(layers=ENUMERATED_LAYERS)
    if log:
        log(f"building the genai-form model ({c.layers} layers, hidden {c.hidden}, vocab {c.vocab})")
    model = genai_form.genai_model(c)
    with tempfile.TemporaryDirectory(prefix="imegen-per-node-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model, str(path))  # one file: ort-accelerate then writes one file too
        mm_model, specs, mm_lib = accelerated(path, Path(tmp) / "matmul", decoder=False, log=log)
        dec_model, dec_specs, dec_lib = accelerated(path, Path(tmp) / "decoder", decoder=True, log=log)
        if [x.describe() for x in specs] != [x.describe() for x in dec_specs]:
            raise RuntimeError("ort-accelerate derived other MatMulNBits kernels with and without --matmul-only")
        yield Setup(model, specs, {MATMUL: mm_lib, DECODER: dec_lib},
                    {STOCK: model, MATMUL: mm_model, DECODER: dec_model})


def figure(node: DistinctNode, counted: Counted, overhead: Counted, specs: list, phase: Phase,
           check: float = 0.0) -> NodeFigure:
    um = node.mine
    return NodeFigure(node.category, node.signature, node.multiplicity, own_work(counted.counts, overhead.counts),
                      threads_for(um.model, node.rows),
                      dram_bytes(um, counted.outputs, node.rows, phase.past + phase.new, specs), check)


def run_figure(overhead: Counted) -> NodeFigure:
    """The graph's one Run: ORT's executor and the call, once per token (or prefill), on one core."""
    return NodeFigure(RUN_CATEGORY, "run", 1.0, overhead.counts, 1, 0.0)


def account(s: Setup, engine: str, phase: Phase, log=None, target_layers: int = LAYERS) -> Account:
    """Count (cached) every distinct node of the engine's graph at `phase` and model its time."""
    overheads = {lib: count_overhead(lib) for lib in {None, s.libraries.get(engine)}}
    figures = []
    for node in distinct_nodes(s.model, s.engines, engine, phase, target_layers):
        if log:
            log(f"{engine} {phase.label}: {node.category} x{node.multiplicity:g} "
                f"({', '.join(n.op_type for n in node.mine.model.graph.node)}, rows {node.rows})")
        library = s.library_for(engine, node)
        if library not in overheads:
            overheads[library] = count_overhead(library)
        counted, _ = count_distinct(node, library)
        figures.append(figure(node, counted, overheads[library], s.specs, phase, counted.check.get("worst", 0.0)))
    figures.append(run_figure(overheads[s.libraries.get(engine)]))
    return Account(engine, phase, tuple(figures), overheads[None].version)


def accounts(s: Setup, log=None, engines=ENGINES, phases=PHASES) -> list[Account]:
    """Every engine x phase; cheap phases first, so an interrupted run leaves the most counts cached."""
    return [account(s, e, p, log) for p in phases for e in engines]
