"""`imegen ort-model-check`: a user's ONNX model in stock ORT vs ORT + imegen's library.

Both sides are the same real riscv64 onnxruntime (Debian's build) under QEMU (RiscvSession): the
original model, and the model rewritten by imegen.ort.rewrite with the qemu-flavour custom-op
library registered. Each output must agree within ORT's operator-test tolerance
(ort_check.TOLERANCE) of the strictest accuracy level among the moved nodes (level 4 if any moved
node computes in int8, else level 0).

At level 4 that per-operator tolerance is too strict for a whole model: Debian's riscv64 ORT has no
int8 MLAS path and computes level-4 MatMulNBits in fp32, while imegen computes in int8 as ORT's own
level 4 does on x86 (MLAS CompInt8), and int8 rounding accumulates over the layers. So at level 4
the original model also runs in the host's onnxruntime (the peer: its CPU provider, whose level 4
really is int8) on the same feeds and the same steps, and an output beyond the tolerance still
passes when imegen's deviation from stock is no larger than the peer's own: its max |diff| at most
PEER_MAX_FACTOR and its RMS diff at most PEER_RMS_FACTOR times the peer's (see compare_outputs).
Without an importable host onnxruntime the per-operator tolerance alone decides, and the report
says so.

A decoder (a graph input named `input_ids`; onnxruntime-genai's and optimum's exports) runs the way
a generation loop runs it: a prefill step of `seq` tokens after a KV cache of `past` positions
(matmuls with M = seq: the gemm kernels), then decode steps of one token (M = 1: the gemv kernels),
each fed the argmax of the previous step's logits as its token. Where every past_key_values.* input is
GroupQueryAttention's past and its present.* output that node's present, the cache is held as
onnxruntime-genai holds it on CPU (past_present_share_buffer): one buffer per past input, as long as
every position the check decodes, bound through an IoBinding as both the past input and the present
output, so the operator writes the new tokens' rows in place; the rows not yet written hold NaN, so an
operator reading one gives NaN outputs, and one writing a row it should not fails that output. Other
decoders feed each step's present.* outputs back as the next past_key_values.* (a cache growing by the
new tokens); the report says which way it decoded. Every output of every step is compared (of a
shared buffer, the rows that hold positions). Other models run once on the given or random inputs.
When the spec serves no MatMulNBits node nothing is run and the check fails: a PASS must mean
imegen's kernels computed something.
"""

from __future__ import annotations

import platform
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..ir import KernelSpec
from .customop import build_library, parse_decoder_stats, parse_stats
from .decoder_ops import GQA_PRESENT_OF_PAST, MS_DOMAIN, DecoderDecision, rewrite_decoder_ops
from .ort_check import TOLERANCE, tolerance_text
from .rewrite import NodeDecision, fold_bias_adds, lower_to_fp32, node_attributes, rewrite
from .external_data import ModelFileError, load_graph
from .riscv import DTYPES, RiscvSession

FLOAT_DTYPES = (np.float32, np.float64, np.float16)
# Symbolic dims a decoder's step sets (batch 1, --seq / --past), not --dim.
BATCH_DIMS = ("batch_size", "batch")
STEP_DIMS = {"sequence_length", "past_sequence_length", "total_sequence_length"}
DEFAULT_SEQ = 5  # > 1 for the gemm kernels, not a multiple of a 2- or 4-row tile: a tail of rows
DEFAULT_PAST = 7  # a KV cache already holding positions, of odd length
# Beyond the level-4 tolerance, how much further from stock imegen may be than the peer (the host's onnxruntime,
# level 4 in int8). Max |diff| catches one wrong element, the RMS diff a small error spread over all of them.
# Measured (imegen / peer): on the tiny genai models the two agree to ~1e-6 except where a rounding tie flips
# (worst 1.37 max, 1.12 RMS); on a full-size 24-layer Qwen2.5-0.5B int4 export they part after a few layers and
# stay alike in size (worst 1.31 max over 49 outputs x 3 steps, on a 1,536-element KV cache output whose max is
# a noisy statistic; 1.09 RMS; the logits 1.00-1.02 both). The margins are over those.
PEER_MAX_FACTOR = 2.0
PEER_RMS_FACTOR = 1.5


class ModelCheckError(ValueError):
    """The model or the options cannot be checked as asked (a user error: exit 2)."""


@dataclass(frozen=True)
class Deviation:
    """How far one side's float output is from stock ORT's."""

    max_abs: float
    rms: float
    worst: float  # max |diff| / tolerance


@dataclass(frozen=True)
class OutputAgreement:
    name: str
    max_abs: float  # max |imegen - stock|
    worst: float  # max |imegen - stock| / tolerance
    ok: bool
    elements: int = 0
    rms: float = 0.0  # RMS of imegen - stock
    peer: Deviation | None = None  # the peer (host ORT, level 4) vs stock, when it ran
    note: str = ""  # what else failed it (a shared KV buffer's row written that holds no position yet)

    @property
    def within_tolerance(self) -> bool:
        return self.worst <= 1.0

    @property
    def ratios(self) -> tuple[float, float] | None:
        """(max |diff|, RMS diff) of imegen over the peer's, both against stock."""
        if self.peer is None:
            return None
        return _ratio(self.max_abs, self.peer.max_abs), _ratio(self.rms, self.peer.rms)

    @property
    def like_peer(self) -> bool:
        """imegen no further from stock than the peer's own level 4, within the factors."""
        r = self.ratios
        if r is None or not (np.isfinite(self.peer.max_abs) and np.isfinite(self.peer.rms)):
            return False  # a peer output with a NaN (or of another shape) vouches for nothing
        return r[0] <= PEER_MAX_FACTOR and r[1] <= PEER_RMS_FACTOR


