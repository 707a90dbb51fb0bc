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
(search.settings.validate); the ones it refuses (register budget, k_unroll vs block, ...) are
reported with the validator's message and never built. Valid ones are measured (count/measure.py,
cached) and modeled (model/x60.py), by search/evaluate.py. The best config per shape minimises the modeled time on 4 IME
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
from dataclasses import dataclass
from pathlib import Path

from ...errors import SpecError
from ...ir import KernelSpec
from ..workload import Case
from .evaluate import RANKINGS, Evaluation, evaluate
from .settings import config_name, settings_of, spec_text, validate

TIE = 0.01  # relative 4-core time difference below which configs count as tied


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


@dataclass(frozen=True)
class TuneResult:
    best: dict[Case, Evaluation]
    ranking: dict[Case, list[Evaluation]]  # every evaluated config, best first
    refused: list[tuple[str, str]]  # (config name, validator message)
    evaluated: int
    by: str = RANKINGS[0]  # the cost it ranked by (Evaluation.times)
    source: str | None = None  # `tune --spec`: the SPEC file whose kernels were ranked (no search)

    def _header(self) -> list[str]:
        how = {"model": "", "measured": " with LLVM's hardware-measured occupancies for the vector units",
               "robust": ", each config's slower of the model's and LLVM's hardware-measured vector occupancies"}[self.by]
        occupancy = "" if self.by == RANKINGS[0] else f" --occupancy {self.by}"
        if self.source is None:
            return [f"# imegen tune: best IME config per Qwen2.5-0.5B MatMulNBits shape under the X60 cost model{how}",
                    f"# (modeled, not measured on hardware; see imegen/perf/model/x60.py). Regenerate with `imegen tune{occupancy}`.",
                    ""]
        return [f"# imegen tune --spec {self.source}{occupancy}: the best of its kernels per MatMulNBits shape under "
                f"the X60 cost model{how}", "# (modeled, not measured on hardware; see imegen/perf/model/x60.py).", ""]

    def _case_lines(self, case: Case, e: Evaluation) -> list[str]:
        """The case's winner as a DSL kernel named for the case, after a comment with its modeled times (and,
        ranking a SPEC's kernels, which one won and how every one ranked)."""
        def ms(r: Evaluation) -> str:
            one, four = r.times(self.by)
            return f"{four.time_s * 1e3:.4f} | {one.time_s * 1e3:.4f} ms"

        one, four = e.times(self.by)
        lines = [f"# {case.label}: N={case.N} K={case.K}; modeled {four.time_s * 1e3:.4f} ms on 4 cores, "
                 f"{one.time_s * 1e3:.4f} ms on 1 core" + (f" (kernel {e.spec.name})" if self.source else "")]
        if self.source:
            lines.append("#   ranked: " + ", ".join(f"{r.spec.name} {ms(r)}" for r in self.ranking[case]) + " (4 cores | 1 core)")
        return lines + [spec_text(case.ident, settings_of(e.spec))]

    def spec_file(self) -> str:
        return "\n".join(self._header() + [line for case, e in self.best.items() for line in self._case_lines(case, e)])

    def to_json(self) -> dict:
        return {
            **({"source": self.source} if self.source else {}),
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


def _check_ranking(by: str) -> None:
    if by not in RANKINGS:
        raise ValueError(f"unknown ranking {by!r}: one of {', '.join(RANKINGS)}")


def rank_case(results: dict[tuple[str, Case], Evaluation], case: Case, by: str) -> list[Evaluation]:
    """Every evaluated config of case, best first (the module docstring's order)."""
    ranked = sorted((e for (_, c), e in results.items() if c == case), key=lambda e: e.rank_key(by))
    if not ranked:
        return ranked
    # 4-core times within TIE of the best are a tie in this model: the 1-core time decides.
    cut = ranked[0].times(by)[1].time_s * (1 + TIE)
    tied = [e for e in ranked if e.times(by)[1].time_s <= cut]
    return sorted(tied, key=lambda e: (e.times(by)[0].time_s, e.rank_key(by))) + ranked[len(tied):]


def rank(specs: list[KernelSpec], cases: list[Case], *, jobs: int = 1, log=None, by: str = RANKINGS[0],
         source: str | None = None) -> TuneResult:
    """`imegen tune --spec`: the given kernels, no search: each evaluated on the cases of its block and
    ranked per case as search() ranks its candidates; every case needs a kernel of its block."""
    _check_ranking(by)
    results = evaluate(specs, cases, jobs=jobs, log=log)
    ranks = {c: rank_case(results, c, by) for c in cases}
    return TuneResult({c: ranks[c][0] for c in cases}, ranks, [], len(specs), by, source)


def search(targets: list[Case], *, quick: bool = False, jobs: int = 1, log=None,
           candidates: dict[int, list[dict[str, object]]] | None = None, by: str = RANKINGS[0]) -> TuneResult:
    """Two-stage search; `candidates` (block -> settings) replaces stage 1 (used by tests); `by`: the
    cost that ranks the stage-1 leaders and the winners (RANKINGS)."""
    _check_ranking(by)
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
        return rank_case(results, case, by)

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
