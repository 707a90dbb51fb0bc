"""Stage 2: raw settings -> a validated, frozen KernelSpec.

Every rule that decides whether a kernel can run on its target lives in this file, so a
spec is either refused here (with the position of the offending setting and the reason) or
is known to be generatable.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import Span, SpecError
from .names import dispatch_files, dispatch_prefix, reserved_names
from .parse import Block, Setting, ValueList, parse_file, parse_text

VECTOR_REGISTERS = 32
IME_VLEN = 256  # K1/X60: vmadot's 4x8x4 int8 tile is defined for VLEN=256 only.
IME_FOLD_REGS = 16  # the per-block vector fold: 8 even register pairs (see ime_folds.ime_fold)
# The fold of a kernel whose fp32 accumulators stay in registers: index tables, scale staging,
# spread B scales, products and one row tile's spread A scales (6 even pairs, ime_folds._signed_fold).
IME_FOLD_REGS_IN_REGISTERS = 12


@dataclass(frozen=True)
class KernelSpec:
    name: str
    op: str = "gemm"  # gemm (M>1, prefill) | gemv (M=1, decode)
    bits: int = 4  # weight bits: 4 | 8
    block: int = 32  # quantization block size along K
    zero_point: str = "symmetric"  # symmetric (implicit 2^(bits-1)) | asymmetric (ORT uint8-packed) | blksum (8-bit MLAS)
    bias: bool = False
    compute: str = "fp32"  # fp32 (dequantize B, fp32 FMA) | int8 (quantize A per block, integer dots)
    target: str = "scalar"  # ime | rvv | scalar
    vlen: int | None = None  # ime: 256; rvv: the smallest VLEN the kernel accepts
    tile_m: int = 1  # register-blocked output tile, rows
    tile_n: int = 16  # ... and columns
    k_unroll: int = 2  # K steps per inner-loop iteration (ime: 8-k vmadot steps; else single k)
    unpack: str = "planar"  # int4 nibble order in packed B: planar (k, k+8) | interleaved (k, k+1)
    panel: int = 16  # packed-B column panel width
    scales: str = "inline"  # scales/zero points: inline (ahead of each panel block) | separate | ort (raw ORT arrays)
    abi: str = "imegen"  # imegen (NAME_matmul) | mlas (ORT MLAS QNBitGemm dispatch entry points)
    scale_type: str = "fp32"  # packed-B scales: fp32 (ORT's) | fp16 (half the scale bytes, int8 compute only)
    stage_b: str = "tile"  # int4 B unpacked by each tile | once per M block into the workspace (staged_b_refusal)
    spread: str = "group"  # the fold spreads scales over the accumulator lanes by one vrgather per LMUL-4 group | per register (spread_refusal)
    a_scale_type: str = "fp32"  # A's block scales: fp32 (MLAS CompInt8) | fp16, rounded up, A quantized with it (a_fp16_refusal)
    # Routing in the custom-op library (the generated code does not depend on these): the weight shapes
    # (N, K) the kernel was chosen for (empty: any), the fewest rows a gemm kernel is chosen for, and
    # whether it only runs slices whose thread cannot reach an IME hart.
    shapes: tuple[tuple[int, int], ...] = ()
    min_rows: int = 2
    fallback: bool = False
    source: Span | None = field(default=None, compare=False)

    def describe(self) -> str:
        """One line with every setting, for generated-file headers and tables."""
        vlen = f" vlen={self.vlen}" if self.vlen else ""
        return (
            f"op={self.op} bits={self.bits} block={self.block} zero_point={self.zero_point} "
            f"bias={'yes' if self.bias else 'no'} compute={self.compute} target={self.target}{vlen} "
            f"tile={self.tile_m}x{self.tile_n} k_unroll={self.k_unroll} unpack={self.unpack} "
            f"panel={self.panel} scales={self.scales} scale_type={self.scale_type} abi={self.abi}"
            + (f" stage_b={self.stage_b}" if self.stage_b != "tile" else "")
            + (f" spread={self.spread}" if self.spread != "group" else "")
            + (f" a_scale_type={self.a_scale_type}" if self.a_scale_type != "fp32" else "")
            + self.describe_routing()
        )

    def describe_routing(self) -> str:
        """The routing settings that differ from their defaults, as ` key=value` words."""
        return ((f" shapes={','.join(f'{n}x{k}' for n, k in self.shapes)}" if self.shapes else "")
                + (f" min_rows={self.min_rows}" if self.min_rows != 2 else "")
                + (" fallback=yes" if self.fallback else ""))


# key -> (field name, allowed values or a type). Order is the order shown in error messages.
_CHOICES: dict[str, tuple[str, object]] = {
    "op": ("op", ("gemm", "gemv")),
    "bits": ("bits", (4, 8)),
    "block": ("block", (16, 32, 64, 128, 256)),
    "zero_point": ("zero_point", ("symmetric", "asymmetric")),
    "bias": ("bias", ("yes", "no")),
    "compute": ("compute", ("fp32", "int8")),
    "target": ("target", ("ime", "rvv", "scalar")),
    "vlen": ("vlen", (128, 256, 512, 1024)),
    "tile": ("tile", tuple),  # each dimension in TILE_RANGE
    "k_unroll": ("k_unroll", (1, 2, 4, 8)),
    "unpack": ("unpack", ("planar", "interleaved")),
    "panel": ("panel", int),  # in PANEL_RANGE
    "scales": ("scales", ("inline", "separate")),
    "abi": ("abi", ("imegen", "mlas")),
    "scale_type": ("scale_type", ("fp32", "fp16")),
    "stage_b": ("stage_b", ("tile", "m_block")),
    "spread": ("spread", ("group", "per_register")),
    "a_scale_type": ("a_scale_type", ("fp32", "fp16")),
    "shapes": ("shapes", list),  # NxK weight shapes, comma-separated; each dimension in DIM_RANGE
    "min_rows": ("min_rows", "rows"),  # in ROWS_RANGE
    "fallback": ("fallback", ("yes", "no")),
}

# Ranges of the free-form numbers (the other numeric settings are choices above), with why.
TILE_MAX = 256  # rvv at VLEN 1024 holds at most 256 fp32 columns (LMUL 8); scalar at most 256 accumulators
TILE_RANGE = (1, TILE_MAX, "no target holds more than 256 accumulator rows or columns in registers")
PANEL_RANGE = (1, TILE_MAX, "a panel is a multiple of the tile width (at most 256), and wider panels only pad N")

MAX_DIM = 1 << 24  # IMEGEN_MAX_DIM: the largest M, N or K a generated kernel takes
DIM_RANGE = (1, MAX_DIM, "imegen's kernels take M, N and K up to 2^24")
ROWS_RANGE = (2, MAX_DIM, "a gemm kernel serves M > 1 rows (M = 1 is a gemv kernel's), up to 2^24")

MAX_NAME = 200  # kernel names: file names are at most 255 bytes, and build folders add a suffix

MLAS_N_ALIGN = 16  # MLAS_QGEMM_STRIDEN_THREAD_ALIGN: MLAS hands kernels column ranges starting at multiples of 16


def _fmt(values) -> str:
    return ", ".join(str(v) for v in values)


def _shown(value) -> str:
    """A setting's value as written in the spec (tiles as MxN)."""
    return f"{value[0]}x{value[1]}" if isinstance(value, tuple) else repr(value)