def _ratio(a: float, b: float) -> float:
    if a == 0:
        return 0.0
    r = a / b if b > 0 else np.inf
    return float(r) if np.isfinite(r) else np.inf


@dataclass(frozen=True)
class Step:
    """One Run of both models (and the peer's) on the same feeds."""

    label: str  # e.g. "prefill: 5 tokens at past 7"
    outputs: tuple[OutputAgreement, ...]
    tokens: tuple[int, int] | None = None  # (stock, imegen) argmax of the last logits row
    peer_token: int | None = None  # the peer's argmax of its last logits row

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)


@dataclass
class ModelCheck:
    ort_version: str
    decisions: list[NodeDecision]
    level: int
    steps: list[Step] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    generate: int = 0  # greedy tokens asked for (0: none)
    kernels: tuple[str, ...] = ()  # the library's kernel names (the stats' other counters are not calls)
    peak_rss: tuple[int, int] = (0, 0)  # bytes: the stock and the imegen session's riscv64 process at the end
    peer: str = ""  # the peer that ran, e.g. "onnxruntime 1.32.0 on x86_64" ("": none)
    peer_note: str = ""  # at level 4, why no peer ran (or stopped)
    decoder: list[DecoderDecision] = field(default_factory=list)  # the decoder's other nodes (decoder_ops.py)
    decoder_calls: dict[str, tuple[int, int]] = field(default_factory=dict)  # operator -> (live nodes, calls)
    kv_cache: str = ""  # how the decode steps held the KV cache (a report line; "": no cache fed back)

    @property
    def moved(self) -> int:
        return sum(d.moved for d in self.decisions)

    @property
    def outputs(self) -> list[OutputAgreement]:
        return [o for s in self.steps for o in s.outputs]

    @property
    def generated(self) -> tuple[list[int], list[int]]:
        """The greedy tokens (stock, imegen), up to and including the first disagreement."""
        pairs = [s.tokens for s in self.steps[: self.generate] if s.tokens] if self.generate else []
        return [p[0] for p in pairs], [p[1] for p in pairs]

    @property
    def peer_generated(self) -> list[int]:
        """The peer's argmax at the same steps (it decodes the same tokens as the riscv64 sides, so up to its
        first difference from stock these are its own greedy tokens)."""
        steps = [s for s in self.steps[: self.generate] if s.tokens] if self.generate else []
        return [s.peer_token for s in steps if s.peer_token is not None]

    @property
    def tokens_agree(self) -> bool:
        stock, mine = self.generated
        return stock == mine and len(stock) == self.generate

    @property
    def kernels_ran(self) -> bool:
        """Whether the library's counters show a call of one of its kernels."""
        return any(self.stats.get(k, 0) for k in self.kernels)

    @property
    def idle_decoder_ops(self) -> list[str]:
        """Decoder operators some node was moved to that no run called."""
        moved = dict.fromkeys(d.op for d in self.decoder if d.moved)
        return [op for op in moved if not self.decoder_calls.get(op, (0, 0))[1]]

    @property
    def ok(self) -> bool:
        return (self.moved > 0 and bool(self.outputs) and all(o.ok for o in self.outputs) and self.kernels_ran
                and not self.idle_decoder_ops and (not self.generate or self.tokens_agree))

    def report(self) -> str:
        lines = [f"onnxruntime {self.ort_version} (riscv64, under QEMU): stock vs imegen custom ops",
                 f"MatMulNBits nodes: {self.moved} of {len(self.decisions)} rewritten"]
        lines += [f"  {d}" for d in self.decisions]
        if self.decoder:
            lines.append(f"decoder nodes: {sum(d.moved for d in self.decoder)} of {len(self.decoder)} rewritten")
            lines += [f"  {d}" for d in self.decoder]
        if not self.moved:
            lines += [f"nothing was checked: 0 of {len(self.decisions)} MatMulNBits nodes rewritten", "FAIL"]
            return "\n".join(lines)
        lines += [self.kv_cache] if self.kv_cache else []
        lines += self._criterion_lines()
        for step in self.steps:
            lines += _step_lines(step, multi=len(self.steps) > 1, peer=bool(self.peer))
        lines += self._generation_lines()
        elements = sum(o.elements for o in self.outputs)
        lines.append(f"compared {len(self.outputs)} outputs in {len(self.steps)} step{'s' * (len(self.steps) != 1)}, "
                     f"{elements:,} elements")
        calls = ", ".join(f"{k} {self.stats[k]}" for k in self.kernels if self.stats.get(k))
        lines.append(f"imegen kernel calls: {calls or 'none'}"
                     + (f"; emulated vmadots {self.stats['vmadots']}" if "vmadots" in self.stats else ""))
        if self.decoder_calls:
            lines.append("imegen decoder operator calls: " + ", ".join(f"{op} {calls}" for op, (_, calls)
                                                                     in self.decoder_calls.items()))
        if self.idle_decoder_ops:
            lines.append(f"nothing was checked for {', '.join(self.idle_decoder_ops)}: no run called it")
        idle = self.idle_kernels()
        if idle:
            lines.append(f"not exercised by these runs (their rows of A, or a thread without IME, never came): "
                         f"{', '.join(idle)}")
        lines += self._memory_lines()
        if not self.kernels_ran:
            lines.append("nothing was checked: the rewritten nodes never called an imegen kernel")
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)

    def idle_kernels(self) -> list[str]:
        """Kernels a rewritten node may run (its rows, a thread without IME) that no run here called."""
        may = dict.fromkeys(k for d in self.decisions if d.moved and d.serving for k in d.serving.names())
        return [k for k in may if not self.stats.get(k)] if self.stats else []

    def _criterion_lines(self) -> list[str]:
        tolerance = f"tolerance (accuracy_level {self.level}): {tolerance_text(self.level)} (ORT's per-operator test)"
        if not self.peer:
            return [tolerance] + ([f"  {self.peer_note}"] if self.peer_note else [])
        lines = [tolerance + ", or beyond it ORT's own level-4 deviation:",
                 f"  max |diff| <= {PEER_MAX_FACTOR:g}x and RMS diff <= {PEER_RMS_FACTOR:g}x those of the peer, "
                 f"{self.peer} (the host's ORT: its level 4",
                 "  computes in int8, as imegen's kernels do; stock riscv64 ORT computes it in fp32), same inputs"]
        lines += [f"  {self.peer_note}"] if self.peer_note else []
        column = "max |diff| (of tol)"
        return lines + [f"  {'':24s} {'imegen vs stock':>22s}  {'peer vs stock':>22s}  {'imegen/peer':>13s}",
                        f"  {'':24s} {column:>22s}  {column:>22s}  {'max':>6s} {'rms':>6s}"]

    def _generation_lines(self) -> list[str]:
        if not self.generate:
            return []
        stock, mine = self.generated
        peer = self.peer_generated
        if self.tokens_agree:
            verdict = "identical"
        elif stock == mine:
            verdict = f"only {len(stock)} of {self.generate} tokens"
        else:
            at = _first_difference(stock, mine)
            verdict = f"DIFFER at token {at + 1}"
            if at < len(peer) and peer[at] != stock[at]:
                verdict += " (a near-tie: the peer's level 4 leaves stock's token there too)"
        width = len(str(self.generate)) + 17
        lines = [f"greedy tokens ({self.generate}): stock {stock}", f"{'':{width}}imegen {mine}  {verdict}"]
        if peer and len(peer) == len(stock):
            at = _first_difference(stock, peer)
            lines.append(f"{'':{width + 2}}peer {peer}" + (f"  differs from stock at token {at + 1}: its level-4 "
                                                            f"rounding breaks a near-tie the other way"
                                                            if peer != stock else "  identical"))
        return lines

    def _memory_lines(self) -> list[str]:
        stock, mine = self.peak_rss
        if not stock:
            return []
        mib = 1 << 20
        return [f"peak resident memory (QEMU process, after the last run): stock {stock / mib:.1f} MiB, imegen "
                f"{mine / mib:.1f} MiB ({mine / stock:.2f}x); B packed by the library {self.stats.get('packed_bytes', 0) / mib:.1f} MiB"]


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _verdict(o: OutputAgreement) -> str:
    if o.ok and o.within_tolerance:
        return "PASS"
    if o.ok:
        return "PASS (beyond tolerance, as the peer's level 4)"
    if o.ratios is None:
        return "FAIL"
    return "FAIL (beyond tolerance and further from stock than the peer)"


