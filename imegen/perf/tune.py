"""`imegen tune`: search IME tile configs under the X60 cost model, per MatMulNBits shape.

Search space (4-bit weights, asymmetric zero points, int8 compute, target ime):
  stage 1 (register blocking and K unroll): op gemv with tile 1xTN, or op gemm with tile TMxTN,
          TM in {4, 8, 12, 16}, TN in {4, 8, ..., 32}, k_unroll in {1, 2, 4, 8}; unpack planar,
          panel = TN, scales inline;
  stage 2 (layout): for the best two stage-1 configs of every shape, every unpack in {planar,
          interleaved}, panel in {TN, 2 TN, 4 TN}, scales in {inline, separate} and scale_type in
          {fp32, fp16} (fp16 halves the scale bytes that DRAM-bound decode streams; with int8
          compute its rounding is far inside ORT's accuracy_level 4 tolerance); for 4x8 and 8x8
          leaders at k_unroll 2 also stage_b = m_block (B unpacked once per M block), with fp16 B
          scales there and in gemv also a_scale_type = fp16 (the fold's vfwmul of two fp16
          scales), and for the
          leaders ir.spread_refusal admits spread = per_register (the fold's scale spreads by LMUL-1
          vrgathers), every panel and scale type, planar and inline;
Every candidate is written as DSL text and goes through imegen's own parser and validator
(ir.specs_from_text); the ones it refuses (register budget, k_unroll vs block, ...) are
reported with the validator's message and never built. Valid ones are measured (measure.py,
cached) and modeled (x60.py). The best config per shape minimises the modeled time on 4 IME
cores (times within TIE = 1% of the best count as tied), then on 1 core, then the core-side time on 1 core (what is left when DRAM binds), then
fewer retired instructions, then the spec text: the choice is deterministic, and a rerun with the same sources reproduces it
from the count cache.

Which time (RANKINGS): the model's vector-unit charges ("model"), LLVM's hardware-measured X60
occupancies ("measured", docs/ime-isa.md §7), or by default each config's slower of the two
("robust"). The two disagree by up to 8x on the gather-heavy folds (the model charges an LMUL-4
vrgather 4 cycles, the hardware takes 64), and nothing on this machine says which is right on a
K1: a config chosen by the worse case is one neither view can make slow.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from ..ir import KernelSpec, specs_from_text
from ..plan import plan_kernel
from . import measure, occupancy, x60
from .workload import BLOCKS, DECODE_M, PREFILL_M, shapes

TIE = 0.01  # relative 4-core time difference below which configs count as tied
RANKINGS = ("robust", "model", "measured")  # the cost the tuner ranks by (Evaluation.times); the first is the default

ORDER = ("op", "bits", "block", "zero_point", "bias", "compute", "target", "vlen", "tile", "k_unroll",
         "unpack", "panel", "scales", "scale_type", "stage_b", "spread", "a_scale_type")


@dataclass(frozen=True)
class Case:
    """One tuning target: a weight shape at one M and block size."""

    shape: str
    M: int
    N: int
    K: int
    block: int

    @property
    def mnk(self) -> tuple[int, int, int]:
        return self.M, self.N, self.K

    @property
    def label(self) -> str:
        return f"{self.shape} M={self.M} block={self.block}"

    @property
    def ident(self) -> str:
        return f"qwen_{self.shape.replace('/', '_')}_m{self.M}_b{self.block}"


def cases(*, blocks=BLOCKS, ms=(DECODE_M, *PREFILL_M), only_shapes: tuple[str, ...] | None = None) -> list[Case]:
    return [Case(s.name, M, s.N, s.K, b) for b in blocks for s in shapes()
            if only_shapes is None or s.name in only_shapes for M in ms]


def targets(*, quick: bool = False, blocks=BLOCKS) -> list[Case]:
    """What `imegen tune`/`bench` cover: every Qwen shape x M x block, or the --quick CI subset
    (the q/o shape at M = 1 and 128, the first block)."""
    if quick:
        return cases(blocks=blocks[:1], ms=(DECODE_M, PREFILL_M[0]), only_shapes=("q/o",))
    return cases(blocks=blocks)


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


def base_settings(block: int) -> dict[str, object]:
    return {"bits": 4, "block": block, "zero_point": "asymmetric", "bias": "no", "compute": "int8", "target": "ime"}


def stage1(block: int, *, quick: bool = False) -> list[dict[str, object]]:
    tms = (1, 4, 8) if quick else (1, 4, 8, 12, 16)
    tns = (8, 16, 24) if quick else tuple(range(4, 33, 4))
    kus = (1, 2, 4) if quick else (1, 2, 4, 8)
    out = []
    for tm in tms:
        for tn in tns:
            for ku in kus:
                out.append({**base_settings(block), "op": "gemv" if tm == 1 else "gemm", "tile": f"{tm}x{tn}",
                            "k_unroll": ku, "unpack": "planar", "panel": tn, "scales": "inline"})
    # B staged per M block changes what binds (unpack once per M block), not only a layout: it competes
    # here (with fp32 scales, like everything in stage 1), so a different leader cannot keep it and its
    # fp16 variants (stage 2) from being measured.
    return out + [{**st, "stage_b": "m_block"} for st in out if isinstance(validate({**st, "stage_b": "m_block"}), KernelSpec)]


def stage2(settings: dict[str, object], *, quick: bool = False) -> list[dict[str, object]]:
    tn = int(str(settings["tile"]).split("x")[1])
    panels = (tn,) if quick else tuple(p for p in (tn, 2 * tn, 4 * tn) if p <= 128)
    layouts = [{**settings, "unpack": u, "panel": p, "scales": sc, "scale_type": st}
               for u in ("planar", "interleaved") for p in panels for sc in ("inline", "separate") for st in ("fp32", "fp16")]
    if settings["op"] == "gemv":  # its fold multiplies fp16 A and B scales in one vfwmul.vf (ir.a_fp16_refusal)
        layouts += [{**lay, "a_scale_type": "fp16"} for lay in layouts if lay["scale_type"] == "fp16"]
    plain = {k: v for k, v in settings.items() if k != "spread"}  # a16 spreads its e16 scales per register already
    if str(settings["tile"]) in ("4x8", "8x8") and settings["k_unroll"] == 2:  # what ir.staged_b_refusal allows
        layouts += [{**settings, "panel": p, "scale_type": st, "stage_b": "m_block", **sp} for p in panels for st in ("fp32", "fp16")
                    for sp in ({}, {"spread": "per_register"})]
        layouts += [{**plain, "panel": p, "scale_type": "fp16", "stage_b": "m_block", "a_scale_type": "fp16"} for p in panels]
    if str(settings["tile"]) in ("8x8", "8x12") and settings["k_unroll"] == 2:  # staged 8x12: fp16 A scales only
        layouts += [{**plain, "tile": "8x12", "panel": p, "scale_type": "fp16", "stage_b": "m_block", "a_scale_type": "fp16"}
                    for p in ((12,) if quick else (12, 24, 48))]
    if isinstance(validate({**settings, "spread": "per_register"}), KernelSpec):  # what ir.spread_refusal allows
        layouts += [{**settings, "panel": p, "scale_type": st, "spread": "per_register"} for p in panels for st in ("fp32", "fp16")]
    return layouts


def validate(settings: dict[str, object]) -> KernelSpec | SpecError:
    """Through the DSL's own parser and validator; returns the spec or the refusal."""
    name = config_name(settings)
    try:
        (spec,) = specs_from_text(spec_text(name, settings), f"<tune:{name}>")
        return spec
    except SpecError as e:
        return e


