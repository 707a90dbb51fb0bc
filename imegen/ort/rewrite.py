"""Move a model's com.microsoft MatMulNBits nodes that a spec serves into imegen's domain.

The rule is serving.serve (the library's own rule at session creation), plus what the library needs
from the graph: B, scales and zero points as constant initializers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import KernelSpec
from .customop import DOMAIN
from .serving import NodeNeeds, Serving, serve

MS_DOMAIN = "com.microsoft"
FLOAT, FLOAT16 = 1, 10  # onnx.TensorProto.FLOAT, FLOAT16
TYPE_NAMES = {11: "float64", 16: "bfloat16"}  # other types T could name (T is the scales' type)
UINT8 = 2  # onnx.TensorProto.UINT8
INT8_LEVEL = 4


@dataclass(frozen=True)
class NodeDecision:
    node: str
    moved: bool
    detail: str  # the serving kernels, or why the node stays
    need: NodeNeeds | None = None  # None: the node's inputs ruled it out before any kernel was asked
    serving: Serving | None = None
    level_raised: bool = False  # accuracy_level set to 4 in the rewritten model (int8 compute asked for)

    def __str__(self) -> str:
        return f"{'moved' if self.moved else 'kept '} {self.node}: {self.detail}"


def node_attributes(node) -> dict:
    """A node's attributes by name, as Python values."""
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def node_name(node) -> str:
    return node.name or f"(unnamed, output {node.output[0]})"


def constant_initializers(graph) -> dict:
    """The graph's initializers ORT treats as constants: not those a graph input of the same name may
    override (ORT hands a custom op no constant for them, so the library could not pack them)."""
    inputs = {i.name for i in graph.input}
    return {t.name: t for t in graph.initializer if t.name not in inputs}


def node_needs(node, initializers: dict) -> tuple[NodeNeeds | None, str]:
    """What the node asks of a kernel, or (None, why the library cannot take it whatever the spec)."""
    ins = list(node.input) + [""] * (6 - len(node.input))
    for i, what in ((1, "B"), (2, "scales")):
        if not ins[i]:
            return None, f"it has no {what} input"
    for i, what in ((1, "B"), (2, "scales"), (3, "zero_points")):
        if ins[i] and ins[i] not in initializers:
            return None, f"{what} ({ins[i]}) is not a constant initializer"
    scales_type = initializers[ins[2]].data_type
    if scales_type not in (FLOAT, FLOAT16):
        return None, f"its scales are {TYPE_NAMES.get(scales_type, f'type {scales_type}')}: imegen's kernels take float32"
    a = node_attributes(node)
    zp = initializers.get(ins[3])
    return NodeNeeds(bits=int(a.get("bits", 4)), block=int(a.get("block_size", 0)),
                     accuracy_level=int(a.get("accuracy_level", 0)), asymmetric=bool(ins[3]), bias=bool(ins[5]),
                     N=int(a.get("N", 0)), K=int(a.get("K", 0)), g_idx=bool(ins[4]),
                     zero_points_uint8=zp is None or zp.data_type == UINT8,
                     float16=initializers[ins[2]].data_type == FLOAT16), ""


def decide(node, initializers: dict, specs: list[KernelSpec], *, int8_compute: bool = False) -> NodeDecision:
    """Whether the library serves `node`; `int8_compute` asks levels 0-3 for int8 compute (level 4)."""
    name = node_name(node)
    need, why = node_needs(node, initializers)
    if need is None:
        return NodeDecision(name, False, why)
    raised = int8_compute and need.accuracy_level != INT8_LEVEL
    if raised:
        need = NodeNeeds(**{**need.__dict__, "accuracy_level": INT8_LEVEL})
    serving = serve(specs, need)
    detail = serving.describe() if serving.ok else serving.reason
    return NodeDecision(name, serving.ok, detail, need, serving, raised and serving.ok)