def _check_value(s: Setting):
    if s.key not in _CHOICES:
        raise SpecError(s.span, f"unknown setting '{s.key}'; expected one of: {_fmt(_CHOICES)}")
    _, allowed = _CHOICES[s.key]
    if allowed is list:
        return _check_shapes(s)
    if isinstance(s.value, ValueList):
        raise SpecError(s.value_span, f"'{s.key}' takes one value, got a list of {len(s.value)}")
    if allowed == "rows":
        if not isinstance(s.value, int):
            raise SpecError(s.value_span, f"'{s.key}' expects a number of rows, got {_shown(s.value)}")
        _check_range(s, f"'{s.key}'", s.value, ROWS_RANGE)
        return s.value
    if allowed is tuple:
        if not isinstance(s.value, tuple):
            raise SpecError(s.value_span, f"'{s.key}' expects a tile MxN such as 4x16, got {_shown(s.value)}")
        if min(s.value) < 1:
            raise SpecError(s.value_span, f"tile dimensions must be positive, got {s.value[0]}x{s.value[1]}")
        _check_range(s, "tile dimensions", max(s.value), TILE_RANGE)
        return s.value
    if allowed is int:
        if not isinstance(s.value, int) or s.value < 1:
            raise SpecError(s.value_span, f"'{s.key}' expects a positive integer, got {_shown(s.value)}")
        _check_range(s, f"'{s.key}'", s.value, PANEL_RANGE)
        return s.value
    if s.value not in allowed:
        raise SpecError(s.value_span, f"'{s.key}' must be one of: {_fmt(allowed)}; got {_shown(s.value)}")
    return s.value


