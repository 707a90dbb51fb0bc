"""`imegen ort-accelerate MODEL -o OUT_DIR`: an int4/int8 ONNX model and no spec in; a rewritten model and
a custom-op library whose kernels are chosen for each MatMulNBits node's shape out.

1. Inspect every com.microsoft MatMulNBits node from the model's protobuf alone (external data stays on disk):
   rewrite.node_needs reads bits, block, accuracy level, zero points, bias, g_idx, T and (N, K).
2. Derive a spec (derive()): per quantization group (bits, block, zero points, bias, compute) and weight shape,
   - int8 compute (accuracy_level 4, or any level with --compute int8): IME kernels from the committed tuning
     table (tuning.json, a copy of bench/results/tune.json's winners): the M = 1 winner as gemv, the M = 128
     winner as gemm and, where the M = 512 winner differs, a second gemm kernel from LONG_PROMPT_ROWS rows;
     plus one `fallback = yes` rvv int8 kernel per group for threads that cannot reach an IME hart;
   - fp32 compute (levels 0-3, or --compute fp32): bench's rvv-fp32 baseline, gemv 1x16 and gemm 4x16.
   The table holds 4-bit asymmetric configs at blocks 32/64/128 for Qwen2.5-0.5B's shapes: a node takes the
   exact (N, K, block, M) entry, else the nearest tuned shape at the nearest tuned block, adapted (bits, zero
   points, bias, block); a config the validator refuses falls back to ort-check's built-in kernel settings,
   which are validated at every block. Identical configs serving several shapes are one kernel listing its
   `shapes`; serve() must then give every node exactly the kernels derived for it (else a bug: AssertionError).
3. Build the library (customop.build_library, cached), rewrite the model (rewrite.rewrite), copy the model's
   external data files next to the new model (copy-on-write clones where the file system can; never again
   when unchanged), and report one line per node.
4. With MatMulNBits nodes served, the decoder's other nodes (RMSNorms, the SiLU-gated MLP's activation,
   GroupQueryAttention) move onto the library's RVV operators where their form is served
   (decoder_ops.rewrite_decoder_ops); --matmul-only keeps them on ORT's kernels.

Exit status: 0 when every MatMulNBits and decoder node is served, 3 when some or all are not (or the model has none),
2 for a user error (unreadable model, bad spec, unknown target).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..cli_types import add_command
from ..errors import SpecError
from ..ir import _CHOICES, DIM_RANGE, KernelSpec, attention_specs_from_text, load_specs, specs_from_text
from .external_data import ExternalDataError, ModelFileError, checked_location, external_files, load_graph
from .decoder_ops import DecoderDecision, rewrite_decoder_ops
from .serving import COMPUTE_FOR_LEVEL, NodeNeeds, Serving, refusal, serve

TUNING_TABLE = Path(__file__).with_name("tuning.json")
TUNE_JSON = "bench/results/tune.json"  # the tuner's committed output that TUNING_TABLE condenses
TUNED_M = {"m1": 1, "m2": 128, "m256": 512}  # kernel role -> the M its table entry was tuned at
LONG_PROMPT_ROWS = 256  # min_rows of the M = 512 winner: the geometric mean of the tuned 128 and 512
# The fallback's VLEN is the K1's: every K1 hart is an X60 with VLEN 256, and the fallback runs only on the
# ones without IME (cores 4-7). The library refuses a kernel whose VLEN a hart lacks at session creation, so
# a library built for a K1 fails loudly, naming the node, on a narrower machine.
FALLBACK_VLEN = 256
INT8_LEVEL = 4
FP32_LEVEL = 0
TARGETS = ("k1", "k3")  # the boards (Board below)
OUTPUTS = ("model.onnx", "libimegen_ort.so", "model.imegen", "report.txt")
BIG_MODEL = 64 << 20  # bytes of model file worth a progress line: reading it takes a second or more
ROLE_WORDS = {"m1": "M = 1 (decode)", "m2": "M > 1 (prefill)", "m256": f"M >= {LONG_PROMPT_ROWS} (long prompts)",
              "fallback": "slices whose thread cannot reach an IME hart"}


class AccelerateError(ValueError):
    """A user error (exit status 2)."""


# ----------------------------------------------------------------------------- the tuning table
@dataclass(frozen=True)
class TunedCase:
    shape: str  # the Qwen2.5-0.5B weight it was tuned for, e.g. "q/o"
    N: int
    K: int
    M: int
    block: int
    settings: tuple[tuple[str, object], ...]  # the winner's DSL settings, as tune.json gives them
    # Configs the tuner ranked within TIE of the winner on 4 cores and on 1 core (its top list): as good under
    # the model, so derive() may take one that packs B like the shape's gemv kernel (one copy of B, not two).
    ties: tuple[tuple[tuple[str, object], ...], ...] = ()


TIE = 0.01  # the tuner's: relative modeled-time difference below which two configs count as tied
FLAGS = {"fp16": ("scale_type", "fp16"), "staged": ("stage_b", "m_block"), "spreadreg": ("spread", "per_register"),
         "a16": ("a_scale_type", "fp16")}


def settings_from_config_name(name: str, base: dict[str, object]) -> dict[str, object]:
    """A config of the tuner's name (perf tune.config_name) back into DSL settings; `base` supplies what the
    name leaves out (bits, zero points, bias: the tuner searches 4-bit asymmetric, no bias)."""
    parts = name.split("_")
    target, compute, op = parts[:3]
    rest = parts[3:]
    vlen = {"vlen": int(rest.pop(0)[1:])} if rest[0].startswith("v") and rest[0][1:].isdigit() else {}
    tile, k, unpack, panel, scales, block, *flags = rest
    out = {**base, "op": op, "compute": compute, "target": target, **vlen, "tile": tile, "k_unroll": int(k[1:]),
           "unpack": {"pl": "planar", "in": "interleaved"}[unpack], "panel": int(panel[1:]),
           "scales": {"inl": "inline", "sep": "separate"}[scales], "block": int(block[1:]), "scale_type": "fp32"}
    out.update(dict(FLAGS[f] for f in flags))
    return out


def _ties(case: dict) -> list[dict[str, object]]:
    best = case["top"][0] if case.get("top") else None
    if best is None:
        return []
    base = {k: case["best"][k] for k in ("bits", "zero_point", "bias")}
    return [settings_from_config_name(t["config"], base) for t in case["top"][1:]
            if t["ms_4_cores"] <= best["ms_4_cores"] * (1 + TIE) and t["ms_1_core"] <= best["ms_1_core"] * (1 + TIE)]


def compact_tuning_table(tune_json: dict) -> dict:
    """bench/results/tune.json -> what ort-accelerate needs of it: each case's winner and its ties."""
    cases = [{"shape": c["case"].split(" ")[0], "N": c["N"], "K": c["K"], "M": c["M"], "block": c["block"],
              "best": c["best"], "ties": _ties(c)} for c in tune_json["cases"]]
    return {"from": TUNE_JSON, "ranked_by": tune_json["ranked_by"], "cases": cases}


