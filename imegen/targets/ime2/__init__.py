"""target ime2: SpacemiT IME2 (the K3's A100 cores, VLEN 1024, `XSMTVDotII`): int8 vmadot on 8x16x8 tiles in
an inline asm statement, the words from encoding.py. A quantized per block (MLAS CompInt8), 4-bit B unpacked
to int8 in the kernel. rules.py decides what a kernel can be, layout.py where its A and B live, kernel.py its
asm statement; templates/micro_ime2.c.j2 places it and folds the block after it (RVV intrinsics where the
compiler has them). docs/ime2-isa.md §10."""

from __future__ import annotations

from dataclasses import replace

from ...spec import KernelSpec
from ..base import ImeHarts, Refuse, Target
from . import layout, rules
from .kernel import gemm_zp_in_loop, ime2_plan


class Ime2Target(Target):
    def mlas_refusal(self, spec: KernelSpec) -> tuple[str, str] | None:
        return rules.mlas_refusal(spec)

    def validate(self, spec: KernelSpec, refuse: Refuse) -> KernelSpec:
        rules.validate(spec, refuse)
        # the .hp gemv reads B packed its own way (b_pack = hp), which a gemm can read too
        return replace(spec, vlen=rules.IME2_VLEN, b_pack="hp" if spec.hp_blocks else spec.b_pack)

    def register_budget(self, spec: KernelSpec) -> dict[str, int]:
        return rules.register_budget(spec)

    def serving_settings(self, op: str, block: int) -> dict[str, object]:
        return {**rules.SERVING[op], "k_unroll": rules.serving_k_unroll(block)}

    def hp_decode_settings(self, op: str) -> dict[str, object]:
        return dict(rules.HP_SERVING[op])

    def accepts_vlen(self, spec: KernelSpec, vlen: int) -> bool:
        return vlen == rules.IME2_VLEN

    def vlen_need(self, spec: KernelSpec) -> str:
        return f"VLEN = {spec.vlen}"

    def supported_body(self, spec: KernelSpec) -> tuple[str, ...]:
        return ("size_t vlenb;", '__asm__("csrr %0, vlenb" : "=r"(vlenb));',
                f"return vlenb == {spec.vlen // 8}; /* vmadot's 8x16x8 tile (the A100) */")

    def pack_codes(self, spec: KernelSpec) -> tuple[str, str]:
        return layout.pack_codes(spec)

    def a_index(self, spec: KernelSpec) -> tuple[str, int, int]:
        return layout.a_index(spec)

    def a_step_bytes(self, spec: KernelSpec) -> int:
        return layout.a_step_bytes(spec)

    def a_scale_group(self, spec: KernelSpec) -> int:
        return layout.a_scale_group(spec)

    def quantize_lmul(self, spec: KernelSpec) -> int:
        return layout.quantize_lmul(spec)

    def pair_code_order(self, spec: KernelSpec) -> tuple[int, ...]:
        return layout.pair_code_order(spec)

    def a_group_rows(self, spec: KernelSpec) -> int:
        """Rows templates/quantize_ime2.c.j2 quantizes together (quantize_tile_rows_to), 0 for one at a time."""
        return layout.a_group_rows(spec, gemm_zp_in_loop(spec))

    def finishes_pack(self, spec: KernelSpec) -> str:
        return ("codes stored signed (q ^ 8, read as q - 8); fp16 scales divided by D, the power of two bringing the "
                "largest into [0.5, 1), stored after the chunks" if spec.b_pack == "hp" else "")

    def packed_scales(self, spec: KernelSpec, half, widths: list[int]):
        return layout.hp_packed_scales(half, widths) if spec.b_pack == "hp" else half

    def exact_on_exact_data(self, spec: KernelSpec) -> bool:
        return not spec.hp_blocks  # .hp's FP16 sums round even exactly representable data

    def a_row_finish(self, spec: KernelSpec) -> str:
        return ("rows then rewritten for the .hp gemv: codes split into 4-bit rows c >> 4 and (c & 15) - 8, scales to "
                "FP16 divided by the row's power of two F, F over the first code sum" if spec.hp_blocks else "")

    def lower(self, spec: KernelSpec, pack):
        return ime2_plan(spec, pack)


TARGET = Ime2Target(
    name="ime2", title="IME2", micro_template="micro_ime2.c.j2", march="rv64gcv", compilers=("clang", "gcc"),
    vector=True, computes=("int8",), needs_ime=True, emulator="ime2_emu",
    tile_step=(rules.TILE_ROWS, rules.TILE_COLUMNS), plan_part="ime", only_vlen=rules.IME2_VLEN,
    # the K3: X100 harts 0-7 (VLEN 256, no IME2: a vmadot there gives wrong numbers, it does not trap) and A100
    # harts 8-15; a thread becomes an A100 thread by writing to /proc/set_ai_thread (llama.cpp's SpacemiT
    # backend does so, ime.cpp bind_ai_thread), marchid from its ime_env.cpp
    ime_harts=ImeHarts(board="K3", marchid=0x8000000041000002, cores=8, where="8-15",
                       route_file="/proc/set_ai_thread", own_vlen=True),
    # the A quantizer stores whole blocks into the 16-k step layout itself (layout.a_step_bytes)
    a_store_template="quantize_ime2.c.j2",
    fallback_refusal="a fallback kernel runs where no IME hart is reachable, so its target must be rvv or scalar",
    # abi = mlas: MLAS's Q8 rows are staged into the tile layout vmadot reads (layout.a_index); a K3's X100 harts
    # have no IME2 (a vmadot there computes wrong numbers without trapping), so the dispatch routes its calls
    mlas_a_layout="workspace", mlas_hart_routing=True,
    options={"hp_blocks": rules.hp_refusal, "b_pack": rules.b_pack_refusal})