def _check_shapes(s: Setting) -> tuple[tuple[int, int], ...]:
    """`shapes = NxK[, NxK ...]`: the weight shapes a kernel was chosen for, each N x K once."""
    values = tuple(s.value) if isinstance(s.value, ValueList) else (s.value,)
    for v in values:
        if not isinstance(v, tuple):
            raise SpecError(s.value_span, f"'{s.key}' expects weight shapes NxK such as 1152x896, got {_shown(v)}")
        if not all(DIM_RANGE[0] <= d <= DIM_RANGE[1] for d in v):
            raise SpecError(s.value_span, f"shape {v[0]}x{v[1]}: N and K must be 1..{MAX_DIM}: {DIM_RANGE[2]}")
    if len(set(values)) != len(values):
        twice = next(v for v in values if values.count(v) > 1)
        raise SpecError(s.value_span, f"shape {twice[0]}x{twice[1]} is listed twice")
    return values


def _check_range(s: Setting, what: str, value: int, limits: tuple[int, int, str]) -> None:
    low, high, why = limits
    if not low <= value <= high:
        raise SpecError(s.value_span, f"{what} must be {low}..{high}, got {_shown(s.value)}: {why}")


def _collect(settings: tuple[Setting, ...], into: dict[str, Setting]) -> None:
    seen: set[str] = set()
    for s in settings:
        _check_value(s)
        if s.key in seen:
            raise SpecError(s.span, f"'{s.key}' is set twice in this block")
        seen.add(s.key)
        into[s.key] = s


