"""target scalar: portable C, no vector registers; built natively too, as the reference build."""

from __future__ import annotations

from ...spec import KernelSpec
from ..base import Refuse, Target, refuse_k_step

MAX_ACCUMULATORS = 256  # acc[TM][TN] of the micro-kernel, on the stack


class ScalarTarget(Target):
    def validate(self, spec: KernelSpec, refuse: Refuse) -> KernelSpec:
        if spec.vlen is not None:
            refuse("vlen", "target scalar uses no vector registers; remove 'vlen'")
        if spec.tile_m * spec.tile_n > MAX_ACCUMULATORS:
            refuse("tile", f"scalar tile {spec.tile_m}x{spec.tile_n} has more than {MAX_ACCUMULATORS} accumulators")
        refuse_k_step(spec, refuse, 2, "2*k_unroll")
        return spec


TARGET = ScalarTarget(name="scalar", title="scalar", micro_template="micro_scalar.c.j2", march="rv64gc",
                      compilers=("clang", "gcc"), vector=False, host_build=True)