def write_tuning_table(tune_json_path: Path | str = TUNE_JSON) -> Path:
    """Refresh TUNING_TABLE from the tuner's output (after `imegen tune` rewrote it)."""
    table = compact_tuning_table(json.loads(Path(tune_json_path).read_text()))
    cases = ",\n".join(f"  {json.dumps(c, sort_keys=True)}" for c in table["cases"])  # a case per line: plain diffs
    TUNING_TABLE.write_text(f'{{"from": {json.dumps(table["from"])}, "ranked_by": {json.dumps(table["ranked_by"])},\n'
                            f' "cases": [\n{cases}\n]}}\n')
    return TUNING_TABLE


def tuning_table(path: Path = TUNING_TABLE) -> list[TunedCase]:
    data = json.loads(path.read_text())
    return [TunedCase(c["shape"], c["N"], c["K"], c["M"], c["block"], tuple(sorted(c["best"].items())),
                      tuple(tuple(sorted(s.items())) for s in c.get("ties", ())))
            for c in data["cases"]]


# ----------------------------------------------------------------------------- inspection
@dataclass(frozen=True)
class InspectedNode:
    name: str
    need: NodeNeeds | None  # None: its inputs rule it out before any kernel is asked
    why_not: str = ""  # why no imegen kernel can serve it whatever the spec ("" when one can)


BLOCKS = _CHOICES["block"][1]


def why_unservable(need: NodeNeeds) -> str:
    """serving.refusal, plus what the DSL cannot express for this node (block size, weight shape)."""
    why = refusal(need)
    if why:
        return why
    if need.block not in BLOCKS:
        return f"block_size {need.block} (imegen's kernels take {', '.join(map(str, BLOCKS))})"
    if not (DIM_RANGE[0] <= need.N <= DIM_RANGE[1] and DIM_RANGE[0] <= need.K <= DIM_RANGE[1]):
        return f"N={need.N}, K={need.K}: {DIM_RANGE[2]} (and the node must state both)"
    return ""


def matmul_nbits_nodes(model) -> list:
    from .rewrite import MS_DOMAIN

    return [n for n in model.graph.node if n.op_type == "MatMulNBits" and n.domain == MS_DOMAIN]


def inspect_model(model) -> list[InspectedNode]:
    """Every com.microsoft MatMulNBits node of the main graph, in graph order (as rewrite() visits them).
    Reads only the protobuf: initializers' data types and dims, never their (external) data."""
    from .rewrite import constant_initializers, node_name, node_needs

    initializers = constant_initializers(model.graph)
    out = []
    for node in matmul_nbits_nodes(model):
        name = node_name(node)
        if len(node.input) < 3 or not node.input[1] or not node.input[2]:
            out.append(InspectedNode(name, None, "B and scales inputs missing (not a valid MatMulNBits)"))
            continue
        need, why = node_needs(node, initializers)
        out.append(InspectedNode(name, need, why or (why_unservable(need) if need else "")))
    return out


def with_compute(need: NodeNeeds, compute: str | None) -> NodeNeeds:
    """The node as it runs after --compute: int8 raises levels 0-3 to 4, fp32 lowers 4 to 0."""
    if compute == "int8" and need.accuracy_level != INT8_LEVEL:
        return replace(need, accuracy_level=INT8_LEVEL)
    if compute == "fp32" and need.accuracy_level == INT8_LEVEL:
        return replace(need, accuracy_level=FP32_LEVEL)
    return need


# ----------------------------------------------------------------------------- configs
@dataclass(frozen=True)
class Group:
    """What a kernel's quantization settings must match for a node (serving._matches)."""

    bits: int
    block: int
    asymmetric: bool
    bias: bool
    compute: str

    @classmethod
    def of(cls, need: NodeNeeds) -> "Group":
        return cls(need.bits, need.block, need.asymmetric, need.bias, COMPUTE_FOR_LEVEL[need.accuracy_level])

    @property
    def prefix(self) -> str:
        """The start of its kernels' names: q4a_b32, q8s_bias_b64_f32, ..."""
        return (f"q{self.bits}{'a' if self.asymmetric else 's'}{'_bias' if self.bias else ''}_b{self.block}"
                + ("_f32" if self.compute == "fp32" else ""))

    def quantization(self) -> dict[str, object]:
        return {"bits": self.bits, "block": self.block, "zero_point": "asymmetric" if self.asymmetric else "symmetric",
                "bias": "yes" if self.bias else "no"}