def lmul_for(bits_needed: int, vlen: int) -> int:
    """Smallest power-of-two LMUL whose register group holds `bits_needed` bits at `vlen`."""
    lmul = 1
    while lmul * vlen < bits_needed:
        lmul *= 2
    return lmul


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
    (see ime_folds.gemv_fold). Other kernels keep one byte per column: their loops spread zero points per byte."""
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
    time), whose fold spreads the fp16 scales with no table (ime_staged._staged_8x12_plan)."""
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
    # (ime_folds.paired_column_fold, _grouped_signed_fold) exist up to these sizes; with them in memory, the
    # column-pair fold of 8-row tiles (ime_folds.column_pair_fold). tests/test_kernels.py plans every setting.
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
    """Vector registers the kernel's inner loop keeps live, by class (0 for scalar)."""
    if spec.target == "ime":
        ma, na = max(1, spec.tile_m // 4), spec.tile_n // 4
        if spec.tile_m == 1:  # gemv: an even pair per 4 k-steps (slides read vs1+1), one if no slide runs
            a_regs = 1 if spec.k_unroll == 1 else 2 * -(-spec.k_unroll // 4)
        else:
            a_regs = ma * spec.k_unroll
        b_regs = na * spec.k_unroll
        # After the k loop the A/B registers are dead and the vector fold (fp32 scaling, zero-point
        # correction) needs 8 register pairs of its own (gemv: three e32 groups of the row's TN lanes
        # above the accumulators, see ime_folds.gemv_fold): count whichever phase needs more.
        loop = 2 * ma * na + a_regs + b_regs
        in_regs = fp32_acc_in_registers(spec)
        if spec.tile_m == 1:
            g = gemv_fold_lmul(spec.tile_n)
            fold = -(-2 * na // g) * g + 3 * g - loop
        elif in_regs:
            fold = IME_FOLD_REGS_IN_REGISTERS - a_regs - b_regs
        else:
            fold = IME_FOLD_REGS - a_regs - b_regs
        if staged(spec) and na == 3:  # 8x12: columns 0..7 one k-step at a time, 8..11 of two; no tables (ime_staged)
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
    if spec.target == "rvv":
        if spec.compute == "fp32":
            l32 = lmul_for(spec.tile_n * 32, spec.vlen)
            return {"fp32 accumulators": spec.tile_m * l32, "B codes": 1, "dequantized B": l32,
                    "scales": l32, "zero points": l32}
        l16 = lmul_for(spec.tile_n * 16, spec.vlen)
        return {"int32 accumulators": spec.tile_m * 2 * l16, "fp32 accumulators": spec.tile_m * 2 * l16,
                "B codes": 1, "B int16": l16, "zero points": l16, "scales": 2 * l16}
    return {}


def _refuse(where: dict[str, Setting], key: str, fallback: Span | None, message: str):
    raise SpecError(where[key].span if key in where else fallback, message)


def build_spec(name: str, s: dict[str, Setting], span: Span | None) -> KernelSpec:
    """Turn one kernel's settings (defaults merged in) into a KernelSpec, or refuse it."""
    kw: dict[str, object] = {}
    for key, setting in s.items():
        field_name = _CHOICES[key][0]
        if key == "tile":
            kw["tile_m"], kw["tile_n"] = setting.value
        elif key in ("bias", "fallback"):
            kw[key] = setting.value == "yes"
        elif key == "shapes":
            kw["shapes"] = _check_shapes(setting)
        else:
            kw[field_name] = setting.value
    spec = KernelSpec(name=name, source=span, **kw)

    def refuse(key: str, message: str):
        _refuse(s, key, span, f"kernel '{name}': {message}")

    if spec.abi == "mlas":
        runtime = {"zero_point": "zero points from ORT at run time (packed uint8, or NULL when symmetric)",
                   "bias": "the bias from ORT at run time (or NULL)", "scales": "ORT's raw scale array"}
        for key, what in runtime.items():
            if key in s:
                refuse(key, f"abi mlas takes {what}; remove '{key}'")
        if spec.bits == 8 and spec.compute != "int8":
            refuse("compute", "MLAS runs 8-bit weights only as CompInt8 (its BlkSum kernels); for CompFp32 ORT "
                   "dequantizes 8-bit B itself, so abi mlas with bits = 8 needs compute = int8")
        if MLAS_N_ALIGN % spec.panel:
            refuse("panel", f"abi mlas: panel {spec.panel} must divide {MLAS_N_ALIGN}, because MLAS offsets packed B by "
                   f"RangeStartN * ldb with RangeStartN a multiple of {MLAS_N_ALIGN}")
        if spec.target == "ime" and spec.bits == 4 and spec.unpack == "interleaved":
            refuse("unpack", "abi mlas with target ime needs unpack = planar: MLAS quantizes A in natural k order, "
                   "and interleaved nibbles would need A's k order permuted to match the unpacked B tiles")
        # Zero points and bias arrive (or not) at run time; the kernels handle both. 8-bit: MLAS
        # hands zero points over as per-block sums (see KernelPlan.blksum).
        spec = replace(spec, zero_point="blksum" if spec.bits == 8 else "asymmetric", bias=False, scales="ort")
    if spec.scale_type == "fp16":
        if spec.abi == "mlas":
            refuse("scale_type", "abi mlas reads ORT's fp32 scale array; fp16 scales need abi = imegen")
        if spec.compute != "int8":
            refuse("scale_type", "fp16 scales (11-bit mantissa) put fp32-compute results outside ORT's accuracy_level 0/1 "
                   "tolerance; use them with compute = int8")
    if staged(spec):
        why = staged_b_refusal(spec)
        if why:
            refuse("stage_b", why)
    if spec.spread != "group":
        why = spread_refusal(spec)
        if why:
            refuse("spread", why)
    if spec.a_scale_type == "fp16":
        why = a_fp16_refusal(spec)
        if why:
            refuse("a_scale_type", why)
    if spec.op == "gemv" and "min_rows" in s:
        refuse("min_rows", "a gemv kernel serves M = 1; min_rows chooses among gemm kernels")
    if spec.fallback and spec.target == "ime":
        refuse("fallback", "a fallback kernel runs where no IME hart is reachable, so its target must be rvv or scalar")
    if spec.fallback and spec.abi == "mlas":
        refuse("fallback", "fallback kernels serve imegen's custom-op library (abi = imegen); MLAS has no IME routing")
    if spec.op == "gemv" and spec.tile_m != 1:
        refuse("tile", f"a gemv kernel computes one row at a time, so its tile must be 1xN, not {spec.tile_m}x{spec.tile_n}")
    if spec.panel % spec.tile_n:
        if "panel" in s:
            refuse("panel", f"panel width {spec.panel} must be a multiple of the tile width {spec.tile_n}")
        refuse("tile", f"tile width {spec.tile_n} does not divide the default panel width {spec.panel}; set panel to "
               f"a multiple of {spec.tile_n} (e.g. panel = {spec.tile_n})")

    if spec.target == "scalar":
        if spec.vlen is not None:
            refuse("vlen", "target scalar uses no vector registers; remove 'vlen'")
        if spec.tile_m * spec.tile_n > 256:
            refuse("tile", f"scalar tile {spec.tile_m}x{spec.tile_n} has more than 256 accumulators")
    elif spec.target == "ime":
        if spec.compute != "int8":
            refuse("compute", "vmadot multiplies int8 operands; target ime needs compute = int8 (use rvv or scalar for fp32)")
        if spec.vlen not in (None, IME_VLEN):
            refuse("vlen", f"IME's 4x8x4 vmadot tile exists only at VLEN={IME_VLEN} (K1), not {spec.vlen}")
        spec = replace(spec, vlen=IME_VLEN)
        if spec.tile_n % 4:
            refuse("tile", f"tile width {spec.tile_n} is not a multiple of vmadot's 4 output columns")
        if spec.tile_m != 1 and spec.tile_m % 4:
            refuse("tile", f"tile height {spec.tile_m} is neither 1 (gemv, one live row) nor a multiple of vmadot's 4 rows")
        if spec.bits == 4 and spec.k_unroll % 2:
            refuse("k_unroll", "4-bit IME needs an even k_unroll: one 32-byte B load unpacks into two 8-k vmadot steps")
        if spec.block % (8 * spec.k_unroll):
            refuse("k_unroll", f"block {spec.block} is not a multiple of the K step 8*k_unroll = {8 * spec.k_unroll}")
    else:  # rvv
        spec = replace(spec, vlen=spec.vlen or 128)
        if spec.tile_n * 32 > 8 * spec.vlen:  # fp32 or int32 accumulators: TN x 32 bits per row
            refuse("tile", f"tile width {spec.tile_n} needs LMUL > 8 at VLEN={spec.vlen}")
    if spec.target != "ime" and spec.block % (2 * spec.k_unroll):
        refuse("k_unroll", f"block {spec.block} is not a multiple of the K step 2*k_unroll = {2 * spec.k_unroll}")

    budget = register_budget(spec)
    if sum(budget.values()) > VECTOR_REGISTERS:
        parts = ", ".join(f"{k} {v}" for k, v in budget.items())
        refuse("tile", f"tile {spec.tile_m}x{spec.tile_n} with k_unroll {spec.k_unroll} needs "
               f"{sum(budget.values())} vector registers ({parts}) > {VECTOR_REGISTERS}")
    return spec


def specs_from_blocks(blocks: list[Block], filename: str | None = None) -> list[KernelSpec]:
    defaults: dict[str, Setting] = {}
    specs: list[KernelSpec] = []
    names: dict[str, Span] = {}
    for block in blocks:
        if block.kind == "defaults":
            _collect(block.settings, defaults)
            continue
        if block.name in names:
            raise SpecError(block.span, f"kernel '{block.name}' is already defined at {names[block.name]}")
        if len(block.name) > MAX_NAME:
            raise SpecError(block.span, f"kernel name of {len(block.name)} characters; at most {MAX_NAME} (its files, "
                            "and imegen's build folders named after it, must stay within 255-byte file names)")
        if block.name.lower() in reserved_names():
            raise SpecError(block.span, f"kernel name '{block.name}' is reserved: imegen would put "
                            f"{reserved_names()[block.name.lower()]} next to the kernel's files")
        twin = next((n for n in names if n.lower() == block.name.lower()), None)
        if twin:
            raise SpecError(block.span, f"kernel '{block.name}' differs from '{twin}' ({names[twin]}) only in case: their "
                            "files would collide on case-insensitive file systems (and their include guards everywhere)")
        names[block.name] = block.span
        own: dict[str, Setting] = {}
        _collect(block.settings, own)
        specs.append(build_spec(block.name, {**defaults, **own}, block.span))
    if not specs:
        where = blocks[0].span if blocks else (Span(filename, 1, 1) if filename else None)
        raise SpecError(where, "the spec defines no kernel")
    if filename is not None and any(s.abi == "mlas" for s in specs):
        _check_dispatch_names(specs, filename)
    _check_dispatch_vlens(specs)
    return specs


def _check_dispatch_names(specs: list[KernelSpec], filename: str) -> None:
    """The MLAS dispatch's files and symbol prefix come from the spec's file name: no kernel may
    produce the same file stem (in any case) or the same C symbols."""
    prefix = dispatch_prefix(filename)
    files: dict[str, list[str]] = {}
    for f in dispatch_files(prefix):
        files.setdefault(Path(f).stem.lower(), []).append(f)
    for spec in specs:
        if spec.name.lower() in files:
            clash = f"the MLAS dispatch's {' and '.join(files[spec.name.lower()])}"
        elif spec.name == prefix[:-1]:
            clash = f"the MLAS dispatch's C symbols ({prefix}supported, ...)"
        else:
            continue
        raise SpecError(spec.source, f"kernel '{spec.name}' would collide with {clash}, which {Path(filename).name} "
                        f"generates for its abi = mlas kernels: rename the kernel")


def _check_dispatch_vlens(specs: list[KernelSpec]) -> None:
    """A spec's abi = mlas kernels form one MLAS dispatch, whose supported() holds only where every one of
    them runs: VLEN = 256 for IME, VLEN >= vlen for RVV. With IME fixing VLEN at 256, an RVV kernel that
    needs more leaves no hart where MLAS would install the dispatch."""
    mlas = [s for s in specs if s.abi == "mlas"]
    ime = next((s for s in mlas if s.target == "ime"), None)
    if ime is None:
        return
    for spec in mlas:
        if spec.target == "rvv" and spec.vlen > IME_VLEN:
            raise SpecError(spec.source, f"kernel '{spec.name}': needs VLEN >= {spec.vlen}, but it shares the MLAS "
                            f"dispatch (all abi = mlas kernels of a spec) with IME kernel '{ime.name}', which runs only "
                            f"at VLEN = {IME_VLEN}: the dispatch's supported() would be false on every hart; use "
                            f"vlen <= {IME_VLEN}, or abi = imegen")


def load_specs(path: str | Path) -> list[KernelSpec]:
    return specs_from_blocks(parse_file(path), str(path))


def specs_from_text(text: str, filename: str = "<spec>") -> list[KernelSpec]:
    return specs_from_blocks(parse_text(text, filename), filename)
