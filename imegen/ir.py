"""Stage 2: raw settings -> a validated, frozen KernelSpec.

Every rule that decides whether a kernel can run on its target is applied here, so a spec is
either refused here (with the position of the offending setting and the reason) or is known to be
generatable. The generic rules live in this file; each target's own (imegen/targets/NAME) are asked
through its Target hooks (validate, mlas_refusal, options, register_budget).
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

from . import targets
from .errors import Span, SpecError
from .names import dispatch_files, dispatch_prefix, reserved_names
from .parse import Block, Setting, ValueList, parse_file, parse_text
from .spec import AttentionSpec, KernelSpec
from .targets.base import VECTOR_REGISTERS

# key -> (field name, allowed values or a type). Order is the order shown in error messages.
_CHOICES: dict[str, tuple[str, object]] = {
    "op": ("op", ("gemm", "gemv")),
    "bits": ("bits", (4, 8)),
    "block": ("block", (16, 32, 64, 128, 256)),
    "zero_point": ("zero_point", ("symmetric", "asymmetric")),
    "bias": ("bias", ("yes", "no")),
    "compute": ("compute", ("fp32", "int8")),
    "target": ("target", targets.NAMES),
    "vlen": ("vlen", (128, 256, 512, 1024)),
    "tile": ("tile", tuple),  # each dimension in TILE_RANGE
    "k_unroll": ("k_unroll", (1, 2, 4, 8)),
    "unpack": ("unpack", ("planar", "interleaved")),
    "panel": ("panel", int),  # in PANEL_RANGE
    "scales": ("scales", ("inline", "separate")),
    "abi": ("abi", ("imegen", "mlas")),
    "scale_type": ("scale_type", ("fp32", "fp16")),
    "stage_b": ("stage_b", ("tile", "m_block")),
    "spread": ("spread", ("group", "per_register")),
    "a_scale_type": ("a_scale_type", ("fp32", "fp16")),
    "hp_blocks": ("hp_blocks", (0, 1, 2, 4, 8)),
    "b_pack": ("b_pack", ("plain", "hp")),
    "shapes": ("shapes", list),  # NxK weight shapes, comma-separated; each dimension in DIM_RANGE
    "min_rows": ("min_rows", "rows"),  # in ROWS_RANGE
    "fallback": ("fallback", ("yes", "no")),
}

# Ranges of the free-form numbers (the other numeric settings are choices above), with why.
TILE_MAX = 256  # rvv at VLEN 1024 holds at most 256 fp32 columns (LMUL 8); scalar at most 256 accumulators
TILE_RANGE = (1, TILE_MAX, "no target holds more than 256 accumulator rows or columns in registers")
PANEL_RANGE = (1, TILE_MAX, "a panel is a multiple of the tile width (at most 256), and wider panels only pad N")

MAX_DIM = 1 << 24  # IMEGEN_MAX_DIM: the largest M, N or K a generated kernel takes
DIM_RANGE = (1, MAX_DIM, "imegen's kernels take M, N and K up to 2^24")
ROWS_RANGE = (2, MAX_DIM, "a gemm kernel serves M > 1 rows (M = 1 is a gemv kernel's), up to 2^24")

MAX_NAME = 200  # kernel names: file names are at most 255 bytes, and build folders add a suffix

MLAS_N_ALIGN = 16  # MLAS_QGEMM_STRIDEN_THREAD_ALIGN: MLAS hands kernels column ranges starting at multiples of 16


def _fmt(values) -> str:
    return ", ".join(str(v) for v in values)


def _shown(value) -> str:
    """A setting's value as written in the spec (tiles as MxN)."""
    return f"{value[0]}x{value[1]}" if isinstance(value, tuple) else repr(value)


def _check_value(s: Setting):
    if s.key not in _CHOICES:
        raise SpecError(s.span, f"unknown setting '{s.key}'; expected one of: {_fmt(_CHOICES)}")
    _, allowed = _CHOICES[s.key]
    if allowed is list:
        return _check_shapes(s)
    if isinstance(s.value, ValueList):
        raise SpecError(s.value_span, f"'{s.key}' takes one value, got a list of {len(s.value)}")
    if allowed == "rows":
        if not isinstance(s.value, int):
            raise SpecError(s.value_span, f"'{s.key}' expects a number of rows, got {_shown(s.value)}")
        _check_range(s, f"'{s.key}'", s.value, ROWS_RANGE)
        return s.value
    if allowed is tuple:
        if not isinstance(s.value, tuple):
            raise SpecError(s.value_span, f"'{s.key}' expects a tile MxN such as 4x16, got {_shown(s.value)}")
        if min(s.value) < 1:
            raise SpecError(s.value_span, f"tile dimensions must be positive, got {s.value[0]}x{s.value[1]}")
        _check_range(s, "tile dimensions", max(s.value), TILE_RANGE)
        return s.value
    if allowed is int:
        if not isinstance(s.value, int) or s.value < 1:
            raise SpecError(s.value_span, f"'{s.key}' expects a positive integer, got {_shown(s.value)}")
        _check_range(s, f"'{s.key}'", s.value, PANEL_RANGE)
        return s.value
    if s.value not in allowed:
        raise SpecError(s.value_span, f"'{s.key}' must be one of: {_fmt(allowed)}; got {_shown(s.value)}")
    return s.value


