"""target ime: SpacemiT IME (the K1's X60 cores) int8 vmadot tiles in an inline asm statement, vmadot
as .word encodings (encoding.py). VLEN 256 only. rules.py decides what a kernel can be, layout.py
where its A and B live, plan.py (with asm.py, folds.py, staged.py) its asm statement."""

from __future__ import annotations

from dataclasses import replace

from ...spec import KernelSpec
from ..base import ImeHarts, Refuse, Target, refuse_k_step
from . import layout, rules
from .plan import ime_plan


class ImeTarget(Target):
    def mlas_refusal(self, spec: KernelSpec) -> tuple[str, str] | None:
        if spec.bits == 4 and spec.unpack == "interleaved":
            return "unpack", ("abi mlas with target ime needs unpack = planar: MLAS quantizes A in natural k order, "
                              "and interleaved nibbles would need A's k order permuted to match the unpacked B tiles")
        return None

    def validate(self, spec: KernelSpec, refuse: Refuse) -> KernelSpec:
        if spec.compute not in self.computes:
            refuse("compute", "vmadot multiplies int8 operands; target ime needs compute = int8 (use rvv or scalar for fp32)")
        if spec.vlen not in (None, rules.IME_VLEN):
            refuse("vlen", f"IME's 4x8x4 vmadot tile exists only at VLEN={rules.IME_VLEN} (K1), not {spec.vlen}")
        spec = replace(spec, vlen=rules.IME_VLEN)
        if spec.tile_n % 4:
            refuse("tile", f"tile width {spec.tile_n} is not a multiple of vmadot's 4 output columns")
        if spec.tile_m != 1 and spec.tile_m % 4:
            refuse("tile", f"tile height {spec.tile_m} is neither 1 (gemv, one live row) nor a multiple of vmadot's 4 rows")
        if spec.bits == 4 and spec.k_unroll % 2:
            refuse("k_unroll", "4-bit IME needs an even k_unroll: one 32-byte B load unpacks into two 8-k vmadot steps")
        refuse_k_step(spec, refuse, 8, "8*k_unroll")
        return spec

    def register_budget(self, spec: KernelSpec) -> dict[str, int]:
        return rules.register_budget(spec)

    def accepts_vlen(self, spec: KernelSpec, vlen: int) -> bool:
        return vlen == rules.IME_VLEN

    def vlen_need(self, spec: KernelSpec) -> str:
        return f"VLEN = {spec.vlen}"

    def supported_body(self, spec: KernelSpec) -> tuple[str, ...]:
        return ("size_t vlenb;", '__asm__("csrr %0, vlenb" : "=r"(vlenb));',
                f"return vlenb == {spec.vlen // 8}; /* vmadot's 4x8x4 tile */")

    def pack_codes(self, spec: KernelSpec) -> tuple[str, str]:
        return layout.pack_codes(spec)

    def zp_nibbles(self, spec: KernelSpec) -> bool:
        return rules.zp_nibbles(spec)

    def a_index(self, spec: KernelSpec) -> tuple[str, int, int]:
        return layout.a_index(spec)

    def a_chunk_stride(self, spec: KernelSpec) -> int | None:
        return layout.a_chunk_stride(spec)

    def a_scale_group(self, spec: KernelSpec) -> int:
        return layout.a_scale_group(spec)

    def quantize_lmul(self, spec: KernelSpec) -> int:
        return layout.quantize_lmul(spec)

    def lower(self, spec: KernelSpec, pack):
        return ime_plan(spec, pack)


TARGET = ImeTarget(
    name="ime", title="IME", micro_template="micro_ime.c.j2", march="rv64gcv", compilers=("clang", "gcc"), vector=True,
    computes=("int8",),
    needs_ime=True, emulator="ime_emu", tile_step=(4, 4), plan_part="ime", only_vlen=rules.IME_VLEN,
    # the K1: eight X60 harts, of which cores 0-3 (marchid A60, or all eight reporting X60) have IME
    ime_harts=ImeHarts(board="K1", marchid=0x8000000041000001, cores=4, where="0-3"),
    options={"stage_b": rules.staged_b_refusal, "spread": rules.spread_refusal, "a_scale_type": rules.a_fp16_refusal},
    fallback_refusal="a fallback kernel runs where no IME hart is reachable, so its target must be rvv or scalar")
