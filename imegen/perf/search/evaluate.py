"""Evaluate kernel configs on cases: count each spec's instructions under QEMU (count.measure, cached),
model them on 1 and 4 X60 cores (model.x60), under the model's vector-unit charges and LLVM's
hardware-measured occupancies (model.occupancy); and the order configs are ranked in (RANKINGS)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ...ir import KernelSpec
from ...plan import plan_kernel
from ..count import measure
from ..model import occupancy, x60
from ..workload import Case
from .settings import settings_of, spec_text

RANKINGS = ("robust", "model", "measured")  # the cost the tuner ranks by (Evaluation.times); the first is the default


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