@dataclass(frozen=True)
class Config:
    settings: tuple[tuple[str, object], ...]
    origin: str  # where the settings came from, for the spec's comments


def _settings_lines(settings: dict) -> list[str]:
    """Settings as DSL lines, in the DSL's own order of keys."""
    return [f"  {key:<12} = {settings[key]}" for key in _CHOICES if key in settings]


def _validate(settings: dict) -> KernelSpec | SpecError:
    """Through the DSL's parser and validator, as every kernel of the spec will be; the spec or the refusal."""
    try:
        (spec,) = specs_from_text("kernel candidate {\n" + "\n".join(_settings_lines(settings)) + "\n}\n", "<candidate>")
        return spec
    except SpecError as e:
        return e


def builtin_settings(target: str, compute: str, group: Group, op: str) -> dict[str, object]:
    """ort-check's built-in kernel for (target, compute, bits, zero points, bias), as op: the set
    ort-check validates at every block 16..256. Its tile for op is the built-in set's tile for that op."""
    from .ort_check import builtin_configs

    mine = [s for _, s in builtin_configs() if s["target"] == target and s["compute"] == compute]
    own = next(s for s in mine if s["bits"] == group.bits and s["bias"] == ("yes" if group.bias else "no")
               and s["zero_point"] == ("asymmetric" if group.asymmetric else "symmetric"))
    tile = next(s["tile"] for s in mine if s["op"] == op)
    return {**own, "op": op, "tile": tile, "block": group.block}


def _builtin_config(group: Group, op: str, why: str) -> Config:
    settings = builtin_settings("ime", "int8", group, op)
    return Config(tuple(sorted(settings.items())), f"ort-check's built-in ime int8 {op} ({why})")


def _shape_distance(case: TunedCase, N: int, K: int) -> float:
    return abs(math.log(case.N / N)) + abs(math.log(case.K / K))


def _nearest_block(blocks: set[int], block: int) -> int:
    return min(sorted(blocks), key=lambda b: abs(math.log2(b / block)))


def _packing(settings: dict[str, object]) -> tuple | None:
    """customop.packing of a config (None if the validator refuses it): equal means one packed copy of B."""
    from ..plan import plan_kernel
    from .customop import packing

    got = _validate(settings)
    return None if isinstance(got, SpecError) else packing(plan_kernel(got))


def _packing_like(case: TunedCase, group: Group, op: str, like: Config) -> dict[str, object] | None:
    """A config the tuner tied with `case`'s winner that packs B as `like` does, with the node's quantization."""
    want = _packing(dict(like.settings))
    for tie in case.ties:
        settings = {**dict(tie), **group.quantization()}
        if settings["op"] == op and want is not None and _packing(settings) == want:
            return settings
    return None


def tuned_config(table: list[TunedCase], group: Group, N: int, K: int, role: str, *,
                 pack_like: Config | None = None) -> Config:
    """The tuning table's winner for (N, K, block, M of role), else the nearest tuned shape at the nearest
    tuned block, with the node's bits, zero points, bias and block; ort-check's built-in IME settings when
    the validator refuses that (or the table has nothing for the role). `pack_like`: where the winner packs B
    otherwise and a config the tuner tied with it packs B like that one, take the tie (one copy of B serves
    both kernels)."""
    op = "gemv" if role == "m1" else "gemm"
    rows = [c for c in table if c.M == TUNED_M[role]]
    if not rows:
        return _builtin_config(group, op, f"the tuning table has no M = {TUNED_M[role]} entry")
    block = _nearest_block({c.block for c in rows}, group.block)
    at_block = [c for c in rows if c.block == block]
    best = min(at_block, key=lambda c: _shape_distance(c, N, K))  # min keeps the first of equals: table order
    tuned = dict(best.settings)
    settings = {**tuned, **group.quantization()}
    changed = [f"{k} = {v}" for k, v in group.quantization().items() if tuned.get(k) != v]
    where = f"tuned {best.shape} {best.N}x{best.K} M={best.M} block={best.block}"
    where += ", exact" if (best.N, best.K) == (N, K) and block == group.block else ", the nearest tuned shape"
    where += f"; with {', '.join(changed)}" if changed else ""
    got = _validate(settings)
    if isinstance(got, SpecError):
        return _builtin_config(group, op, f"{where}: refused: {got.message}")
    if got.op != op:
        return _builtin_config(group, op, f"{where} is op {got.op}, not {op}")
    if pack_like is not None and _packing(settings) != _packing(dict(pack_like.settings)):
        tie = _packing_like(best, group, op, pack_like)
        if tie is not None:
            changed = ", ".join(f"{k} = {v}" for k, v in sorted(tie.items()) if settings.get(k) != v)
            return Config(tuple(sorted(tie.items())), f"{where}; tied with it within {TIE:.0%} under the model: "
                          f"{changed}, which packs B as the M = 1 kernel does (one copy of B for both)")
    return Config(tuple(sorted(settings.items())), where)


def fallback_config(group: Group) -> Config:
    settings = {**builtin_settings("rvv", "int8", group, "gemm"), "vlen": FALLBACK_VLEN}
    return Config(tuple(sorted(settings.items())), f"ort-check's built-in rvv int8 gemm at vlen {FALLBACK_VLEN} (the K1's)")


def fp32_config(group: Group, role: str) -> Config:
    """bench's rvv-fp32 baseline (VLEN 256) with the node's quantization."""
    from ..perf.baselines.dsl import baseline_settings

    settings = {**baseline_settings("rvv-fp32", group.block, TUNED_M[role]), **group.quantization()}
    return Config(tuple(sorted(settings.items())), "bench's rvv-fp32 baseline")