@dataclass(frozen=True)
class Evaluation:
    spec: KernelSpec
    case: Case
    counts: dict[str, float]  # one core, whole shape
    one_core: x60.Modeled
    four_cores: x60.Modeled
    # The same on 1 and 4 cores with the vector units' cycles from LLVM's hardware-measured X60
    # occupancies (x60.core_cycles(measured=True)); search(by=...) says which cost ranks (RANKINGS).
    measured: tuple[x60.Modeled, x60.Modeled] | None = None

    def times(self, by: str = "model") -> tuple[x60.Modeled, x60.Modeled]:
        """(1 core, 4 cores) under the model ("model"), under LLVM's measured occupancies ("measured"),
        or each the slower of the two ("robust"; the model alone where no occupancies were counted)."""
        if by == "model" or (by == "robust" and self.measured is None):
            return self.one_core, self.four_cores
        if by == "measured":
            return self.measured
        return tuple(max(a, b, key=lambda t: t.time_s)  # type: ignore[return-value]
                     for a, b in zip((self.one_core, self.four_cores), self.measured))

    def rank_key(self, by: str = "model") -> tuple:
        """Time on 4 cores, then on 1 core, then core-side time on 1 core (headroom when DRAM-bound),
        ranked by `by` (times()); robust then breaks ties by the faster view's times (the slower one
        tied); then fewer retired instructions (e.g. fp32 over fp16 scales where the bytes do not
        matter), then the spec text: a total order, so the choice is deterministic."""
        one, four = self.times(by)
        other = (0.0, 0.0)
        if by == "robust" and self.measured is not None:  # the faster view, 4 cores then 1
            other = (min(self.four_cores.time_s, self.measured[1].time_s), min(self.one_core.time_s, self.measured[0].time_s))
        return (four.time_s, one.time_s, one.core_s, *other, x60.total_instructions(self.counts),
                spec_text("k", settings_of(self.spec)))

    @property
    def key(self) -> tuple:
        return self.rank_key()


