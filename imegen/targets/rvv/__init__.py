"""target rvv: RVV 1.0 intrinsics (clang), VLEN-agnostic from the spec's vlen up: each tile row keeps
its TN columns in one register group (kernel.py spells its statements, intrinsics included)."""

from __future__ import annotations

from dataclasses import replace

from ...spec import KernelSpec
from ..base import Refuse, Target, lmul_for, refuse_k_step
from . import attention
from .kernel import rvv_plan

DEFAULT_VLEN = 128  # the least VLEN RVV 1.0's V extension requires of an application processor
MAX_LMUL = 8


class RvvTarget(Target):
    def validate(self, spec: KernelSpec, refuse: Refuse) -> KernelSpec:
        spec = replace(spec, vlen=spec.vlen or DEFAULT_VLEN)
        if spec.tile_n * 32 > MAX_LMUL * spec.vlen:  # fp32 or int32 accumulators: TN x 32 bits per row
            refuse("tile", f"tile width {spec.tile_n} needs LMUL > {MAX_LMUL} at VLEN={spec.vlen}")
        refuse_k_step(spec, refuse, 2, "2*k_unroll")
        return spec

    def register_budget(self, spec: KernelSpec) -> dict[str, int]:
        if spec.compute == "fp32":
            l32 = lmul_for(spec.tile_n * 32, spec.vlen)
            return {"fp32 accumulators": spec.tile_m * l32, "B codes": 1, "dequantized B": l32,
                    "scales": l32, "zero points": l32}
        l16 = lmul_for(spec.tile_n * 16, spec.vlen)
        return {"int32 accumulators": spec.tile_m * 2 * l16, "fp32 accumulators": spec.tile_m * 2 * l16,
                "B codes": 1, "B int16": l16, "zero points": l16, "scales": 2 * l16}

    def accepts_vlen(self, spec: KernelSpec, vlen: int) -> bool:
        return vlen >= spec.vlen  # spec vlen is the least it accepts

    def vlen_need(self, spec: KernelSpec) -> str:
        return f"VLEN >= {spec.vlen}"

    def supported_body(self, spec: KernelSpec) -> tuple[str, ...]:
        return (f"return __riscv_vsetvlmax_e8m1() >= {spec.vlen // 8}; /* VLEN >= {spec.vlen}: spec vlen is the least it accepts */",)

    def lower(self, spec: KernelSpec, pack):
        return rvv_plan(spec)

    def validate_attention(self, spec, refuse: Refuse):
        return attention.validate(spec, refuse)

    def plan_attention(self, spec):
        return attention.plan(spec)


TARGET = RvvTarget(name="rvv", title="RVV", micro_template="micro_rvv.c.j2", march="rv64gcv", compilers=("clang",),
                   vector=True, intrinsics_required=True, plan_part="rvv")