# ----------------------------------------------------------------------------- boards
@dataclass(frozen=True)
class Board:
    """What ort-accelerate derives kernels for: a SoC, its IME target and where its other harts' VLEN stands."""

    name: str  # --target
    title: str  # the SoC, for the spec's header and messages
    ime_target: str  # the DSL target of its IME kernels
    tuned: bool  # its IME configs come from the tuning table (else from its target's serving_settings)
    ime_vlen: int  # the VLEN of its IME harts (what model checks emulate)
    hp_decode: bool = False  # groups in the .hp gemv's format decode through it (the K3's default; --decode int8: not)


BOARDS = {"k1": Board("k1", "SpacemiT K1", "ime", True, 256),
          "k3": Board("k3", "SpacemiT K3", "ime2", False, 1024, hp_decode=True)}

def target_config(board: Board, group: Group, op: str) -> Config | SpecError:
    """The board's IME target's own kernel for op (Target.serving_settings) with the group's quantization; the
    validator's refusal when it has none."""
    from .. import targets

    target = targets.get(board.ime_target)
    settings = {"op": op, "target": board.ime_target, "compute": "int8", **target.serving_settings(op, group.block),
                **group.quantization()}
    if board.hp_decode and hp_decodes(target, settings):  # the group is in the .hp gemv's format
        hp = {**settings, **target.hp_decode_settings(op)}
        what = "gemv with block-scaled FP16 vmadots" if op == "gemv" else "gemm reading the .hp gemv's packed B"
        return Config(tuple(sorted(hp.items())), f"the {board.title}'s {board.ime_target} {what} (--decode hp), not "
                      f"tuned per shape")
    got = _validate(settings)
    if isinstance(got, SpecError):
        return got
    return Config(tuple(sorted(settings.items())), f"the {board.title}'s {board.ime_target} {op}, not tuned per shape")


def hp_decodes(target, settings: dict[str, object]) -> bool:
    """Do both the .hp gemv and the gemm reading its packed B take the group `settings` (one op's) belongs to?"""
    return all(not isinstance(_validate({**settings, **target.serving_settings(op, settings["block"]), "op": op,
                                          **target.hp_decode_settings(op)}), SpecError) for op in ("gemv", "gemm"))


def board_refusal(board: Board, need: NodeNeeds, compute: str | None) -> str:
    """Why the board's kernels cannot serve an otherwise servable node ("" when they can)."""
    group = Group.of(with_compute(need, compute))
    if board.tuned or group.compute == "fp32":
        return ""
    for op in ("gemv", "gemm"):
        got = target_config(board, group, op)
        if isinstance(got, SpecError):
            return (f"no {board.title} kernel (target = {board.ime_target}) for {group.bits}-bit block {group.block}: "
                    f"{got.message.split(': ', 1)[-1]}")
    return ""


def roles_for(group: Group, table: list[TunedCase], N: int, K: int, board: Board = BOARDS["k1"]) -> dict[str, Config]:
    """The configs serving one shape of a group: role (m1, m2, m256, fallback) -> config."""
    if group.compute == "fp32":
        return {"m1": fp32_config(group, "m1"), "m2": fp32_config(group, "m2")}
    if not board.tuned:  # board_refusal() left out the groups its configs refuse
        return {"m1": target_config(board, group, "gemv"), "m2": target_config(board, group, "gemm"),
                "fallback": fallback_config(group)}
    roles = {"m1": tuned_config(table, group, N, K, "m1")}
    roles.update({r: tuned_config(table, group, N, K, r, pack_like=roles["m1"]) for r in ("m2", "m256")})
    if roles["m256"].settings == roles["m2"].settings:
        del roles["m256"]
    roles["fallback"] = fallback_config(group)
    return roles


# ----------------------------------------------------------------------------- the derived spec
@dataclass
class _Kernel:
    group: Group
    role: str
    settings: tuple[tuple[str, object], ...]
    shapes: dict[tuple[int, int], tuple[str, list[str]]] = field(default_factory=dict)  # shape -> (origin, nodes)
    name: str = ""

    @property
    def min_rows(self) -> int:
        return LONG_PROMPT_ROWS if self.role == "m256" else 2


@dataclass(frozen=True)
class Derivation:
    text: str  # the spec file
    specs: list[KernelSpec]
    intended: dict[int, Serving]  # index in inspect_model()'s list -> the kernels derived for the node


def _kernel_text(k: _Kernel) -> str:
    lines = _settings_lines(dict(k.settings))
    if k.role != "fallback":
        lines.append(f"  {'shapes':<12} = {', '.join(f'{n}x{kk}' for n, kk in k.shapes)}")
    if k.role == "m256":
        lines.append(f"  {'min_rows':<12} = {LONG_PROMPT_ROWS}")
    if k.role == "fallback":
        lines.append(f"  {'fallback':<12} = yes")
    return f"kernel {k.name} {{\n" + "\n".join(lines) + "\n}\n"


def _wrapped(text: str) -> list[str]:
    return textwrap.wrap(text, 116, initial_indent="#   ", subsequent_indent="#       ", break_on_hyphens=False,
                         break_long_words=False)


def _kernel_comment(k: _Kernel, group_nodes: list[str]) -> list[str]:
    lines = [f"# {k.name}: {ROLE_WORDS[k.role]}"]
    if k.role == "fallback":
        origin = next(iter(k.shapes.values()))[0]
        return lines + _wrapped(f"{origin}; for every node of {k.group.prefix}: {', '.join(group_nodes)}")
    for (n, kk), (origin, nodes) in k.shapes.items():
        lines += _wrapped(f"{n}x{kk}: {origin}; serves {', '.join(nodes)}")
    return lines