def _agreement_line(name: str, o: OutputAgreement, peer: bool, verdict: str | None = None) -> str:
    verdict = (verdict or _verdict(o)) + (f": {o.note}" if o.note else "")
    if not peer:
        return f"  {name:24s} max |diff| {o.max_abs:.3g}  {o.worst:.3f} of tolerance  {verdict}"
    theirs, (rmax, rrms) = ("-", ("-", "-")) if o.peer is None else (
        f"{o.peer.max_abs:.3g} ({o.peer.worst:.3f})", (f"{o.ratios[0]:.2f}", f"{o.ratios[1]:.2f}"))
    return f"  {name:24s} {f'{o.max_abs:.3g} ({o.worst:.3f})':>22s}  {theirs:>22s}  {rmax:>6s} {rrms:>6s}  {verdict}"


def _step_lines(step: Step, multi: bool, peer: bool = False) -> list[str]:
    """A step's outputs, one line each, except the KV cache (present.*): one line for all of them (the
    worst), plus one per other output beyond the tolerance (failing, or passing as the peer's level 4 does)."""
    lines = [f"{step.label}:"] if multi or step.tokens else []
    if step.tokens:
        lines[0] += f" next token stock {step.tokens[0]}, imegen {step.tokens[1]}"
        if step.peer_token is not None:
            lines[0] += f", peer {step.peer_token}"
    cache = [o for o in step.outputs if o.name.startswith("present")]
    for o in step.outputs:
        if o not in cache:
            lines.append(_agreement_line(o.name, o, peer))
    if cache:
        worst = max(cache, key=lambda o: o.worst)
        verdict = "PASS" if all(o.ok for o in cache) else "FAIL"
        lines.append(_agreement_line(f"present.* ({len(cache)})", worst, peer, verdict) + f"  (worst {worst.name})")
        lines += [_agreement_line(o.name, o, peer) for o in cache if not o.within_tolerance or not o.ok]
    return lines