def _check_shapes(s: Setting) -> tuple[tuple[int, int], ...]:
    """`shapes = NxK[, NxK ...]`: the weight shapes a kernel was chosen for, each N x K once."""
    values = tuple(s.value) if isinstance(s.value, ValueList) else (s.value,)
    for v in values:
        if not isinstance(v, tuple):
            raise SpecError(s.value_span, f"'{s.key}' expects weight shapes NxK such as 1152x896, got {_shown(v)}")
        if not all(DIM_RANGE[0] <= d <= DIM_RANGE[1] for d in v):
            raise SpecError(s.value_span, f"shape {v[0]}x{v[1]}: N and K must be 1..{MAX_DIM}: {DIM_RANGE[2]}")
    if len(set(values)) != len(values):
        twice = next(v for v in values if values.count(v) > 1)
        raise SpecError(s.value_span, f"shape {twice[0]}x{twice[1]} is listed twice")
    return values


def _check_range(s: Setting, what: str, value: int, limits: tuple[int, int, str]) -> None:
    low, high, why = limits
    if not low <= value <= high:
        raise SpecError(s.value_span, f"{what} must be {low}..{high}, got {_shown(s.value)}: {why}")


def _collect(settings: tuple[Setting, ...], into: dict[str, Setting]) -> None:
    seen: set[str] = set()
    for s in settings:
        _check_value(s)
        if s.key in seen:
            raise SpecError(s.span, f"'{s.key}' is set twice in this block")
        seen.add(s.key)
        into[s.key] = s


def register_budget(spec: KernelSpec) -> dict[str, int]:
    """Vector registers the kernel's inner loop keeps live, by class (empty for scalar)."""
    return targets.of(spec).register_budget(spec)


# DSL settings whose non-default values only some target offers (Target.options), in the order checked.
_TARGET_OPTIONS = ("stage_b", "spread", "a_scale_type", "hp_blocks", "b_pack")
_DEFAULTS = {f.name: f.default for f in fields(KernelSpec)}


def _refuse(where: dict[str, Setting], key: str, fallback: Span | None, message: str):
    raise SpecError(where[key].span if key in where else fallback, message)