def _set_level(node, level: int) -> None:
    from onnx import helper

    kept = [a for a in node.attribute if a.name != "accuracy_level"]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("accuracy_level", level)])


def rewrite(model, specs: list[KernelSpec], *, int8_compute: bool = False) -> list[NodeDecision]:
    """Rewrite `model` (an onnx.ModelProto, modified in place) and return the per-node decisions.
    `int8_compute`: nodes at accuracy_level 0-3 are moved with accuracy_level 4 (int8 compute, IME),
    which changes their numerics from ORT's fp32 contract."""
    graph = model.graph
    initializers = constant_initializers(graph)
    decisions = []
    for node in graph.node:
        if node.op_type == "MatMulNBits" and node.domain == MS_DOMAIN:
            d = decide(node, initializers, specs, int8_compute=int8_compute)
            if d.moved:
                node.domain = DOMAIN
                if d.level_raised:
                    _set_level(node, INT8_LEVEL)
            decisions.append(d)
    if any(d.moved for d in decisions) and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.add(domain=DOMAIN, version=1)
    return decisions


def consumers(graph) -> dict[str, list]:
    """Tensor name -> the nodes of `graph` that read it."""
    users: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            if i:
                users.setdefault(i, []).append(n)
    return users


def bias_add(graph, node, users: dict, initializers: dict):
    """(the Add after `node` that adds a constant [N] float32 bias to its output, the bias name) or None."""
    out = node.output[0]
    if len(users.get(out, [])) != 1 or out in {o.name for o in graph.output}:
        return None
    add = users[out][0]
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2:
        return None
    bias = add.input[1] if add.input[0] == out else add.input[0]
    t = initializers.get(bias)
    if t is None or t.data_type != FLOAT or list(t.dims) != [int(node_attributes(node).get("N", -1))]:
        return None
    return add, bias


def fold_bias_adds(model, specs: list[KernelSpec] | None = None) -> list[str]:
    """What ORT's own optimizer does to a com.microsoft MatMulNBits followed by an Add of a constant [N] bias (its
    MatMulNBitsFusion), done in the file: the bias becomes the node's bias input and the Add goes, so imegen's
    kernel adds it in its epilogue instead of a separate pass over the output (onnxruntime-genai exports the
    q/k/v biases this way). `specs`: fold only where they serve the node with a bias (None: a spec will be
    derived for the folded model). Returns the names of the nodes that took a bias."""
    graph = model.graph
    initializers = constant_initializers(graph)
    users = consumers(graph)
    folded = []
    for node in list(graph.node):
        if node.op_type != "MatMulNBits" or node.domain != MS_DOMAIN or (len(node.input) > 5 and node.input[5]):
            continue
        found = bias_add(graph, node, users, initializers)
        if found is None:
            continue
        if specs is not None:
            need, _ = node_needs(node, initializers)
            if need is None or not serve(specs, NodeNeeds(**{**need.__dict__, "bias": True})).ok:
                continue
        add, bias = found
        inputs = list(node.input) + [""] * (6 - len(node.input))
        inputs[5] = bias
        del node.input[:]
        node.input.extend(inputs)
        node.output[0] = add.output[0]
        graph.node.remove(add)
        folded.append(node_name(node))
    return folded


def lower_to_fp32(model, specs: list[KernelSpec]) -> set[int]:
    """What `ort-accelerate --compute fp32` does to a model: level-4 nodes the specs serve at fp32 compute get
    accuracy_level 0 (ORT's fp32 contract). Returns their indices among the model's MatMulNBits nodes."""
    initializers = constant_initializers(model.graph)
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits" and n.domain == MS_DOMAIN]
    lowered = set()
    for i, node in enumerate(nodes):
        need, _ = node_needs(node, initializers)
        if need is not None and need.accuracy_level == INT8_LEVEL and \
                serve(specs, NodeNeeds(**{**need.__dict__, "accuracy_level": 0})).ok:
            _set_level(node, 0)
            lowered.add(i)
    return lowered