def settings_of(spec: KernelSpec) -> dict[str, object]:
    d = {"op": spec.op, "bits": spec.bits, "block": spec.block, "zero_point": spec.zero_point,
         "bias": "yes" if spec.bias else "no", "compute": spec.compute, "target": spec.target,
         "tile": f"{spec.tile_m}x{spec.tile_n}", "k_unroll": spec.k_unroll, "unpack": spec.unpack,
         "panel": spec.panel, "scales": spec.scales, "scale_type": spec.scale_type}
    if spec.target == "rvv":
        d["vlen"] = spec.vlen
    if spec.stage_b != "tile":
        d["stage_b"] = spec.stage_b
    if spec.spread != "group":
        d["spread"] = spec.spread
    if spec.a_scale_type != "fp32":
        d["a_scale_type"] = spec.a_scale_type
    return d


def evaluate(specs: list[KernelSpec], targets: list[Case], *, jobs: int = 1, log=None,
             params: x60.X60Params = x60.X60) -> dict[tuple[str, Case], Evaluation]:
    """Measure every spec on every case (one QEMU run per spec) and model it."""

    def one(spec: KernelSpec) -> list[Evaluation]:
        plan = plan_kernel(spec)
        mine = [c for c in targets if c.block == spec.block]
        counted = measure.measure_shapes(plan, [c.mnk for c in mine])
        out = []
        for c, sc in zip(mine, counted):
            one_core, four = sc.matmul(1), sc.matmul(params.ime_cores)
            measured = (tuple(x60.model(plan, *c.mnk, n, cores, params, measured=True) for n, cores in ((one_core, 1), (four, params.ime_cores)))
                        if occupancy.measured_cycles(one_core) is not None else None)
            out.append(Evaluation(spec, c, one_core, x60.model(plan, *c.mnk, one_core, 1, params),
                                  x60.model(plan, *c.mnk, four, params.ime_cores, params), measured))
        if log:
            log(f"  measured {spec.name}")
        return out

    results: dict[tuple[str, Case], Evaluation] = {}
    unique = list({s.name: s for s in specs}.values())
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        for evals in pool.map(one, unique):
            for e in evals:
                results[(e.spec.name, e.case)] = e
    finally:  # on Ctrl-C (or a failure) do not start the queued measurements
        pool.shutdown(cancel_futures=True)
    return results