def _name(k: _Kernel, group_shapes: list[tuple[int, int]]) -> str:
    """prefix_fallback; prefix_ROLE when it serves all its group's shapes; else after its first shape."""
    if k.role == "fallback":
        return f"{k.group.prefix}_fallback"
    shapes = list(k.shapes)
    if len(shapes) == len(group_shapes) and len(shapes) > 1:
        return f"{k.group.prefix}_{k.role}"
    n, kk = shapes[0]
    more = f"_and_{len(shapes) - 1}_more" if len(shapes) > 1 else ""
    return f"{k.group.prefix}_{n}x{kk}{more}_{k.role}"


@dataclass
class _Assignment:
    """Kernels being derived: one per (group, role, settings), each collecting the shapes and nodes it serves."""

    kernels: dict[tuple, _Kernel] = field(default_factory=dict)
    chosen: dict[int, dict[str, _Kernel]] = field(default_factory=dict)  # node index -> role -> kernel
    group_shapes: dict[Group, list[tuple[int, int]]] = field(default_factory=dict)
    group_nodes: dict[Group, list[str]] = field(default_factory=dict)

    def add(self, i: int, name: str, need: NodeNeeds, table: list[TunedCase], board: Board) -> None:
        group, shape = Group.of(need), (need.N, need.K)
        shapes = self.group_shapes.setdefault(group, [])
        if shape not in shapes:
            shapes.append(shape)
        self.group_nodes.setdefault(group, []).append(name)
        self.chosen[i] = {}
        for role, config in roles_for(group, table, *shape, board).items():
            k = self.kernels.setdefault((group, role, config.settings), _Kernel(group, role, config.settings))
            k.shapes.setdefault(shape if role != "fallback" else (0, 0), (config.origin, []))[1].append(name)
            self.chosen[i][role] = k

    def named(self) -> list[_Kernel]:
        """The kernels, named, in spec order: by group (as the model first uses it), then m1, m2, m256, fallback."""
        for k in self.kernels.values():
            k.name = _name(k, self.group_shapes[k.group])
        roles = list(ROLE_WORDS)
        groups = list(self.group_shapes)
        return sorted(self.kernels.values(), key=lambda k: (groups.index(k.group), roles.index(k.role), k.name))

    def intended(self) -> dict[int, Serving]:
        return {i: Serving(roles["m1"].name, tuple((k.min_rows, k.name) for r, k in roles.items() if r in ("m2", "m256")),
                           roles["fallback"].name if "fallback" in roles else None)
                for i, roles in self.chosen.items()}


SPEC_HEADER = """\
# imegen ort-accelerate: kernels for {model}'s MatMulNBits nodes on a {board}.
# {ime_origin}
# rvv fp32 kernels: bench's rvv-fp32 baseline; fallback kernels run where no IME hart is reachable.
# Edit it and pass it back: imegen ort-accelerate MODEL -o OUT_DIR --spec OUT_DIR/model.imegen
"""
IME_ORIGIN = {
    True: "IME configs: imegen's tuning table (imegen/ort/tuning.json, the winners of bench/results/tune.json: the best\n"
          "# config per Qwen2.5-0.5B weight shape x M x block under the X60 cost model; modeled, not measured on hardware);",
    False: "IME2 configs: the gemv and gemm of examples/ime2_k3.imegen, not tuned per shape (imegen tune searches under\n"
           "# the X60 model only);"}


def derive(nodes: list[InspectedNode], *, compute: str | None = None, model_name: str = "the model",
           table: list[TunedCase] | None = None, board: Board = BOARDS["k1"]) -> Derivation:
    """The spec serving every servable node with kernels chosen for its shape (see the module's doc); `nodes`
    as for_board() leaves them."""
    table = tuning_table() if table is None else table
    work = _Assignment()
    for i, node in enumerate(nodes):
        if node.need is not None and not node.why_not:
            work.add(i, node.name, with_compute(node.need, compute), table, board)
    body = [line for k in work.named() for line in (*_kernel_comment(k, work.group_nodes[k.group]), _kernel_text(k))]
    text = "\n".join([SPEC_HEADER.format(model=model_name, board=board.title, ime_origin=IME_ORIGIN[board.tuned]),
                      *body])
    specs = specs_from_text(text, "model.imegen") if work.kernels else []
    derivation = Derivation(text, specs, work.intended())
    _check_serving(derivation, nodes, compute)
    return derivation


def _check_serving(d: Derivation, nodes: list[InspectedNode], compute: str | None) -> None:
    """The library's rule (serve) must give every node the kernels derived for it: else derive() is wrong."""
    for i, want in d.intended.items():
        got = serve(d.specs, with_compute(nodes[i].need, compute))
        assert got == want, f"derived kernels for {nodes[i].name}: serve() gives {got}, derive() meant {want}"


# ----------------------------------------------------------------------------- files
FICLONE = 0x40049409  # linux/fs.h: the copy shares the source's blocks until either is written (btrfs, XFS)


def _own_location(loc: str, model_dir: Path) -> Path:
    """An external data file's place inside the model's folder, which ort-accelerate's own outputs must not take."""
    try:
        rel = checked_location(loc, model_dir)
    except ExternalDataError as e:
        raise AccelerateError(str(e)) from None
    if rel.as_posix() in OUTPUTS:
        raise AccelerateError(f"external data file {loc} would be overwritten by ort-accelerate's own {loc}")
    return rel


