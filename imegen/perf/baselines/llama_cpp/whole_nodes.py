"""llama.cpp's whole model node by node, accounted as the ORT engines are (baselines/onnxruntime/per_node.py):
each ggml node's instructions counted on their own (whole_driver --per-node: a plugin region per node, cut by
llama.cpp's graph-eval callback), its DRAM bytes from its tensors, its time max(core / its threads, DRAM /
bandwidth), summed over the graph (ggml runs its nodes one after another, a barrier between them, every
node's output stored in memory).

The driver's node lines name each node's op (ggml_op_desc; "RMS_NORM+MUL" for the pair ggml-cpu fuses and the
driver keeps together) and its tensors, output first: NAME:TYPE:TYPE_SIZE:BLOCK:NE0,NE1,NE2,NE3:NBYTES:FLAGS.

DRAM bytes of a node (MODELED, the rules per_node.py applies to ORT's nodes): every tensor it reads and the one it
writes, each as its elements take in their type (a view: the elements it covers; weights as stored, Q4_0 18 bytes
per 32), except: GET_ROWS reads only the rows it gathers (the embedding: the prompt's rows); SET_ROWS writes only
the rows it sets (the new tokens' K or V rows into the cache) and does not read the cache; FLASH_ATTN_EXT reads of
K and V only the cells its mask lets some query attend (the driver's "kv N": ggml's CPU flash attention skips a
masked cell without reading it), the mask whole.

Threads a node runs on (ASSUMPTION, the ORT engines' rule: min(4, its parallel tasks), ggml's own split): MUL_MAT 4
(it splits the weight rows); FLASH_ATTN_EXT 4 (heads x queries, at decode the KV cells in chunks per thread);
every other op min(4, the rows ggml splits it by: its output's rows, SET_ROWS the rows it sets), so 1 at decode
for the norms, adds, SWIGLU and row gathers, 4 for ROPE (heads x tokens).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ...model import x60

CALL_CATEGORY = "llama.cpp call"  # graph building or reuse, inputs, the scheduler, the logits: one core
MATMUL = "MUL_MAT"


@dataclass(frozen=True)
class Tensor:
    name: str
    type: str
    type_size: int
    block: int
    ne: tuple[int, int, int, int]
    nbytes: int
    flags: str  # w: in the model's weight buffers, v: a view, -: neither

    @property
    def rows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def row_bytes(self) -> int:
        return self.ne[0] // self.block * self.type_size

    @property
    def element_bytes(self) -> int:
        """What its elements take in its type (a view's extent in memory may be larger: ggml_nbytes)."""
        return self.row_bytes * self.rows

    @property
    def weight(self) -> bool:
        return self.flags == "w"


def parse_tensor(field: str) -> Tensor:
    name, type_, size, block, ne, nbytes, flags = field.rsplit(":", 6)
    dims = tuple(int(x) for x in ne.split(","))
    if len(dims) != 4:
        raise ValueError(f"a tensor with {len(dims)} dimensions: {field}")
    return Tensor(name, type_, int(size), int(block), dims, int(nbytes), flags)


@dataclass(frozen=True)
class Node:
    op: str
    dst: Tensor
    srcs: tuple[Tensor, ...]
    kv: int | None = None  # FLASH_ATTN_EXT: KV cells some query attends

    @property
    def category(self) -> str:
        if self.op == "GET_ROWS" and self.srcs[0].weight:
            return "GET_ROWS (embedding)"
        if self.op == "ADD" and any(s.weight for s in self.srcs):
            return "ADD (bias)"
        return self.op

    @property
    def shape_key(self) -> tuple:
        """What the node's work depends on: op and the shapes and types of its tensors."""
        return (self.op, self.kv, *((t.type, t.ne) for t in (self.dst, *self.srcs)))


def parse_node(line: str) -> Node:
    """A driver "node OP TENSOR... [kv N]" line."""
    fields = line.split()
    if fields[0] != "node" or len(fields) < 3:
        raise ValueError(f"not a node line: {line[:80]!r}")
    kv = None
    if fields[-2] == "kv":
        kv, fields = int(fields[-1]), fields[:-2]
    tensors = [parse_tensor(f) for f in fields[2:]]
    return Node(fields[1], tensors[0], tuple(tensors[1:]), kv)


def dram_bytes(node: Node) -> int:
    """DRAM bytes the node moves (module docstring)."""
    if node.op == "GET_ROWS":
        table, index = node.srcs[0], node.srcs[1]  # one row gathered per index
        return table.row_bytes * (index.element_bytes // index.type_size) + index.element_bytes + node.dst.element_bytes
    if node.op == "SET_ROWS":
        rows, index = node.srcs[0], node.srcs[1]  # srcs[2]: the cache itself, not read
        return rows.element_bytes + index.element_bytes + node.dst.row_bytes * rows.rows
    if node.op == "FLASH_ATTN_EXT":
        if node.kv is None:
            raise ValueError("a FLASH_ATTN_EXT node line without its attended KV cells")
        q, k, v, *rest = node.srcs
        kv = sum(t.row_bytes * node.kv * t.ne[2] * t.ne[3] for t in (k, v))
        return q.element_bytes + kv + sum(t.element_bytes for t in rest) + node.dst.element_bytes
    return node.dst.element_bytes + sum(t.element_bytes for t in node.srcs)


def threads(node: Node, cores: int = x60.X60.ime_cores) -> int:
    """Cores the node runs on (module docstring)."""
    if node.op in (MATMUL, "FLASH_ATTN_EXT"):
        return cores
    rows = node.srcs[0].rows if node.op == "SET_ROWS" else node.dst.rows
    return max(1, min(cores, rows))


# ------------------------------------------------------------------------------------------ regions of a call
@dataclass(frozen=True)
class CallRegions:
    """One llama_decode counted node by node: `nodes` (each node's region with the scheduler's gap before it),
    `head` (the call up to its first node: graph building or reuse, inputs) and `tail` (after the last node)."""

    nodes: tuple[tuple[Node, dict[str, float]], ...]
    head: dict[str, float]
    tail: dict[str, float]

    def total(self) -> dict[str, float]:
        return add(self.head, self.tail, *(c for _, c in self.nodes))


def add(*counts: dict[str, float]) -> dict[str, float]:
    out: Counter = Counter()
    for c in counts:
        out.update(c)
    return dict(out)


def call_regions(regions: list[dict], labels: list[str]) -> CallRegions:
    """The regions of one call, labelled as the driver prints them: gap, node, gap, node, ..., call (its tail)."""
    if not labels or labels[0] != "gap" or not labels[-1].startswith("call"):
        raise ValueError("a per-node call starts with a gap and ends with its call line")
    nodes, gap = [], None
    for region, label in zip(regions[1:-1], labels[1:-1]):
        if label == "gap":
            gap = region
        elif gap is not None or not nodes:
            nodes.append((parse_node(label), add(region, gap or {})))
            gap = None
        else:
            raise ValueError("two nodes without a gap between them")
    return CallRegions(tuple(nodes), dict(regions[0]), dict(regions[-1]))


def without_observation(call: CallRegions, whole: dict[str, float]) -> tuple[CallRegions, dict[str, float]]:
    """`call` less the cost of observing it: the counts it has beyond `whole` (the same call counted as one region)
    are shared evenly among its nodes and taken off each, counter by counter, so the nodes, head and tail add up to
    `whole` exactly. Returns that call and the cost per node taken off."""
    extra = {k: v - whole.get(k, 0) for k, v in call.total().items()}
    extra.update({k: -v for k, v in whole.items() if k not in extra})
    per_node = {k: v / len(call.nodes) for k, v in extra.items() if v}
    nodes = tuple((n, {k: c.get(k, 0) - per_node.get(k, 0) for k in set(c) | set(per_node)}) for n, c in call.nodes)
    return CallRegions(nodes, call.head, call.tail), per_node


# ------------------------------------------------------------------------------------------ 1 and 2 layers -> L
@dataclass(frozen=True)
class NodeCount:
    node: Node
    counts: dict[str, float]
    multiplicity: float


def layer_block(one: CallRegions, two: CallRegions) -> tuple[int, int]:
    """Where the 2-layer call's extra layer lies: nodes [start, stop) of `two`, such that `two` without them is `one`
    node for node (same ops and shapes). ggml builds layer 0 first; the last layer alone runs its FFN on the
    output rows, so the extra, full layer is the first one."""
    n1, n2 = len(one.nodes), len(two.nodes)
    if n2 <= n1:
        raise ValueError(f"the 2-layer graph has {n2} nodes, the 1-layer one {n1}")
    keys1 = [n.shape_key for n, _ in one.nodes]
    keys2 = [n.shape_key for n, _ in two.nodes]
    for start in range(n1 + 1):
        stop = start + n2 - n1
        if keys2[:start] + keys2[stop:] == keys1:
            return start, stop
    raise ValueError("the 2-layer graph is not the 1-layer one with a layer inserted")


def extrapolate(one: CallRegions, two: CallRegions, layers: int) -> tuple[list[NodeCount], dict[str, float]]:
    """The call at `layers` layers from its 1- and 2-layer counts: the 2-layer call's extra layer x (layers - 1),
    every other node as the 1-layer call counts it, and the call's own counts (head + tail) on the line through
    its 1- and 2-layer counts, plus (layers - 1) x what the other nodes count more in the 2-layer call than in
    the 1-layer one. Their work is the same in both; what differs is how the observation's mean cost shares out
    (without_observation), and (layers - 1) x that on each small node would swamp it, so it goes to the call.
    Summed, this is total(L) = C1 + (L - 1)(C2 - C1), counter by counter. Returns the nodes and the call's own
    counts."""
    start, stop = layer_block(one, two)
    rest = two.nodes[:start] + two.nodes[stop:]
    grow = layers - 1
    nodes = [NodeCount(n1, c1, 1.0) for n1, c1 in one.nodes]
    nodes += [NodeCount(n, c, float(grow)) for n, c in two.nodes[start:stop]]
    c1, c2 = add(one.head, one.tail, *(c for _, c in one.nodes)), add(two.head, two.tail, *(c for _, c in rest))
    call = {k: one.head.get(k, 0) + one.tail.get(k, 0) + grow * (c2.get(k, 0) - c1.get(k, 0)) for k in set(c1) | set(c2)}
    return nodes, call


# ------------------------------------------------------------------------------------------ the model
def modeled_seconds(counts: dict[str, float], dram: float, cores: int) -> tuple[float, float]:
    """(max(core / cores, DRAM / bandwidth), core / cores): one node's MODELED time and its core side alone.
    Counters below zero (what taking off the observation's mean cost can leave) count as zero."""
    core = x60.core_seconds({k: max(v, 0.0) for k, v in counts.items()}) / cores
    return max(core, dram / x60.X60.dram_effective), core


@dataclass(frozen=True)
class OpFigure:
    """One op category of the account: its nodes' instructions, DRAM bytes, MODELED time and core time."""

    category: str
    nodes: float  # multiplicities included
    instructions: float
    dram_bytes: float
    seconds: float
    core_seconds: float


def account(nodes: list[NodeCount], call: dict[str, float]) -> list[OpFigure]:
    """By op category (largest time first), the call's own counts last (one core, no DRAM charged)."""
    by: dict[str, list[float]] = {}
    for nc in nodes:
        seconds, core = modeled_seconds(nc.counts, dram_bytes(nc.node), threads(nc.node))
        f = by.setdefault(nc.node.category, [0.0] * 5)
        for i, v in enumerate((1, x60.total_instructions(nc.counts), dram_bytes(nc.node), seconds, core)):
            f[i] += nc.multiplicity * v
    figures = sorted((OpFigure(k, *v) for k, v in by.items()), key=lambda f: -f.seconds)
    call_s = x60.core_seconds({k: max(v, 0.0) for k, v in call.items()})
    return figures + [OpFigure(CALL_CATEGORY, 1, x60.total_instructions(call), 0.0, call_s, call_s)]
