"""IME's rules: what a vmadot kernel can be (the DSL refusals of its own settings), the planner decisions
the rules depend on (zero points in B, fp32 accumulators in registers) and its vector register budget."""

from __future__ import annotations

from ...spec import KernelSpec
from ..base import VECTOR_REGISTERS, lmul_for

IME_VLEN = 256  # K1/X60: vmadot's 4x8x4 int8 tile is defined for VLEN=256 only.
IME_FOLD_REGS = 16  # the per-block vector fold: 8 even register pairs (see folds.ime_fold)
# The fold of a kernel whose fp32 accumulators stay in registers: index tables, scale staging,
# spread B scales, products and one row tile's spread A scales (6 even pairs, folds._signed_fold).
IME_FOLD_REGS_IN_REGISTERS = 12


def gemv_fold_lmul(tile_n: int) -> int:
    """LMUL of the gemv fold's e32 vectors: the row's tile_n results."""
    return lmul_for(tile_n * 32, IME_VLEN)


def zero_points_in_b(spec: KernelSpec) -> str | None:
    """4-bit IME gemm kernels subtract the zero point from each unpacked B code (q - zp fits int8) and
    run signed vmadot, so the block fold needs no zp * sum(a) correction: 'asymmetric' (a register
    run of spread zero points, na registers), 'symmetric' (vadd -8), or None (the fold corrects)."""
    if spec.target == "ime" and spec.bits == 4 and spec.tile_m > 1 and spec.zero_point in ("symmetric", "asymmetric"):
        return spec.zero_point
    return None


def zp_nibbles(spec: KernelSpec) -> bool:
    """4-bit IME gemv packs its zero points two per byte, as ORT does (decode is DRAM-bound: at block
    32 one byte per column and block is 5% of the weight bytes, a nibble 2.7%); its fold unpacks them
    (see folds.gemv_fold). Other kernels keep one byte per column: their loops spread zero points per byte."""
    return (spec.target == "ime" and spec.tile_m == 1 and spec.bits == 4 and spec.zero_point == "asymmetric"
            and spec.scales != "ort")