def _replace(dst: Path, fill):
    """fill(a temporary file beside dst), then rename it over dst: an interrupted run leaves no half file.
    Returns what fill returns."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")  # opened by fill as usual: the umask's permissions
    try:
        result = fill(tmp)
        os.replace(tmp, dst)
        return result
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def place_file(src: Path, dst: Path) -> str:
    """dst as a copy of src (a copy-on-write clone where the file system can), with src's mtime; nothing when
    dst is src or an unchanged copy. Not a hard link: onnx.load refuses external data files with several
    links (a "potential hardlink attack"), so `imegen ort-model-check` and onnx tools could not load the model."""
    if dst.exists():
        if dst.resolve() == src.resolve():
            return "in place"
        s, d = src.stat(), dst.stat()
        if (s.st_size, s.st_mtime_ns) == (d.st_size, d.st_mtime_ns) and not os.path.samefile(src, dst):
            return "unchanged"
    return _replace(dst, lambda tmp: _copy(src, tmp))


def _copy(src: Path, dst: Path) -> str:
    how = "cloned" if _clone(src, dst) else "copied"
    if how == "copied":
        shutil.copyfile(src, dst)
    shutil.copystat(src, dst)  # the mtime: the next run sees an unchanged copy
    return how


def _clone(src: Path, dst: Path) -> bool:
    try:
        import fcntl

        with open(src, "rb") as s, open(dst, "wb") as d:
            fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
        return True
    except (ImportError, OSError):
        return False


def write_if_changed(path: Path, data: bytes) -> None:
    """Write data unless the file holds it already (a rerun: reading 1 GB costs less than writing it)."""
    if not _holds(path, data):
        _replace(path, lambda tmp: tmp.write_bytes(data))


def _holds(path: Path, data: bytes, chunk: int = 1 << 26) -> bool:
    """Whether the file at path holds exactly data (compared a chunk at a time)."""
    if not path.is_file() or path.stat().st_size != len(data):
        return False
    view = memoryview(data)
    with open(path, "rb") as f:
        for at in range(0, len(data), chunk):
            if f.read(chunk) != view[at:at + chunk]:
                return False
    return True


# ----------------------------------------------------------------------------- the command
@dataclass(frozen=True)
class Options:
    model: Path
    out_dir: Path
    spec: Path | None = None
    flavour: str = "hardware"
    compute: str | None = None  # None: by accuracy level
    target: str = "k1"
    ort_include: str | None = None
    decoder: bool = True  # also move the decoder's other nodes onto imegen's RVV operators (decoder_ops.py)
    decode: str | None = None  # int8 | hp (Board.hp_decode); None: the board's default


@dataclass(frozen=True)
class Outcome:
    report: str
    status: int  # 0: every node served; 3: some or none


def log(message: str) -> None:
    print(f"ort-accelerate: {message}", file=sys.stderr, flush=True)


def load_model(path: Path):
    try:
        return load_graph(path)
    except ModelFileError as e:
        raise AccelerateError(str(e)) from None


def quantization_words(need: NodeNeeds) -> str:
    return (f"{need.bits}-bit block {need.block} {'asymmetric' if need.asymmetric else 'symmetric'}"
            + (" with bias" if need.bias else ""))


def node_line(node: InspectedNode, decision, level_before: int, level_after: int) -> str:
    if not decision.moved:
        return f"kept {node.name}: {node.why_not or decision.detail}"
    need = node.need
    level = f"level {level_before}" + (f" -> {level_after}" if level_after != level_before else "")
    return f"served {node.name} (N={need.N}, K={need.K}, {quantization_words(need)}, {level}): {decision.detail}"


def summary_line(nodes: list[InspectedNode], decisions, n_kernels: int, opts: Options) -> str:
    served = sum(d.moved for d in decisions)
    if not nodes:
        return ("0 of 0 MatMulNBits nodes served: the model has no com.microsoft MatMulNBits node, so there is "
                "nothing to accelerate (nothing written but this report)")
    head = f"{served} of {len(nodes)} MatMulNBits nodes served"
    if served == len(nodes):
        return f"{head} by {n_kernels} kernels ({opts.flavour} flavour library)"
    reasons = Counter(n.why_not or d.detail for n, d in zip(nodes, decisions) if not d.moved)
    kept = "; ".join(f"{count} {why}" for why, count in reasons.items())
    return f"{head}; {len(nodes) - served} kept ({kept})" + ("" if served else "; no library built")


def for_board(nodes: list[InspectedNode], board: Board, compute: str | None) -> list[InspectedNode]:
    """The nodes with why_not also saying what the board's own kernels refuse."""
    return [replace(n, why_not=board_refusal(board, n.need, compute)) if n.need is not None and not n.why_not else n
            for n in nodes]


def board_of(opts: Options) -> Board:
    """The board --target names, with --decode hp where it takes it."""
    from .. import targets

    board = BOARDS[opts.target]
    has_hp = targets.get(board.ime_target).hp_decode_settings("gemv") is not None
    if opts.decode is not None and opts.spec is not None:
        raise AccelerateError(f"--decode {opts.decode} chooses derived kernels; with --spec the spec's are used")
    if opts.decode == "hp" and not has_hp:
        raise AccelerateError(f"--decode {opts.decode}: the {board.title}'s {board.ime_target} has no block-scaled "
                              f"FP16 vmadot (the K3's IME2 has: --target k3)")
    return replace(board, hp_decode=False) if opts.decode == "int8" else board


def _checked_output(opts: Options) -> Path:
    if opts.target not in BOARDS:
        raise AccelerateError(f"--target {opts.target}: unknown board (expected {' or '.join(BOARDS)})")
    board_of(opts)
    out = opts.out_dir
    if out.exists() and not out.is_dir():
        raise AccelerateError(f"-o {out}: exists and is not a folder")
    if (out / "model.onnx").exists() and os.path.samefile(out / "model.onnx", opts.model):
        raise AccelerateError(f"-o {out}: {out / 'model.onnx'} is MODEL itself; write to another folder")
    # A folder an earlier run wrote holds its report: only there may outputs be replaced or removed.
    foreign = [name for name in ("model.onnx", "libimegen_ort.so") if (out / name).exists()]
    if foreign and not (out / "report.txt").exists():
        raise AccelerateError(f"-o {out}: holds {' and '.join(foreign)}, which imegen ort-accelerate did not write "
                              "(no report.txt); write to an empty folder or one it wrote before")
    return out