def _deviation(y0: np.ndarray, y: np.ndarray, level: int) -> Deviation:
    """y against stock's y0: max |diff|, RMS diff, and max |diff| over `level`'s tolerance (inf for a NaN or a
    different shape)."""
    if y.shape != y0.shape:
        return Deviation(np.inf, np.inf, np.inf)
    a, r = TOLERANCE[level]
    y0d = y0.astype(np.float64)
    err = np.nan_to_num(np.abs(y.astype(np.float64) - y0d), nan=np.inf)
    if not err.size:
        return Deviation(0.0, 0.0, 0.0)
    return Deviation(float(err.max()), float(np.sqrt(np.mean(err * err))), float((err / (a + r * np.abs(y0d))).max()))


def compare_outputs(stock: dict, mine: dict, level: int, peer: dict | None = None) -> list[OutputAgreement]:
    """Each of stock's outputs against imegen's. A float output passes within `level`'s tolerance or, given
    the peer's outputs for the same feeds, when imegen's max |diff| and RMS diff from stock are at most
    PEER_MAX_FACTOR and PEER_RMS_FACTOR times the peer's; other outputs must be equal."""
    out = []
    for name, y0 in stock.items():
        y1 = mine[name]
        if y0.dtype.type not in FLOAT_DTYPES:
            same = y0.shape == y1.shape and np.array_equal(y0, y1)
            diff = 0.0 if same else np.inf
            out.append(OutputAgreement(name, diff, diff, same, y0.size, diff))
            continue
        d = _deviation(y0, y1, level)
        theirs = _deviation(y0, peer[name], level) if peer is not None and name in peer else None
        agreement = OutputAgreement(name, d.max_abs, d.worst, False, y0.size, d.rms, theirs)
        out.append(replace(agreement, ok=agreement.within_tolerance or agreement.like_peer))
    return out


def compare_shared(stock: dict, mine: dict, level: int, peer: dict | None, shared: set[str],
                   valid: int) -> list[OutputAgreement]:
    """compare_outputs where the `shared` outputs are KV buffers of which the first `valid` rows (axis 2) hold
    positions: those rows are compared (the peer's growing cache has just them); imegen's rows after them must
    still hold the NaN they were fed, else its operator wrote a row it should not have (and the row it should
    have written is NaN, or it wrote one too many)."""
    def held(outputs: dict) -> dict:
        return {k: v[:, :, :valid] if k in shared else v for k, v in outputs.items()}

    out = compare_outputs(held(stock), held(mine), level, peer)
    return [_rows_after_untouched(o, mine[o.name], valid) if o.name in shared else o for o in out]


def _rows_after_untouched(o: OutputAgreement, buffer: np.ndarray, valid: int) -> OutputAgreement:
    written = np.nonzero(~np.isnan(buffer[:, :, valid:]).all(axis=(0, 1, 3)))[0] + valid
    if not written.size:
        return o
    rows = f"row{'s' * (written.size > 1)} " + ", ".join(map(str, written[:4])) + (", ..." if written.size > 4 else "")
    return replace(o, ok=False, note=f"wrote {rows} of the shared buffer, past the {valid} positions it holds")


