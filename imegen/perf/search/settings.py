"""A kernel config as a settings dict (DSL key -> value), and the way to and from a KernelSpec: every
config the tuner or the bench builds is written as DSL text and goes through imegen's own parser and
validator (validate), so a config the validator refuses is never built."""

from __future__ import annotations

from ... import targets
from ...errors import SpecError
from ...ir import KernelSpec, specs_from_text

ORDER = ("op", "bits", "block", "zero_point", "bias", "compute", "target", "vlen", "tile", "k_unroll",
         "unpack", "panel", "scales", "scale_type", "stage_b", "spread", "a_scale_type")


def spec_text(name: str, settings: dict[str, object]) -> str:
    body = "\n".join(f"  {k:<10} = {settings[k]}" for k in ORDER if k in settings)
    return f"kernel {name} {{\n{body}\n}}\n"


def config_name(settings: dict[str, object]) -> str:
    """A readable name that identifies a config (kernel names are C prefixes)."""
    s = settings
    tile = str(s["tile"])
    parts = [str(s["target"]), str(s["compute"]), str(s["op"]), tile, f"k{s['k_unroll']}",
             str(s["unpack"])[:2], f"p{s['panel']}", str(s["scales"])[:3], f"b{s['block']}"]
    if s.get("scale_type", "fp32") != "fp32":
        parts.append(str(s["scale_type"]))
    if s.get("stage_b", "tile") != "tile":
        parts.append("staged")
    if s.get("spread", "group") != "group":
        parts.append("spreadreg")
    if s.get("a_scale_type", "fp32") != "fp32":
        parts.append("a16")
    if "vlen" in s:
        parts.insert(3, f"v{s['vlen']}")
    return "_".join(parts)


def validate(settings: dict[str, object]) -> KernelSpec | SpecError:
    """Through the DSL's own parser and validator; returns the spec or the refusal."""
    name = config_name(settings)
    try:
        (spec,) = specs_from_text(spec_text(name, settings), f"<tune:{name}>")
        return spec
    except SpecError as e:
        return e


def _takes_vlen(spec: KernelSpec) -> bool:
    """Whether the DSL's vlen is a setting of spec's target: vector targets that run at more than one VLEN."""
    target = targets.of(spec)
    return target.vector and target.only_vlen is None


def settings_of(spec: KernelSpec) -> dict[str, object]:
    d = {"op": spec.op, "bits": spec.bits, "block": spec.block, "zero_point": spec.zero_point,
         "bias": "yes" if spec.bias else "no", "compute": spec.compute, "target": spec.target,
         "tile": f"{spec.tile_m}x{spec.tile_n}", "k_unroll": spec.k_unroll, "unpack": spec.unpack,
         "panel": spec.panel, "scales": spec.scales, "scale_type": spec.scale_type}
    if _takes_vlen(spec):
        d["vlen"] = spec.vlen
    if spec.stage_b != "tile":
        d["stage_b"] = spec.stage_b
    if spec.spread != "group":
        d["spread"] = spec.spread
    if spec.a_scale_type != "fp32":
        d["a_scale_type"] = spec.a_scale_type
    return d