# The attention kernel a derived spec holds for GroupQueryAttention nodes: the tile `imegen tune --attention` chose
# (attention_tuning.json; its counts and times in bench/results/attention_tune.txt), at VLEN 256: every K1 core.
ATTENTION_TUNING = Path(__file__).with_name("attention_tuning.json")


def attention_block() -> str:
    tuned = json.loads(ATTENTION_TUNING.read_text())
    return ("# gqa_attention: GroupQueryAttention's softmax(Q K^T) V, RVV fp32; tile (query rows x keys per block) from "
            f"imegen tune --attention\nattention gqa_attention {{\n  target       = rvv\n  vlen         = {tuned['vlen']}\n"
            f"  tile         = {tuned['tile']}\n}}\n")


def has_attention(model) -> bool:
    return any(n.op_type == "GroupQueryAttention" for n in model.graph.node)


def _kernels(opts: Options, nodes: list[InspectedNode], attention: bool = False
             ) -> tuple[list[KernelSpec], str, dict[int, Serving] | None]:
    """(specs, spec text, the kernels derived per node index or None for a given spec); `attention`: the derived
    spec also gets the tuned attention kernel (attention_block())."""
    if opts.spec is not None:
        return load_specs(opts.spec), opts.spec.read_text(), None
    derived = derive(nodes, compute=opts.compute, model_name=opts.model.name, board=board_of(opts))
    text = derived.text + ("\n" + attention_block() if attention and derived.specs and opts.decoder else "")
    return derived.specs, text, derived.intended


def _write_outputs(opts: Options, model, specs: list[KernelSpec], spec_text: str, externals: list[Path]) -> None:
    out = opts.out_dir
    spec_out = out / "model.imegen"
    if not (opts.spec and spec_out.exists() and os.path.samefile(opts.spec, spec_out)):
        write_if_changed(spec_out, spec_text.encode())
    log(f"building the library ({sum(s.abi == 'imegen' for s in specs)} kernels, {opts.flavour} flavour)...")
    from .customop import build_library

    lib = build_library(specs, str(spec_out), flavour=opts.flavour, ort_include=opts.ort_include,
                        attention=attention_specs_from_text(spec_text, str(spec_out)))
    write_if_changed(out / "libimegen_ort.so", lib.read_bytes())
    log(f"writing {out / 'model.onnx'}...")
    # The protobuf as loaded, without its external data: it names the same files. (onnx.save would also walk
    # every tensor for external data to write, which it does not hold: twice the time on a 1 GB model.)
    write_if_changed(out / "model.onnx", model.SerializeToString())
    for rel in externals:
        how = place_file(opts.model.parent / rel, out / rel)
        if how in ("cloned", "copied"):
            log(f"{how} external data {rel}")


def _remove_stale_outputs(opts: Options) -> None:
    """Nothing runs on imegen: no model or library of an earlier run may stay to be loaded by mistake."""
    for name in ("model.onnx", "libimegen_ort.so", "model.imegen"):
        path = opts.out_dir / name
        if path.exists() and not os.path.samefile(path, opts.model):
            path.unlink()


def accelerate(opts: Options) -> Outcome:
    from .rewrite import fold_bias_adds, lower_to_fp32, rewrite

    if opts.model.is_file() and opts.model.stat().st_size > BIG_MODEL:
        log(f"reading {opts.model} ({opts.model.stat().st_size >> 20} MiB)...")
    model = load_model(opts.model)
    out = _checked_output(opts)
    folded = fold_bias_adds(model, load_specs(opts.spec) if opts.spec else None)
    nodes = for_board(inspect_model(model), board_of(opts), opts.compute) if opts.spec is None else \
        inspect_model(model)
    externals = [_own_location(loc, opts.model.parent) for loc in external_files(model)]
    specs, spec_text, intended = _kernels(opts, nodes, has_attention(model))
    lowered = lower_to_fp32(model, specs) if opts.compute == "fp32" else set()
    decisions = rewrite(model, specs, int8_compute=opts.compute == "int8")
    if intended is not None:  # the rewrite moved exactly the nodes derived for, onto their kernels
        assert {i for i, d in enumerate(decisions) if d.moved} == set(intended), (decisions, intended)
        assert all(decisions[i].serving == s for i, s in intended.items()), (decisions, intended)
    served = [d for d in decisions if d.moved]
    attention = bool(served) and bool(attention_specs_from_text(spec_text, "model.imegen"))
    decoder = rewrite_decoder_ops(model, attention=attention) if served and opts.decoder else []
    out.mkdir(parents=True, exist_ok=True)
    if served:
        _write_outputs(opts, model, specs, spec_text, externals)
    else:
        _remove_stale_outputs(opts)
    used = {name for d in served for name in d.serving.names()}
    lines = [node_line(n, d, *_levels(n, d, i in lowered)) for i, (n, d) in enumerate(zip(nodes, decisions))]
    lines += [decoder_line(d) for d in decoder]
    lines += notes(decisions, lowered, opts)
    if opts.decode == "hp" and not any(s.hp_blocks for s in specs if s.name in used):
        lines.append("note: --decode hp: no served node is in the .hp gemv's format (4-bit, symmetric, block 32, int8 "
                     "compute): every node decodes on the int8 gemv")
    if folded and served:
        lines.append(f"note: {len(folded)} bias Adds folded into their MatMulNBits nodes' bias input (what ORT's own "
                     "optimizer does to com.microsoft nodes; imegen's kernels add the bias in their epilogue)")
    lines.append(summary_line(nodes, decisions, len(used), opts) + (f"; {decoder_summary(decoder)}" if decoder else ""))
    report = "\n".join(lines) + "\n"
    write_if_changed(out / "report.txt", report.encode())
    all_served = nodes and len(served) == len(nodes) and all(d.moved for d in decoder)
    return Outcome(report, 0 if all_served else 3)