# ------------------------------------------------------------------------------------------ reading the graph
def _dims(vi) -> list:
    """A graph input's dims: ints where static, the symbol's name (or None) where not."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]


class _Graph:
    def __init__(self, model):
        self.graph = model.graph
        self.inits = {t.name: t for t in model.graph.initializer}
        self.producer = {o: n for n in model.graph.node for o in n.output if o}
        self.inputs = {vi.name: vi for vi in model.graph.input if vi.name not in self.inits}
        self.outputs = {vi.name: vi for vi in model.graph.output}

    def consumers(self, name: str) -> list[tuple[object, int]]:
        return [(n, i) for n in self.graph.node for i, x in enumerate(n.input) if x == name]

    def width(self, name: str) -> int | None:
        """The last dimension of a tensor computed by a projection: MatMulNBits' N or a MatMul's constant B,
        looked up through elementwise ops with a constant operand (bias Add) and casts."""
        node = self.producer.get(name)
        for _ in range(8):
            if node is None:
                return None
            if node.op_type == "MatMulNBits":
                return int(node_attributes(node)["N"])
            if node.op_type == "MatMul" and node.input[1] in self.inits:
                return int(self.inits[node.input[1]].dims[-1])
            rest = [x for x in node.input if x and x not in self.inits]
            if node.op_type not in ("Add", "Mul", "Cast", "Identity") or len(rest) != 1:
                return None
            node = self.producer.get(rest[0])
        return None


@dataclass(frozen=True)
class Decoder:
    """How to feed a decoder graph: its recognised inputs and how the KV cache is sized and fed back."""

    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    past: tuple[tuple[str, tuple], ...]  # past input -> dims with "P" for the cache length
    present: tuple[tuple[str, str], ...]  # past input <- the present output fed back to it
    logits: str | None
    vocab: int | None


def _gqa_cache_dims(g: _Graph, name: str) -> tuple[int | None, int | None]:
    """(kv heads, head size) from the GroupQueryAttention reading this past input: its kv_num_heads, and
    the width of its query projection over (num_heads + 2 kv_num_heads) heads (packed q/k/v) or num_heads."""
    for node, index in g.consumers(name):
        if node.op_type == "GroupQueryAttention" and index in (3, 4):
            a = node_attributes(node)
            heads, kv = int(a["num_heads"]), int(a["kv_num_heads"])
            packed = len(node.input) < 2 or not node.input[1]
            width = g.width(node.input[0])
            return kv, (width // (heads + 2 * kv if packed else heads) if width else None)
    return None, None


def _cache_dims(g: _Graph, vi, dims: dict[str, int]) -> tuple:
    """A past input's dims [batch, kv heads, cache length, head size]: static where the graph says, else
    --dim, else batch 1, length "P", heads and head size from the attention node reading it."""
    shape = _dims(vi)
    if len(shape) != 4:
        raise ModelCheckError(f"{vi.name}: expected a rank-4 KV cache [batch, heads, length, head size], "
                              f"the graph says {shape}")
    heads, head_size = _gqa_cache_dims(g, vi.name)
    from_attention = {1: heads, 3: head_size}
    out = []
    for i, d in enumerate(shape):
        if i == 2:
            out.append("P")
        elif isinstance(d, int) and d > 0:
            out.append(d)
        elif d in dims:
            out.append(dims[d])
        elif i == 0:
            out.append(1)
        elif from_attention[i] is not None:
            out.append(from_attention[i])
        else:
            raise ModelCheckError(f"cannot size {vi.name}'s dimension {i} ({d or 'unnamed'}): "
                                  f"give it with --dim {d or 'NAME'}=N")
    return tuple(out)


def _vocab(g: _Graph, logits: str | None, dims: dict[str, int]) -> int | None:
    """The vocabulary size: the logits' last dimension, else the rows of the embedding table input_ids
    indexes (a Gather, or a GatherBlockQuantized over a reshaped packed table)."""
    if logits:
        last = _dims(g.outputs[logits])[-1:]
        if last and isinstance(last[0], int) and last[0] > 0:
            return last[0]
        if last and last[0] in dims:
            return dims[last[0]]
    for node, index in g.consumers("input_ids"):
        if node.op_type in ("Gather", "GatherBlockQuantized") and index == 1 and not node_attributes(node).get("axis", 0) \
                and not node_attributes(node).get("gather_axis", 0):
            table = node.input[0]
            while table not in g.inits and table in g.producer and g.producer[table].op_type in ("Reshape", "Cast"):
                table = g.producer[table].input[0]
            if table in g.inits:
                return int(g.inits[table].dims[0])
    return None


def find_decoder(model, dims: dict[str, int] | None = None) -> Decoder | None:
    """The decoder interface of `model`, or None when it has no `input_ids` input."""
    dims = dims or {}
    g = _Graph(model)
    if "input_ids" not in g.inputs:
        return None
    past = tuple((name, _cache_dims(g, vi, dims)) for name, vi in g.inputs.items()
                 if name.startswith("past_key_values"))
    present = tuple((name, name.replace("past_key_values", "present", 1)) for name, _ in past
                    if name.replace("past_key_values", "present", 1) in g.outputs)
    logits = "logits" if "logits" in g.outputs else None
    return Decoder("input_ids", "attention_mask" if "attention_mask" in g.inputs else None,
                   "position_ids" if "position_ids" in g.inputs else None, past,
                   present if len(present) == len(past) else (), logits, _vocab(g, logits, dims))


def shared_kv_reason(model, dec: Decoder) -> str:
    """Why the decoder's KV cache cannot be held as onnxruntime-genai holds it on CPU, one buffer per past input
    bound as both the past input and the present output ("" when it can): each past_key_values.* must be read by
    one GroupQueryAttention alone, as its past key or value, and its present.* be that node's present output
    (then the node sees past == present and writes the new rows in place; anything else reading the past would
    see the whole buffer, rows not yet written included). The KV cache is BNSH: [batch, kv heads, length, head]."""
    if not dec.present:
        return "the model has no present.* output for every past_key_values.* input"
    g = _Graph(model)
    for past, present in dec.present:
        readers = g.consumers(past)
        attention = [(n, i) for n, i in readers if n.op_type == "GroupQueryAttention"
                     and n.domain == MS_DOMAIN and i in GQA_PRESENT_OF_PAST[MS_DOMAIN]]
        if len(readers) != 1 or not attention:
            ops = sorted({n.op_type for n, _ in readers})
            return f"{past} is read by {' and '.join(ops) or 'no node'}, not by one GroupQueryAttention alone"
        node, slot = attention[0]
        if node.output[GQA_PRESENT_OF_PAST[MS_DOMAIN][slot]] != present:
            return f"{present} is not the present output of the GroupQueryAttention reading {past}"
        if DTYPES[g.inputs[past].type.tensor_type.elem_type] not in FLOAT_DTYPES:
            return f"{past} is not a float tensor"
        heads, kv_heads = dict(dec.past)[past][1], int(node_attributes(node)["kv_num_heads"])
        if heads != kv_heads:
            return f"{past}'s dimension 1 is {heads}, not its GroupQueryAttention's {kv_heads} kv heads (not BNSH)"
    return ""


# ------------------------------------------------------------------------------------------ feeds
def _random_value(dtype, shape, rng) -> np.ndarray:
    if dtype in FLOAT_DTYPES:
        return rng.normal(0, 0.25, shape).astype(dtype)
    return rng.integers(0, 16, shape).astype(dtype)


def random_inputs(model, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs for a graph that is not a decoder: floats ~ N(0, 0.25), integers in [0, 16), an
    `attention_mask` all ones; symbolic dims from `dims` (default 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, vi in _Graph(model).inputs.items():
        shape = [d if isinstance(d, int) and d > 0 else (dims or {}).get(d, 1) for d in _dims(vi)]
        dtype = DTYPES[vi.type.tensor_type.elem_type]
        feeds[name] = np.ones(shape, dtype) if name == "attention_mask" else _random_value(dtype, shape, rng)
    return feeds


def prefill_feeds(model, dec: Decoder, seq: int, past: int, seed: int, dims: dict[str, int]) -> dict[str, np.ndarray]:
    """The first step's feeds: `seq` random token ids in [0, vocab) after a cache of `past` positions (random
    keys and values ~ N(0, 1), as if an earlier prompt had filled it), an attention mask of ones over all
    past + seq positions, position ids past .. past + seq - 1; other inputs random, their symbolic dims from
    --dim (batch 1; sequence_length, past_sequence_length, total_sequence_length from the step)."""
    if dec.vocab is None:
        raise ModelCheckError("cannot tell the vocabulary size (no static last dimension on `logits`, no embedding "
                              "table read by input_ids): give the logits' dimension with --dim NAME=N")
    rng = np.random.default_rng(seed)
    g = _Graph(model)
    step = {**dims, "sequence_length": seq, "past_sequence_length": past, "total_sequence_length": past + seq,
            **{b: 1 for b in BATCH_DIMS}}
    cache = dict(dec.past)
    feeds = {}
    for name, vi in g.inputs.items():
        dtype = DTYPES[vi.type.tensor_type.elem_type]
        if name == dec.input_ids:
            feeds[name] = rng.integers(0, dec.vocab, (1, seq)).astype(dtype)
        elif name == dec.attention_mask:
            feeds[name] = np.ones((1, past + seq), dtype)
        elif name == dec.position_ids:
            shape = [d if isinstance(d, int) and d > 0 else step.get(d, 1) for d in _dims(vi)]
            feeds[name] = np.broadcast_to(np.arange(past, past + seq), shape).astype(dtype)
        elif name in cache:
            feeds[name] = rng.normal(0, 1, [past if d == "P" else d for d in cache[name]]).astype(dtype)
        else:
            shape = [d if isinstance(d, int) and d > 0 else step.get(d, 1) for d in _dims(vi)]
            feeds[name] = _random_value(dtype, shape, rng)
    return feeds


def decode_feeds(dec: Decoder, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray],
                 token: int) -> dict[str, np.ndarray]:
    """The next step's feeds: one token, the attention mask one longer, the next position, this step's
    present.* as past_key_values.*; other inputs as they were."""
    nxt = dict(feeds)
    ids = feeds[dec.input_ids]
    nxt[dec.input_ids] = np.full(ids.shape[:-1] + (1,), token, ids.dtype)
    if dec.attention_mask:
        mask = feeds[dec.attention_mask]
        nxt[dec.attention_mask] = np.concatenate([mask, np.ones(mask.shape[:-1] + (1,), mask.dtype)], axis=-1)
    if dec.position_ids:
        pos = feeds[dec.position_ids]
        nxt[dec.position_ids] = pos[..., -1:] + 1
    for past, present in dec.present:
        nxt[past] = outputs[present]
    return nxt


def shared_buffers(dec: Decoder, feeds: dict[str, np.ndarray], positions: int) -> dict[str, np.ndarray]:
    """The feeds with each past input in a buffer of `positions` rows, as onnxruntime-genai allocates it: the
    cache's rows first, NaN after them (not written yet: an operator reading one gives NaN outputs)."""
    out = dict(feeds)
    for past, _ in dec.present:
        cache = feeds[past]
        out[past] = np.full(cache.shape[:2] + (positions,) + cache.shape[3:], np.nan, cache.dtype)
        out[past][:, :, :cache.shape[2]] = cache
    return out