def build_spec(name: str, s: dict[str, Setting], span: Span | None) -> KernelSpec:
    """Turn one kernel's settings (defaults merged in) into a KernelSpec, or refuse it."""
    kw: dict[str, object] = {}
    for key, setting in s.items():
        field_name = _CHOICES[key][0]
        if key == "tile":
            kw["tile_m"], kw["tile_n"] = setting.value
        elif key in ("bias", "fallback"):
            kw[key] = setting.value == "yes"
        elif key == "shapes":
            kw["shapes"] = _check_shapes(setting)
        else:
            kw[field_name] = setting.value
    spec = KernelSpec(name=name, source=span, **kw)

    def refuse(key: str, message: str):
        _refuse(s, key, span, f"kernel '{name}': {message}")

    target = targets.of(spec)

    if spec.abi == "mlas":
        runtime = {"zero_point": "zero points from ORT at run time (packed uint8, or NULL when symmetric)",
                   "bias": "the bias from ORT at run time (or NULL)", "scales": "ORT's raw scale array"}
        for key, what in runtime.items():
            if key in s:
                refuse(key, f"abi mlas takes {what}; remove '{key}'")
        if spec.bits == 8 and spec.compute != "int8":
            refuse("compute", "MLAS runs 8-bit weights only as CompInt8 (its BlkSum kernels); for CompFp32 ORT "
                   "dequantizes 8-bit B itself, so abi mlas with bits = 8 needs compute = int8")
        if MLAS_N_ALIGN % spec.panel:
            refuse("panel", f"abi mlas: panel {spec.panel} must divide {MLAS_N_ALIGN}, because MLAS offsets packed B by "
                   f"RangeStartN * ldb with RangeStartN a multiple of {MLAS_N_ALIGN}")
        why = target.mlas_refusal(spec)
        if why:
            refuse(*why)
        # Zero points and bias arrive (or not) at run time; the kernels handle both. 8-bit: MLAS
        # hands zero points over as per-block sums (see KernelPlan.blksum).
        spec = replace(spec, zero_point="blksum" if spec.bits == 8 else "asymmetric", bias=False, scales="ort")
    if spec.scale_type == "fp16":
        if spec.abi == "mlas":
            refuse("scale_type", "abi mlas reads ORT's fp32 scale array; fp16 scales need abi = imegen")
        if spec.compute != "int8":
            refuse("scale_type", "fp16 scales (11-bit mantissa) put fp32-compute results outside ORT's accuracy_level 0/1 "
                   "tolerance; use them with compute = int8")
    for key in _TARGET_OPTIONS:
        if getattr(spec, key) != _DEFAULTS[key]:
            why = targets.option_refusal(key, spec)
            if why:
                refuse(key, why)
    if spec.op == "gemv" and "min_rows" in s:
        refuse("min_rows", "a gemv kernel serves M = 1; min_rows chooses among gemm kernels")
    if spec.fallback and target.fallback_refusal:
        refuse("fallback", target.fallback_refusal)
    if spec.fallback and spec.abi == "mlas":
        refuse("fallback", "fallback kernels serve imegen's custom-op library (abi = imegen); MLAS has no IME routing")
    if spec.op == "gemv" and spec.tile_m != 1:
        refuse("tile", f"a gemv kernel computes one row at a time, so its tile must be 1xN, not {spec.tile_m}x{spec.tile_n}")
    if spec.panel % spec.tile_n:
        if "panel" in s:
            refuse("panel", f"panel width {spec.panel} must be a multiple of the tile width {spec.tile_n}")
        refuse("tile", f"tile width {spec.tile_n} does not divide the default panel width {spec.panel}; set panel to "
               f"a multiple of {spec.tile_n} (e.g. panel = {spec.tile_n})")

    spec = target.validate(spec, refuse)

    budget = register_budget(spec)
    if sum(budget.values()) > VECTOR_REGISTERS:
        parts = ", ".join(f"{k} {v}" for k, v in budget.items())
        refuse("tile", f"tile {spec.tile_m}x{spec.tile_n} with k_unroll {spec.k_unroll} needs "
               f"{sum(budget.values())} vector registers ({parts}) > {VECTOR_REGISTERS}")
    return spec


def specs_from_blocks(blocks: list[Block], filename: str | None = None) -> list[KernelSpec]:
    defaults: dict[str, Setting] = {}
    specs: list[KernelSpec] = []
    names: dict[str, Span] = {}
    for block in blocks:
        if block.kind == "defaults":
            _collect(block.settings, defaults)
            continue
        if block.kind == "attention":  # attention_specs_from_blocks builds these
            names[block.name] = block.span
            continue
        if block.name in names:
            raise SpecError(block.span, f"kernel '{block.name}' is already defined at {names[block.name]}")
        if len(block.name) > MAX_NAME:
            raise SpecError(block.span, f"kernel name of {len(block.name)} characters; at most {MAX_NAME} (its files, "
                            "and imegen's build folders named after it, must stay within 255-byte file names)")
        if block.name.lower() in reserved_names():
            raise SpecError(block.span, f"kernel name '{block.name}' is reserved: imegen would put "
                            f"{reserved_names()[block.name.lower()]} next to the kernel's files")
        twin = next((n for n in names if n.lower() == block.name.lower()), None)
        if twin:
            raise SpecError(block.span, f"kernel '{block.name}' differs from '{twin}' ({names[twin]}) only in case: their "
                            "files would collide on case-insensitive file systems (and their include guards everywhere)")
        names[block.name] = block.span
        own: dict[str, Setting] = {}
        _collect(block.settings, own)
        specs.append(build_spec(block.name, {**defaults, **own}, block.span))
    if not specs and not any(b.kind == "attention" for b in blocks):
        where = blocks[0].span if blocks else (Span(filename, 1, 1) if filename else None)
        raise SpecError(where, "the spec defines no kernel")
    if filename is not None and any(s.abi == "mlas" for s in specs):
        _check_dispatch_names(specs, filename)
    _check_dispatch_vlens(specs)
    return specs


def _check_dispatch_names(specs: list[KernelSpec], filename: str) -> None:
    """The MLAS dispatch's files and symbol prefix come from the spec's file name: no kernel may
    produce the same file stem (in any case) or the same C symbols."""
    prefix = dispatch_prefix(filename)
    files: dict[str, list[str]] = {}
    for f in dispatch_files(prefix):
        files.setdefault(Path(f).stem.lower(), []).append(f)
    for spec in specs:
        if spec.name.lower() in files:
            clash = f"the MLAS dispatch's {' and '.join(files[spec.name.lower()])}"
        elif spec.name == prefix[:-1]:
            clash = f"the MLAS dispatch's C symbols ({prefix}supported, ...)"
        else:
            continue
        raise SpecError(spec.source, f"kernel '{spec.name}' would collide with {clash}, which {Path(filename).name} "
                        f"generates for its abi = mlas kernels: rename the kernel")