def decoder_line(d: DecoderDecision) -> str:
    return f"{'served' if d.moved else 'kept'} {d.node} ({d.op}): {d.detail}"


def decoder_summary(decoder: list[DecoderDecision]) -> str:
    served = Counter(d.op for d in decoder if d.moved)
    kept = Counter(d.op for d in decoder if not d.moved)
    words = ", ".join(f"{op} {n}" for op, n in served.items()) or "none"
    tail = f"; kept: {', '.join(f'{op} {n}' for op, n in kept.items())}" if kept else ""
    return f"{sum(served.values())} of {len(decoder)} other decoder nodes on imegen's RVV operators ({words}){tail}"


def _levels(node: InspectedNode, decision, lowered: bool) -> tuple[int, int]:
    """The node's accuracy_level in MODEL and in OUT_DIR/model.onnx."""
    before = node.need.accuracy_level if node.need else 0
    return before, INT8_LEVEL if decision.level_raised else FP32_LEVEL if lowered else before


def notes(decisions, lowered: set[int], opts: Options) -> list[str]:
    out = []
    if any(d.level_raised for d in decisions):
        out.append("note: --compute int8 runs accuracy_level 0-3 nodes with int8 compute (accuracy_level 4 in "
                   "model.onnx): their results change from ORT's fp32 contract to its level-4 (int8) tolerance")
    if lowered:
        out.append("note: --compute fp32 runs accuracy_level 4 nodes in fp32 (accuracy_level 0 in model.onnx): "
                   "slower than IME, and at least as accurate as ORT's level 4")
    if opts.flavour == "qemu" and any(d.moved for d in decisions):
        vlen = BOARDS[opts.target].ime_vlen
        out.append(f"note: qemu flavour: libimegen_ort.so emulates IME under QEMU (-cpu rv64,v=true,vlen={vlen},Zfh=true); "
                   "never load it on hardware")
    return out


def add_matmul_only(parser) -> None:
    """--matmul-only, as ort-accelerate, ort-rewrite and ort-model-check take it."""
    parser.add_argument("--matmul-only", action="store_true",
                        help="move only MatMulNBits nodes: keep the decoder's norms, SiLU and attention on ORT's own "
                             "kernels (default: imegen's RVV operators serve the forms they can)")


def add_parser(sub) -> None:
    p = add_command(sub, "ort-accelerate", "rewrite an int4/int8 ONNX model for a K1 (or K3) and build its custom-op "
                    "library, kernels chosen per node shape (no spec needed)")
    p.add_argument("model", help="the ONNX model (int4/int8 MatMulNBits nodes, e.g. onnxruntime-genai's int4 export)")
    p.add_argument("-o", "--output", required=True, metavar="OUT_DIR",
                   help="folder for model.onnx, libimegen_ort.so, model.imegen and report.txt")
    p.add_argument("--target", choices=TARGETS, default="k1",
                   help="the board: k1 (IME on cores 0-3; default) or k3 (IME2 on the A100 cores, VLEN 1024; its "
                        "kernels untuned)")
    p.add_argument("--flavour", choices=("hardware", "qemu"), default="hardware",
                   help="hardware (the board; default) or qemu (IME emulated; for QEMU only)")
    p.add_argument("--spec", metavar="SPEC",
                   help="use this spec's kernels instead of deriving them (e.g. an edited OUT_DIR/model.imegen)")
    p.add_argument("--decode", choices=("int8", "hp"), default=None,
                   help="K3: 4-bit symmetric block-32 int8-compute nodes (Q4_0's format: onnxruntime-genai's int4 "
                        "export) decode through block-scaled FP16 vmadots (hp, the K3's default: about half the "
                        "instructions of the int8 gemv; within ORT's level-4 tolerance with a 3x margin at "
                        "Qwen2.5-0.5B's shapes, docs/ime2-isa.md 10.8), prefill on the int8 gemm reading the same "
                        "packed weights (FP16 scales); int8: the int8 gemv and gemm with ORT's fp32 scales")
    p.add_argument("--compute", choices=("fp32", "int8"), default=None,
                   help="default: by accuracy_level (4: int8 on IME; 0-3: fp32 on RVV). int8 runs every node on "
                        "IME (changes levels 0-3's numerics to ORT's level-4 tolerance); fp32 every node on RVV fp32")
    p.add_argument("--ort-include", metavar="DIR",
                   help="build against this folder's onnxruntime_c_api.h (ORT 1.21 or newer), e.g. the board's "
                        "/usr/include/onnxruntime (default: Debian's ORT 1.21 header)")
    add_matmul_only(p)


def run_command(args) -> int:
    """`imegen ort-accelerate`; status 0 (all served), 3 (some or none), 2 (a user error)."""
    from .customop import CustomOpError

    opts = Options(Path(args.model), Path(args.output), Path(args.spec) if args.spec else None, args.flavour,
                   args.compute, args.target, args.ort_include, not args.matmul_only, args.decode)
    try:
        outcome = accelerate(opts)
    except (AccelerateError, CustomOpError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    print(outcome.report, end="")
    return outcome.status