def _cache_length(dec: Decoder, feeds: dict[str, np.ndarray]) -> int:
    return int(feeds[dec.past[0][0]].shape[2]) if dec.past else 0


def _argmax(dec: Decoder, outputs: dict[str, np.ndarray]) -> int | None:
    if not dec.logits:
        return None
    logits = outputs[dec.logits]
    return int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1]))


# ------------------------------------------------------------------------------------------ the check
class HostPeer:
    """The original model in the host's onnxruntime (CPU provider, one thread): at level 4 its MatMulNBits
    compute in int8 (MLAS CompInt8 on x86_64), as imegen's do, so how far its outputs are from stock's
    (riscv64, fp32) is ORT's own level-4 deviation. A run that fails ends its part in the check (`note` says
    why) rather than the check."""

    def __init__(self, session, name: str):
        self._session = session
        self._outputs = [o.name for o in session.get_outputs()]
        self.name = name
        self.note = ""

    @classmethod
    def start(cls, model_path: str | Path) -> tuple["HostPeer | None", str]:
        """The peer, or None and why not."""
        try:
            import onnxruntime as ort
        except ImportError as e:
            return None, f"no peer: the host's onnxruntime is not importable ({e}); judged by the tolerance alone"
        name = f"onnxruntime {ort.__version__} on {platform.machine()}"
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        try:
            return cls(ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"]), name), ""
        except Exception as e:  # onnxruntime raises its own Fail, InvalidGraph, ... for a model it cannot load
            return None, f"no peer: {name} cannot load the model ({_first_line(e)}); judged by the tolerance alone"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        if self.note:
            return None
        try:
            return dict(zip(self._outputs, self._session.run(self._outputs, feeds)))
        except Exception as e:
            self.note = (f"the peer, {self.name}, failed a run ({_first_line(e)}); later steps judged by the "
                         "tolerance alone")
            return None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


class _Sides:
    """Stock and imegen sessions, run side by side (two QEMU processes), and the peer when there is one. `share`
    {present output: past input}: both riscv64 sessions run with those outputs bound to their inputs' buffers, as
    onnxruntime-genai runs a model (the peer, only a yardstick of level 4's rounding, keeps a growing cache)."""

    def __init__(self, stock: RiscvSession, mine: RiscvSession, peer: HostPeer | None = None,
                 share: dict[str, str] | None = None):
        self.stock, self.mine, self.peer = stock, mine, peer
        self.share = share
        self._pool = ThreadPoolExecutor(2)

    def run(self, stock_feeds: dict[str, np.ndarray], mine_feeds: dict[str, np.ndarray],
            peer_feeds: dict[str, np.ndarray] | None = None) -> tuple[dict, dict, dict | None]:
        a = self._pool.submit(self.stock.run, stock_feeds, share=self.share)
        b = self._pool.submit(self.mine.run, mine_feeds, share=self.share)
        theirs = self.peer.run(peer_feeds) if self.peer and peer_feeds is not None else None  # meanwhile, on the host
        return a.result(), b.result(), theirs

    def close(self) -> None:
        self._pool.shutdown()


def _level(model) -> int:
    levels = {int(next((a.i for a in n.attribute if a.name == "accuracy_level"), 0))
              for n in model.graph.node if n.domain == "ai.imegen"}
    return 4 if 4 in levels else 0


def _decodes(dec: Decoder, generate: int) -> int:
    """Decode steps after the prefill: one, or `generate` (a decoder that feeds its cache back, with logits)."""
    return (generate or 1) if dec.present and dec.logits else 0


def kv_positions(dec: Decoder, feeds: dict[str, np.ndarray], generate: int) -> int:
    """Every position the check's steps put in the KV cache: the past, the prefill's tokens, one per decode."""
    return _cache_length(dec, feeds) + feeds[dec.input_ids].shape[-1] + _decodes(dec, generate)


def _decoder_steps(sides: _Sides, dec: Decoder, feeds: dict, level: int, generate: int) -> list[Step]:
    """Prefill, then decode steps (one; or `generate`, the last generated token fed too so every token's
    step is compared), each side fed its own present.* outputs, as a generation loop does: with `sides.share`
    in one shared buffer per past input (kv_positions long, NaN where not yet written), else a growing cache.
    Checking (generate 0) both sides decode the stock argmax, so a near-tie imegen breaks the other way still
    compares like with like; generating, each side decodes its own argmax and the loop stops where they
    differ. The peer always decodes stock's token (imegen's too while they agree), so its deviation is
    measured on the same inputs; its own argmax is recorded."""
    decodes = _decodes(dec, generate)
    shared = set(sides.share or ())
    peer_feeds = feeds
    stock_feeds = mine_feeds = shared_buffers(dec, feeds, kv_positions(dec, feeds, generate)) if shared else feeds
    seq, past = feeds[dec.input_ids].shape[-1], _cache_length(dec, feeds)
    label = f"prefill: {seq} token{'s' * (seq != 1)} at past {past}"
    steps = []
    for i in range(decodes + 1):
        stock, mine, theirs = sides.run(stock_feeds, mine_feeds, peer_feeds)
        tokens = (_argmax(dec, stock), _argmax(dec, mine)) if dec.logits else None
        peer_token = _argmax(dec, theirs) if theirs is not None else None
        valid = past + stock_feeds[dec.input_ids].shape[-1]
        outputs = (compare_shared(stock, mine, level, theirs, shared, valid) if shared else
                   compare_outputs(stock, mine, level, theirs))
        steps.append(Step(label, tuple(outputs), tokens, peer_token))
        if i == decodes or (generate and tokens[0] != tokens[1]):
            break
        past += stock_feeds[dec.input_ids].shape[-1]
        stock_feeds = decode_feeds(dec, stock_feeds, stock, tokens[0])
        mine_feeds = decode_feeds(dec, mine_feeds, mine, tokens[1] if generate else tokens[0])
        peer_feeds = decode_feeds(dec, peer_feeds, theirs, tokens[0]) if theirs is not None else None
        label = f"decode {i + 1}: 1 token at past {past}"
    return steps


def model_check(specs: list[KernelSpec], model_path: str | Path, *, spec_file: str = "<spec>", version: str = "1.23",
                inputs: dict[str, np.ndarray] | None = None, seed: int = 0, dims: dict[str, int] | None = None,
                threads: int = 1, seq: int = DEFAULT_SEQ, past: int = DEFAULT_PAST, generate: int = 0,
                compute: str | None = None, decoder: bool = True, attention: list | None = None) -> ModelCheck:
    """Check `model_path` in stock ORT vs ORT + imegen (see the module's docstring). `inputs` are the
    (prefill) feeds, else random from `seed`; `dims` size symbolic dims (a decoder's sequence lengths
    come from `seq` and `past`); `generate` > 0 greedy-decodes that many tokens on both sides;
    `compute`: "int8" moves accuracy levels 0-3 as level 4, "fp32" lowers level 4 to 0 where fp32 kernels
    serve, as `ort-accelerate --compute int8|fp32` does (None: each node's own level); `decoder`: also move the
    decoder's other nodes onto imegen's operators (decoder_ops.py), as ort-accelerate does unless --matmul-only;
    `attention`: the spec's attention kernels (AttentionSpecs; GroupQueryAttention nodes move only with one)."""
    dims = dict(dims or {})
    if seq < 1 or past < 0 or generate < 0:
        raise ModelCheckError(f"need seq >= 1, past >= 0, generate >= 0 (got {seq}, {past}, {generate})")
    try:
        model = load_graph(model_path)
    except ModelFileError as e:
        raise ModelCheckError(str(e)) from None
    dec = find_decoder(model, dims)
    why_growing = shared_kv_reason(model, dec) if dec is not None else ""  # read before the rewrite
    if dec is not None and STEP_DIMS & dims.keys():
        raise ModelCheckError(f"--dim {sorted(STEP_DIMS & dims.keys())[0]}: a decoder's sequence lengths come "
                              "from --seq and --past")
    if dec is not None and set(BATCH_DIMS) & dims.keys():
        raise ModelCheckError(f"--dim {sorted(set(BATCH_DIMS) & dims.keys())[0]}: a decoder is checked at batch 1")
    if generate and (dec is None or not dec.present or not dec.logits):
        raise ModelCheckError("generating needs a decoder: inputs input_ids and past_key_values.*, "
                              "outputs logits and present.*")
    lib = build_library(specs, spec_file, flavour="qemu", attention=attention)
    fold_bias_adds(model, specs)  # as ort-accelerate does, where the spec serves the node with its bias
    if compute == "fp32":
        lower_to_fp32(model, specs)
    decisions = rewrite(model, specs, int8_compute=compute == "int8")
    check = ModelCheck(version, decisions, _level(model), generate=generate, kernels=tuple(s.name for s in specs))
    if decoder and check.moved:
        check.decoder = rewrite_decoder_ops(model, attention=bool(attention))
    if not check.moved:
        return check  # nothing imegen would run: no session, and the report says so
    share = None
    if dec is not None:
        feeds = inputs if inputs is not None else prefill_feeds(model, dec, seq, past, seed, dims)
        share = None if why_growing else {present: cache for cache, present in dec.present}
        check.kv_cache = _kv_cache_line(dec, feeds, generate, why_growing)
    else:
        feeds = inputs if inputs is not None else random_inputs(model, seed, dims)
    with tempfile.TemporaryDirectory() as tmp:
        rewritten = Path(tmp) / "imegen.onnx"
        _save_beside(model, rewritten, Path(model_path))
        with ThreadPoolExecutor(2) as pool:  # two QEMU start-ups at once
            vlen = qemu_vlen(specs)
            starting = [pool.submit(RiscvSession, model_path, version, threads=threads, vlen=vlen),
                        pool.submit(RiscvSession, rewritten, version, custom_ops=lib, threads=threads, vlen=vlen)]
            # Meanwhile the peer. At level 0 the tolerance is fp32's, which whole models meet: no peer needed.
            peer, check.peer_note = (HostPeer.start(model_path) if check.level == 4 and compute != "int8" else
                                     (None, "no peer: the model's own levels are not 4 (int8 compute was asked for); "
                                            "judged by the level-4 tolerance alone" if compute == "int8" else ""))
            sessions = [_result_or_close(f, starting) for f in starting]
        check.peer = peer.name if peer else ""
        sides = _Sides(*sessions, peer, share)
        try:
            check.ort_version = sides.stock.version
            if dec is None:
                stock, mine, theirs = sides.run(feeds, feeds, feeds)
                check.steps = [Step("run", tuple(compare_outputs(stock, mine, check.level, theirs)))]
            else:
                check.steps = _decoder_steps(sides, dec, feeds, check.level, generate)
            check.peer_note = check.peer_note or (peer.note if peer else "")
            stats_text = sides.mine.stats()
            check.stats = parse_stats(stats_text)
            check.decoder_calls = parse_decoder_stats(stats_text)
            check.peak_rss = (sides.stock.peak_rss(), sides.mine.peak_rss())
        finally:
            sides.close()
            for s in sessions:
                s.close()
    return check


def _kv_cache_line(dec: Decoder, feeds: dict[str, np.ndarray], generate: int, why_growing: str) -> str:
    if not dec.present:
        return ""
    if why_growing:
        return f"KV cache: growing, each step's present.* fed back as the next past_key_values.* ({why_growing})"
    return (f"KV cache: shared past/present buffer of {kv_positions(dec, feeds, generate)} positions, as "
            "onnxruntime-genai runs it (each present.* bound to its past_key_values.*, rows not yet written NaN)")


def qemu_vlen(specs: list[KernelSpec]) -> int:
    """The VLEN QEMU gives both sessions: the one the IME kernels' harts have (a K3's A100: 1024), else a K1's 256."""
    from .. import targets

    return max((targets.of(s).only_vlen for s in specs if targets.of(s).needs_ime), default=256)


def _result_or_close(future, all_futures) -> RiscvSession:
    """A started session; when one failed to start, close the others and raise its error."""
    try:
        return future.result()
    except BaseException:
        for f in all_futures:
            if f is not future and f.exception() is None:
                f.result().close()
        raise


def _save_beside(model, path: Path, original: Path) -> None:
    """Save the rewritten graph (loaded without its external weights) where the original's external data
    files are reachable: each is linked beside it, so ORT reads the weights from where they are (a real
    LLM's gigabytes are never copied, nor pass through Python)."""
    import onnx

    from .external_data import ExternalDataError, checked_location, external_files

    onnx.save(model, str(path))
    for location in external_files(model):  # every tensor's: subgraphs, sparse initializers, attributes
        try:
            rel = checked_location(location, original.parent)  # inside the model's folder, and there
        except ExternalDataError as e:
            raise ModelCheckError(str(e)) from None
        link = path.parent / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to((original.parent / rel).resolve())
