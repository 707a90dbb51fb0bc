"""A user's own kernels for `imegen bench --spec SPEC` and `imegen tune --spec SPEC`: the kernels of SPEC
the bench can run, and why it skips the others. The bench drives imegen's ABI (NAME_matmul) and compares
vector kernels with vector baselines on the K1's VLEN; every kernel it cannot run is named with the
reason, and a SPEC left with none is an error before anything is built."""

from __future__ import annotations

from dataclasses import dataclass

from .. import targets
from ..errors import SpecError
from ..ir import KernelSpec, load_specs
from .count.measure import VLEN


@dataclass(frozen=True)
class UserKernels:
    source: str  # the SPEC file
    specs: tuple[KernelSpec, ...]  # the ones the bench runs, in SPEC's order
    skipped: tuple[tuple[str, str], ...]  # (kernel name, why the bench cannot run it)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.specs)

    @property
    def blocks(self) -> tuple[int, ...]:
        return tuple(sorted({s.block for s in self.specs}))


def skip_reason(spec: KernelSpec) -> str | None:
    """Why the bench cannot run spec, or None."""
    if spec.abi != "imegen":
        return f"abi = {spec.abi}: the bench drives imegen's own ABI (`imegen bench --mlas SPEC` counts MLAS kernels)"
    target = targets.of(spec)
    if not target.vector:
        vector = ", ".join(t.name for t in targets.ALL if t.vector)
        return f"target {spec.target}: the bench compares vector kernels ({vector}) with vector baselines"
    if not target.accepts_vlen(spec, VLEN):
        return f"it needs {target.vlen_need(spec)}; the bench runs at the K1's VLEN {VLEN}"
    return None


def load(spec_file: str) -> UserKernels:
    """SPEC's kernels the bench can run; SpecError (one line) when SPEC cannot be read or has none."""
    try:
        specs = load_specs(spec_file)
    except OSError as e:
        raise SpecError(None, f"cannot read {spec_file}: {e.strerror or e}") from None
    reasons = {s.name: skip_reason(s) for s in specs}
    kept = tuple(s for s in specs if reasons[s.name] is None)
    skipped = tuple((name, why) for name, why in reasons.items() if why is not None)
    if not kept:
        why = "; ".join(f"{name}: {reason}" for name, reason in skipped) if skipped else "it defines no kernel"
        raise SpecError(None, f"{spec_file}: no kernel the bench can run ({why})")
    return UserKernels(spec_file, kept, skipped)
