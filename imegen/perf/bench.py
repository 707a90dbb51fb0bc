"""`imegen bench`: the Qwen2.5-0.5B MatMulNBits shapes, imegen's tuned kernels against the baselines
(baselines/: the DSL ones, llama.cpp's real kernels, stock riscv64 onnxruntime), instruction counts
measured under QEMU, times modeled for the SpacemiT K1 / X60. run() measures everything into a
BenchResult, run_spec() a user's own kernels (`bench --spec`) next to the DSL baselines; report/ turns
it into text, CSV and a plot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .. import ir
from .baselines.dsl import BASELINES, baseline_settings
from .baselines.llama_cpp import rows as llama_cpp
from .baselines.onnxruntime import nodes as ort_nodes
from .model import x60
from .search import tune
from .search.evaluate import Evaluation, evaluate
from .search.settings import settings_of, validate
from .user_kernels import UserKernels
from .workload import BLOCKS, Case, targets

KINDS = ("imegen", *BASELINES)


@dataclass(frozen=True)
class Row:
    case: Case
    kind: str
    ev: Evaluation


@dataclass(frozen=True)
class BenchResult:
    rows: list[Row]
    tuned: tune.TuneResult | None  # None: a user's kernels (run_spec), not the tuner's
    quick: bool
    llama: tuple = ()  # llama_cpp.LlamaRow: llama.cpp's real kernels, block 32
    ort: tuple = ()  # ort_nodes.OrtRow: stock riscv64 onnxruntime per Run, and ORT + imegen's library
    whole: object = None  # (full runs) whole.WholeAccount: the exporter-form Qwen node by node, and llama.cpp
    twins: dict = field(default_factory=dict)  # (case, B scale type) -> (the fewest-instruction twin, own form?) (scale_twins)
    subjects: tuple[str, ...] = ("imegen",)  # the kinds benched against the baselines: the tuned kernels, or SPEC's
    user: UserKernels | None = None  # `bench --spec`: the user's kernels
    ime2: object = None  # (full runs) report.ime2.Ime2Result: imegen's IME2 kernels against llama.cpp's, K3 A100

    def get(self, case: Case, kind: str) -> Evaluation:
        return next(r.ev for r in self.rows if r.case == case and r.kind == kind)

    def has(self, case: Case, kind: str) -> bool:
        return any(r.case == case and r.kind == kind for r in self.rows)

    @property
    def cases(self) -> list[Case]:
        return list(dict.fromkeys(r.case for r in self.rows))


def run(*, quick: bool = False, blocks=BLOCKS, jobs: int | None = None, log=None) -> BenchResult:
    jobs = jobs or os.cpu_count() or 1
    cases = targets(quick=quick, blocks=blocks)
    tuned = tune.search(cases, quick=quick, jobs=jobs, log=log)
    rows = [Row(c, "imegen", tuned.best[c]) for c in cases] + baseline_rows(cases, log)
    order = {k: i for i, k in enumerate(KINDS)}
    rows.sort(key=lambda r: (cases.index(r.case), order[r.kind]))
    llama = tuple(llama_cpp.rows(cases, tuned, log=log))
    ort = tuple(ort_nodes.rows(cases, tuned, quick=quick, log=log))
    whole = None if quick else whole_account(log)
    ime2 = None if quick else ime2_account(log)
    return BenchResult(rows, tuned, quick, llama, ort, whole, scale_twins(cases, tuned, log), ime2=ime2)


def whole_account(log=None):
    from . import whole

    return whole.run(log=log)


def ime2_account(log=None):
    from .report import ime2

    return ime2.run(log=log)


def run_spec(user: UserKernels, cases: list[Case], *, quick: bool = False, jobs: int | None = None, log=None) -> BenchResult:
    """`imegen bench --spec`: the user's kernels, each on the cases of its block, next to the DSL baselines."""
    evals = evaluate(list(user.specs), cases, jobs=jobs or os.cpu_count() or 1, log=log)
    rows = [Row(c, s.name, evals[(s.name, c)]) for s in user.specs for c in cases if c.block == s.block]
    rows += baseline_rows(cases, log)
    order = {k: i for i, k in enumerate((*user.names, *BASELINES))}
    rows.sort(key=lambda r: (cases.index(r.case), order[r.kind]))
    return BenchResult(rows, None, quick, subjects=user.names, user=user)


def baseline_rows(cases: list[Case], log=None) -> list[Row]:
    """The DSL baselines (baselines/dsl.py) on every case, each kernel measured once for all its cases."""
    rows = []
    for kind in BASELINES:
        by_spec: dict[str, tuple[ir.KernelSpec, list[Case]]] = {}
        for c in cases:
            spec = validate(baseline_settings(kind, c.block, c.M))
            if not hasattr(spec, "name"):
                raise RuntimeError(f"baseline {kind} refused by the validator: {spec}")
            by_spec.setdefault(spec.name, (spec, []))[1].append(c)
        if log:
            log(f"bench: baseline {kind}: {len(by_spec)} kernels")
        for spec, cs in by_spec.values():
            evals = evaluate([spec], cs, jobs=1, log=log)
            rows += [Row(c, kind, evals[(spec.name, c)]) for c in cs]
    return rows


def _twin_specs(best: ir.KernelSpec, scale_type: str) -> list[ir.KernelSpec]:
    """The tuned config with B scales of scale_type and fp32 A scales: as it is, and with per-register
    spreads (the form the tuner measures for some staged fp32 leaders)."""
    base = settings_of(best)
    base.pop("a_scale_type", None)
    specs = [validate({**base, "scale_type": scale_type}), validate({**base, "scale_type": scale_type, "spread": "per_register"})]
    return [s for s in specs if hasattr(s, "name")]


def scale_twins(cases: list[Case], tuned: tune.TuneResult, log=None) -> dict:
    """For every case tuned to fp16 scales, its twins with fp32 B scales and with fp16 B scales against
    fp32 A scales, each the fewer-instruction of its two forms, measured where the tuner did not; where
    the tuned config has no such form (8x12 staged kernels exist with fp16 A scales only), the
    fewest-instruction config of that precision the tuner measured for the case. Values: (twin, own form)."""
    wanted = {(c, st): _twin_specs(tuned.best[c].spec, st) for c in cases if tuned.best[c].spec.scale_type == "fp16"
              for st in ("fp32", "fp16")}
    measured = {(e.spec.name, c): e for c in cases for e in tuned.ranking[c]}
    missing: dict[str, tuple[ir.KernelSpec, list[Case]]] = {}
    for (c, _), specs in wanted.items():
        for s in specs:
            if (s.name, c) not in measured:
                missing.setdefault(s.name, (s, []))[1].append(c)
    if log and missing:
        log(f"bench: {len(missing)} scale-precision twins the tuner did not measure")
    for spec, cs in missing.values():
        measured.update(evaluate([spec], cs, jobs=1, log=log))
    twins = {key: (min((measured[(s.name, key[0])] for s in specs), key=lambda e: x60.total_instructions(e.counts)), True)
             for key, specs in wanted.items() if specs}
    for c, st in wanted.keys() - twins.keys():
        pool = [e for e in tuned.ranking[c] if e.spec.scale_type == st and e.spec.a_scale_type == "fp32"]
        if pool:
            twins[(c, st)] = (min(pool, key=lambda e: x60.total_instructions(e.counts)), False)
    return twins