def _ime_loop_registers(spec: KernelSpec) -> tuple[int, int, int, int]:
    """IME gemm: (int32 accumulators, A tile, B tile, spread zero-point) registers of the k loop."""
    ma, na = max(1, spec.tile_m // 4), spec.tile_n // 4
    zp = na if zero_points_in_b(spec) == "asymmetric" else 0
    return 2 * ma * na, ma * spec.k_unroll, na * spec.k_unroll, zp


def fp32_acc_in_registers(spec: KernelSpec) -> bool:
    """4-bit IME gemm kernels (imegen ABI) whose fp32 tile accumulators fit in vector registers next
    to the loop's and the fold's: one asm statement runs the whole K loop and the fp32 accumulators
    never go to memory (else they are loaded and stored once per block). A planner decision, not a
    DSL option: it holds for small tiles (at most 5 4x4 accumulator pairs, e.g. 4x16 and 8x8 at
    k_unroll 2) and changes only speed, never results."""
    if not zero_points_in_b(spec) or spec.scales == "ort":
        return False
    if staged(spec):  # staged_b_refusal admits only tiles written with them in registers
        return True
    acc, a, b, zp = _ime_loop_registers(spec)
    return 2 * acc + a + b + zp <= VECTOR_REGISTERS and 2 * acc + IME_FOLD_REGS_IN_REGISTERS <= VECTOR_REGISTERS


def staged_b_refusal(spec: KernelSpec) -> str | None:
    """Why `stage_b = m_block` cannot be generated for spec (None: it can). Staged, the int4 B of an
    N tile is unpacked (minus its zero points) and its scales are spread over the fold's lanes once
    per M block into the workspace; every tile of the block then loads them instead of unpacking:
    the loop keeps only loads and vmadots, the fold one load for the B scales (fp16 ones widened
    while staging). The form is written for the tuner's prefill winners: two 4-column B tiles, one
    or two 4-row A tiles, two 8-k steps per iteration, fp32 accumulators and the fold's index tables
    in registers; and 8x12 with a_scale_type = fp16 (three B tiles, one k-step of them loaded at a
    time), whose fold spreads the fp16 scales with no table (staged._staged_8x12_plan)."""
    if spec.target != "ime" or spec.op != "gemm" or spec.bits != 4 or spec.abi != "imegen":
        return "stage_b = m_block stages unpacked int4 B for IME gemm kernels: it needs target ime, op gemm, bits 4, abi imegen"
    shape = (spec.tile_m, spec.tile_n)
    if shape not in ((4, 8), (8, 8), (8, 12)) or spec.k_unroll != 2:
        return (f"stage_b = m_block is generated for tiles 4x8, 8x8 and 8x12 at k_unroll 2 (fp32 accumulators, staged B and "
                f"the fold's registers all fit), not {spec.tile_m}x{spec.tile_n} at k_unroll {spec.k_unroll}")
    if shape == (8, 12) and spec.a_scale_type != "fp16":
        return ("stage_b = m_block with tile 8x12 is generated with a_scale_type = fp16 (and scale_type = fp16): "
                "its fold has registers for the fp16 scales' spreads only")
    return None


def spread_refusal(spec: KernelSpec) -> str | None:
    """Why `spread = per_register` cannot be generated for spec (None: it can). The fold of two-column-
    tile kernels with fp32 accumulators in registers spreads the A and B scales over an LMUL-4 group
    of accumulator lanes with one vrgatherei16 each; per_register does it with LMUL-1 vrgathers (and
    a whole-register copy where two registers need the same lanes): more instructions, but LLVM's
    hardware-measured X60 schedule gives an LMUL-4 vrgather 64 cycles of the vector integer unit and
    an LMUL-1 one 4 (docs/ime-isa.md §7)."""
    if spec.target != "ime" or spec.op != "gemm" or spec.abi != "imegen":
        return "spread = per_register changes the fold of IME gemm kernels: it needs target ime, op gemm, abi imegen"
    if staged(spec):  # staged_b_refusal admits only tiles whose staged fold spreads A scales over LMUL-4 groups
        return None
    in_regs = fp32_acc_in_registers(spec)
    # With the fp32 accumulators in registers, the folds that keep their index tables in registers
    # (folds.paired_column_fold, _grouped_signed_fold) exist up to these sizes; with them in memory, the
    # column-pair fold of 8-row tiles (folds.column_pair_fold). tests/test_kernels.py plans every setting.
    if in_regs and max(spec.tile_m, spec.tile_n) <= 12 and spec.tile_m * spec.tile_n * spec.k_unroll <= 128:
        return None
    if not in_regs and zero_points_in_b(spec) and spec.tile_m == 8 and spec.tile_n <= 16:
        return None
    return (f"spread = per_register is generated for tiles up to 12x12 and TM x TN x k_unroll <= 128 with the fp32 "
            f"accumulators in registers, 8-row tiles up to 16 columns with them in memory, and staged kernels; not "
            f"{spec.tile_m}x{spec.tile_n} at k_unroll {spec.k_unroll}" + ("" if in_regs else " with the fp32 accumulators in memory"))


def a_fp16_refusal(spec: KernelSpec) -> str | None:
    """Why `a_scale_type = fp16` cannot be generated for spec (None: it can). Each A block's scale is
    max|a| / 127 rounded up to an fp16 value and A is quantized with exactly that scale (codes stay
    within +-127; an A block above 127 x 65504 has no such scale, and matmul returns
    IMEGEN_ERR_RANGE). The fold then multiplies the two fp16 scales with one widening vfwmul (Zvfh,
    which the X60 has: docs/ime-isa.md §5) into their exact fp32 product, where fp32 A scales need
    the B scales widened (vfwcvt) and multiplied in fp32. Written for the staged fold (whose spreads
    then run at e16, the spread B scales taking half the bytes) and the IME gemv fold (the row's
    scale as a scalar: vfwmul.vf)."""
    if spec.target != "ime" or spec.abi != "imegen" or spec.scale_type != "fp16" or not (staged(spec) or spec.op == "gemv"):
        return ("a_scale_type = fp16 is generated for IME kernels with fp16 B scales (scale_type = fp16) whose fold "
                "multiplies two fp16 scales: the staged fold (stage_b = m_block) and op gemv")
    if spec.spread != "group":
        return "a_scale_type = fp16 spreads its e16 scales by LMUL-1 gathers already; remove 'spread'"
    return None


def staged(spec: KernelSpec) -> bool:
    return spec.stage_b == "m_block"


def register_budget(spec: KernelSpec) -> dict[str, int]:
    """Vector registers the kernel's inner loop keeps live, by class."""
    ma, na = max(1, spec.tile_m // 4), spec.tile_n // 4
    if spec.tile_m == 1:  # gemv: an even pair per 4 k-steps (slides read vs1+1), one if no slide runs
        a_regs = 1 if spec.k_unroll == 1 else 2 * -(-spec.k_unroll // 4)
    else:
        a_regs = ma * spec.k_unroll
    b_regs = na * spec.k_unroll
    # After the k loop the A/B registers are dead and the vector fold (fp32 scaling, zero-point
    # correction) needs 8 register pairs of its own (gemv: three e32 groups of the row's TN lanes
    # above the accumulators, see folds.gemv_fold): count whichever phase needs more.
    loop = 2 * ma * na + a_regs + b_regs
    in_regs = fp32_acc_in_registers(spec)
    if spec.tile_m == 1:
        g = gemv_fold_lmul(spec.tile_n)
        fold = -(-2 * na // g) * g + 3 * g - loop
    elif in_regs:
        fold = IME_FOLD_REGS_IN_REGISTERS - a_regs - b_regs
    else:
        fold = IME_FOLD_REGS - a_regs - b_regs
    if staged(spec) and na == 3:  # 8x12: columns 0..7 one k-step at a time, 8..11 of two; no tables (staged.py)
        return {"int32 accumulators": 12, "fp32 accumulators": 12, "A tiles": a_regs, "B tiles": na + 1}
    if staged(spec):  # no zero points or unpacking in the loop; the fold's tables and B scales stay apart
        return {"int32 accumulators": 2 * ma * na, "fp32 accumulators": 2 * ma * na, "A tiles": a_regs, "B tiles": b_regs,
                "index tables": 2 * ma, "spread B scales": 4}
    zp = na if zero_points_in_b(spec) == "asymmetric" else 0
    budget = {"int32 accumulators": 2 * ma * na, "A tiles": a_regs, "B tiles": b_regs}
    if in_regs:
        budget = {"int32 accumulators": 2 * ma * na, "fp32 accumulators": 2 * ma * na, "A tiles": a_regs, "B tiles": b_regs}
    if zp:
        budget["B zero points"] = zp
    return {**budget, "fold temporaries": max(0, fold - zp)}