@dataclass(frozen=True)
class TuneResult:
    best: dict[Case, Evaluation]
    ranking: dict[Case, list[Evaluation]]  # every evaluated config, best first
    refused: list[tuple[str, str]]  # (config name, validator message)
    evaluated: int
    by: str = RANKINGS[0]  # the cost it ranked by (Evaluation.times)

    def spec_file(self) -> str:
        how = {"model": "", "measured": " with LLVM's hardware-measured occupancies for the vector units",
               "robust": ", each config's slower of the model's and LLVM's hardware-measured vector occupancies"}[self.by]
        lines = [f"# imegen tune: best IME config per Qwen2.5-0.5B MatMulNBits shape under the X60 cost model{how}",
                 "# (modeled, not measured on hardware; see imegen/perf/x60.py). Regenerate with `imegen tune"
                 + ("`." if self.by == RANKINGS[0] else f" --occupancy {self.by}`."), ""]
        for case, e in self.best.items():
            one, four = e.times(self.by)
            lines.append(f"# {case.label}: N={case.N} K={case.K}; modeled {four.time_s * 1e3:.4f} ms on 4 cores, "
                         f"{one.time_s * 1e3:.4f} ms on 1 core")
            lines.append(spec_text(case.ident, settings_of(e.spec)))
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "ranked_by": self.by,
            "evaluated": self.evaluated,
            "refused": [{"config": n, "reason": r} for n, r in self.refused],
            "cases": [{"case": c.label, "kernel": c.ident, "M": c.M, "N": c.N, "K": c.K, "block": c.block,
                       "best": settings_of(e.spec), "ms_4_cores": e.times(self.by)[1].time_s * 1e3,
                       "ms_1_core": e.times(self.by)[0].time_s * 1e3,
                       "top": [{"config": r.spec.name, "ms_4_cores": r.times(self.by)[1].time_s * 1e3,
                                "ms_1_core": r.times(self.by)[0].time_s * 1e3} for r in self.ranking[c][:5]]}
                      for c, e in self.best.items()],
        }


def search(targets: list[Case], *, quick: bool = False, jobs: int = 1, log=None,
           candidates: dict[int, list[dict[str, object]]] | None = None, by: str = RANKINGS[0]) -> TuneResult:
    """Two-stage search; `candidates` (block -> settings) replaces stage 1 (used by tests); `by`: the
    cost that ranks the stage-1 leaders and the winners (RANKINGS)."""
    if by not in RANKINGS:
        raise ValueError(f"unknown ranking {by!r}: one of {', '.join(RANKINGS)}")
    refused: list[tuple[str, str]] = []
    seen: dict[str, KernelSpec] = {}

    def admit(settings_list: list[dict[str, object]]) -> list[KernelSpec]:
        new = []
        for st in settings_list:
            name = config_name(st)
            if name in seen or any(name == r[0] for r in refused):
                continue
            got = validate(st)
            if isinstance(got, SpecError):
                refused.append((name, got.message))
            else:
                seen[name] = got
                new.append(got)
        return new

    blocks = sorted({c.block for c in targets})
    first = []
    for b in blocks:
        base = candidates[b] if candidates is not None else stage1(b, quick=quick)
        if by != "model" and candidates is None:  # there the fold's spread decides the leaders: stage 1 sees both
            base = base + [{**st, "spread": "per_register"} for st in base
                           if isinstance(validate({**st, "spread": "per_register"}), KernelSpec)]
        first += admit(base)
    if log:
        log(f"tune: stage 1: {len(first)} valid configs, {len(refused)} refused by the validator")
    results = evaluate(first, targets, jobs=jobs, log=log)

    def ranking(case: Case) -> list[Evaluation]:
        ranked = sorted((e for (_, c), e in results.items() if c == case), key=lambda e: e.rank_key(by))
        if not ranked:
            return ranked
        # 4-core times within TIE of the best are a tie in this model: the 1-core time decides.
        cut = ranked[0].times(by)[1].time_s * (1 + TIE)
        tied = [e for e in ranked if e.times(by)[1].time_s <= cut]
        return sorted(tied, key=lambda e: (e.times(by)[0].time_s, e.rank_key(by))) + ranked[len(tied):]

    if candidates is None:
        top = [r.spec for c in targets for r in ranking(c)[:1 if quick else 2]]
        second = admit([v for s in dict.fromkeys(top) for v in stage2(settings_of(s), quick=quick)])
        if log:
            log(f"tune: stage 2: {len(second)} layout variants of the stage-1 leaders")
        results.update(evaluate(second, targets, jobs=jobs, log=log))
    ranks = {c: ranking(c) for c in targets}
    return TuneResult({c: ranks[c][0] for c in targets}, ranks, refused, len(seen), by)


def write_outputs(result: TuneResult, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path, json_path = out_dir / "tuned.imegen", out_dir / "tune.json"
    spec_path.write_text(result.spec_file())
    json_path.write_text(json.dumps(result.to_json(), indent=1, sort_keys=True) + "\n")
    return [spec_path, json_path]
