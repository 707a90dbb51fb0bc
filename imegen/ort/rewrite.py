"""Move a model's com.microsoft MatMulNBits nodes that a spec serves into imegen's domain.

The rule is customop.serving_kernels (the library's own rule at session creation), plus what the
library needs from the graph: B, scales and zero points as constant initializers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import KernelSpec
from .customop import DOMAIN, NodeNeeds, serving_kernels

MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class NodeDecision:
    node: str
    moved: bool
    detail: str  # the serving kernels, or why the node stays

    def __str__(self) -> str:
        return f"{'moved' if self.moved else 'kept '} {self.node}: {self.detail}"


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def decide(node, initializers: dict, specs: list[KernelSpec]) -> NodeDecision:
    name = node.name or f"(unnamed, output {node.output[0]})"
    ins = list(node.input) + [""] * (6 - len(node.input))
    a = _attrs(node)
    for i, what in ((1, "B"), (2, "scales"), (3, "zero_points")):
        if ins[i] and ins[i] not in initializers:
            return NodeDecision(name, False, f"{what} ({ins[i]}) is not a constant initializer")
    zp = initializers.get(ins[3])
    need = NodeNeeds(bits=int(a.get("bits", 4)), block=int(a.get("block_size", 0)),
                     accuracy_level=int(a.get("accuracy_level", 0)), asymmetric=bool(ins[3]), bias=bool(ins[5]),
                     g_idx=bool(ins[4]), zero_points_uint8=zp is None or zp.data_type == 2)  # TensorProto.UINT8
    kernels, reason = serving_kernels(specs, need)
    return NodeDecision(name, bool(kernels), ", ".join(kernels) if kernels else reason)


def rewrite(model, specs: list[KernelSpec]):
    """Rewrite `model` (an onnx.ModelProto, modified in place) and return the per-node decisions."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    decisions = []
    for node in graph.node:
        if node.op_type == "MatMulNBits" and node.domain == MS_DOMAIN:
            d = decide(node, initializers, specs)
            if d.moved:
                node.domain = DOMAIN
            decisions.append(d)
    if any(d.moved for d in decisions) and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.add(domain=DOMAIN, version=1)
    return decisions