def _check_dispatch_vlens(specs: list[KernelSpec]) -> None:
    """A spec's abi = mlas kernels form one MLAS dispatch, whose supported() holds only where every one of
    them runs (Target.accepts_vlen: VLEN = 256 for IME, VLEN >= vlen for RVV). A kernel whose target runs
    at one VLEN only (IME: 256) fixes the dispatch's; a kernel that refuses that VLEN leaves no hart where
    MLAS would install the dispatch."""
    mlas = [s for s in specs if s.abi == "mlas"]
    pinned = next((s for s in mlas if targets.of(s).only_vlen is not None), None)
    if pinned is None:
        return
    vlen = targets.of(pinned).only_vlen
    for spec in mlas:
        if not targets.of(spec).accepts_vlen(spec, vlen):
            raise SpecError(spec.source, f"kernel '{spec.name}': needs {targets.of(spec).vlen_need(spec)}, but it shares "
                            f"the MLAS dispatch (all abi = mlas kernels of a spec) with {targets.of(pinned).title} kernel "
                            f"'{pinned.name}', which runs only at VLEN = {vlen}: the dispatch's supported() would be false "
                            f"on every hart; use vlen <= {vlen}, or abi = imegen")



# attention blocks: key -> allowed values (their own keys; `defaults` blocks hold MatMulNBits settings and do
# not apply to them)
_ATTENTION_CHOICES: dict[str, tuple] = {"target": ("rvv",), "vlen": (128, 256, 512, 1024), "tile": ()}


def _attention_setting(name: str, s: Setting):
    if s.key not in _ATTENTION_CHOICES:
        raise SpecError(s.span, f"attention '{name}': unknown setting '{s.key}'; an attention kernel takes: "
                        f"{_fmt(_ATTENTION_CHOICES)} (tile = query rows x keys per block)")
    if s.key == "tile":
        if not isinstance(s.value, tuple):
            raise SpecError(s.value_span, f"attention '{name}': 'tile' expects query rows x keys per block such as "
                            f"4x16, got {_shown(s.value)}")
        return s.value
    if s.value not in _ATTENTION_CHOICES[s.key]:
        extra = " (attention kernels exist for target rvv)" if s.key == "target" else ""
        raise SpecError(s.value_span, f"attention '{name}': '{s.key}' must be one of: "
                        f"{_fmt(_ATTENTION_CHOICES[s.key])}; got {_shown(s.value)}{extra}")
    return s.value


def build_attention(block: Block) -> AttentionSpec:
    """One attention block -> a validated AttentionSpec, or a SpecError at the offending setting."""
    own: dict[str, Setting] = {}
    kw: dict[str, object] = {}
    for s in block.settings:
        value = _attention_setting(block.name, s)
        if s.key in own:
            raise SpecError(s.span, f"'{s.key}' is set twice in this block")
        own[s.key] = s
        if s.key == "tile":
            kw["q_rows"], kw["kv_block"] = value
        else:
            kw[s.key] = value
    spec = AttentionSpec(name=block.name, source=block.span, **kw)

    def refuse(key: str, message: str):
        _refuse(own, key, block.span, f"attention '{block.name}': {message}")

    return targets.get(spec.target).validate_attention(spec, refuse)


def attention_specs_from_blocks(blocks: list[Block]) -> list[AttentionSpec]:
    """The spec's attention kernels, validated (names are checked with the kernels' by specs_from_blocks)."""
    return [build_attention(b) for b in blocks if b.kind == "attention"]


def load_attention_specs(path: str | Path) -> list[AttentionSpec]:
    blocks = parse_file(path)
    specs_from_blocks(blocks, str(path))  # the whole file must be a valid spec
    return attention_specs_from_blocks(blocks)


def attention_specs_from_text(text: str, filename: str = "<spec>") -> list[AttentionSpec]:
    blocks = parse_text(text, filename)
    specs_from_blocks(blocks, filename)
    return attention_specs_from_blocks(blocks)


def load_specs(path: str | Path) -> list[KernelSpec]:
    return specs_from_blocks(parse_file(path), str(path))


def specs_from_text(text: str, filename: str = "<spec>") -> list[KernelSpec]:
    return specs_from_blocks(parse_text(text, filename), filename)
