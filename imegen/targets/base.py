"""What a target is to the generic pipeline: the Target protocol every target package fills.

ir.build_spec calls its validation hooks, plan.plan_kernel its layout and lowering hooks, render,
verify and check its build and run facts (march, compilers, runtime pieces, the VLENs it runs at).
None of them compares a target's name: they ask the target (imegen.targets.get(spec.target)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..spec import KernelSpec

VECTOR_REGISTERS = 32  # RVV 1.0: v0..v31

# refuse(key, message): raise the spec error at the setting `key` (or the kernel's block without it)
Refuse = Callable[[str, str], None]


def lmul_name(num: int, den: int = 1) -> str:
    """LMUL num/den as RVV spells it: m2, or mf2 for 1/2."""
    return f"m{num // den}" if num >= den else f"mf{den // num}"


def lmul_for(bits_needed: int, vlen: int) -> int:
    """Smallest power-of-two LMUL whose register group holds `bits_needed` bits at `vlen`."""
    lmul = 1
    while lmul * vlen < bits_needed:
        lmul *= 2
    return lmul


def refuse_k_step(spec: KernelSpec, refuse: Refuse, step: int, what: str) -> None:
    """A block must hold whole K steps of the inner loop (step K values per k_unroll)."""
    if spec.block % (step * spec.k_unroll):
        refuse("k_unroll", f"block {spec.block} is not a multiple of the K step {what} = {step * spec.k_unroll}")


def byte_row_codes(spec: KernelSpec) -> tuple[str, str]:
    """Packed-B code placement of kernels that load one byte row per k (8-bit) or k pair (4-bit): a
    vector load reads one row of the panel. (byte, shift) as C expressions in c and kk (PackLayout)."""
    np_ = spec.panel
    if spec.bits == 8:
        return f"kk * {np_} + c", "0"
    if spec.unpack == "planar":
        return f"((kk / 16) * 8 + kk % 8) * {np_} + c", "((kk % 16) / 8) * 4"
    return f"(kk / 2) * {np_} + c", "(kk % 2) * 4"


def byte_row_k_pair(spec: KernelSpec) -> tuple[str, str]:
    """The k of each nibble plane of byte row kp in that layout: (first, second) as C expressions in kp
    (8-bit: one plane, second "")."""
    if spec.bits == 8:
        return "kp", ""
    if spec.unpack == "planar":
        return "(kp / 8) * 16 + kp % 8", "(kp / 8) * 16 + kp % 8 + 8"
    return "2 * kp", "2 * kp + 1"


def default_zero_point(spec: KernelSpec) -> int:
    """The zero point of B codes stored without one: 2^(bits-1), or 0 for MLAS's signed 8-bit codes (blksum)."""
    return 0 if spec.zero_point == "blksum" else 1 << (spec.bits - 1)


@dataclass(frozen=True)
class ImeHarts:
    """Where a matrix ISA's instructions may run on its board, for the custom-op library's glue
    (imegen/ort/customop_lib.c, runtime/harts.h): the harts whose /proc/cpuinfo marchid is `marchid`."""

    board: str  # how messages name the SoC ("K1")
    marchid: int  # the marchid of the harts that have the extension
    cores: int  # how many there are: a node's B is cut into this many column slices, one per core
    where: str  # where they are, for messages and the IMEGEN_IME_HARTS hint ("0-3")
    # How a thread elsewhere reaches them: "" pins it there for one slice (sched_setaffinity) and back; a path is
    # the kernel's routing file a thread writes to become, for good, a thread of those cores (pinning follows
    # when the file is absent)
    route_file: str = ""
    # The other harts have another VLEN (the K3's X100s: 256 beside the A100s' 1024): the kernels' A quantizers, vector
    # code written for the IME harts' VLEN, must run there too, not on whichever thread calls the node
    own_vlen: bool = False


@dataclass(frozen=True)
class Target:
    """A code-generation target. Subclasses (one per package under imegen/targets/) override the
    hooks whose default does not fit; the fields are facts the pipeline reads."""

    name: str  # the DSL's `target = NAME`
    title: str  # how messages name its kernels ("IME kernel 'x'")
    micro_template: str  # the micro-kernel template the ABI templates include
    march: str  # -march its kernel sources are compiled with
    compilers: tuple[str, ...]  # the cross compilers that can build it (verify.compilers_for)
    vector: bool  # uses vector registers: VLEN matters (runs, refusals), RVV helpers where the compiler has them
    computes: tuple[str, ...] = ("fp32", "int8")  # the DSL's `compute` values it accepts
    host_build: bool = False  # portable C: also built and checked natively, as the reference build
    # executes SpacemiT IME instructions (vmadot): runs only on IME harts; test builds link the emulator QEMU
    # needs for them (`emulator`)
    needs_ime: bool = False
    # the SIGILL trap-and-emulate runtime test builds link for its matrix instructions under QEMU: the stem of
    # runtime/NAME.c, whose NAME.h declares imegen_NAME_install() and imegen_NAME_count() (None: no emulator)
    emulator: str | None = None
    # tile rows (when more than one) and columns come in multiples of these: the matrix instruction's output tile
    tile_step: tuple[int, int] = (1, 1)
    intrinsics_required: bool = False  # cannot build without riscv_vector.h (else only helpers use it)
    plan_part: str | None = None  # the KernelPlan field its lowering fills (KernelPlan.rvv, KernelPlan.ime)
    # DSL settings only this target offers -> why a spec cannot have their non-default value (None: it can);
    # ir.build_spec asks the target offering a setting, whatever the spec's own target is.
    options: Mapping[str, Callable[[KernelSpec], str | None]] = field(default_factory=dict, compare=False)
    fallback_refusal: str | None = None  # why its kernels cannot be custom-op fallback kernels (None: they can)
    only_vlen: int | None = None  # the one VLEN its kernels run at, if it has one (IME: 256)
    ime_harts: ImeHarts | None = None  # needs_ime targets: which harts run them (the custom-op library's routing)
    # A template of the target's own that defines quantize_block_to(x, q, sum): a whole block of A quantized
    # and its codes stored from q (A[m][k0]'s byte) into a layout a_chunk_stride cannot describe (None: the
    # shared quantize_block.c.j2's, when a_chunk_stride is set)
    a_store_template: str | None = None
    # abi = mlas, CompInt8: how the micro-kernel reads MLAS's Q8 rows of A. "rows": as rows lda bytes apart with
    # row-major scales (templates/abi_mlas.c.j2 stages them so); "workspace": in the target's own A layout
    # (a_index, a_scale_index), into which each kernel call stages the rows it was handed
    mlas_a_layout: str = "rows"
    # abi = mlas: the dispatch itself keeps the vmadots on the ime_harts, because nothing else would: it installs
    # where such a hart exists and confines each kernel call to them (entering them as the custom-op library
    # does), or aborts the call. False: MLAS's VLEN check at init is all (the K1, where every hart has VLEN 256
    # and a vmadot on a core without IME traps: its docs ask for taskset)
    mlas_hart_routing: bool = False

    # --- DSL validation (ir.build_spec) ---

    def mlas_refusal(self, spec: KernelSpec) -> tuple[str, str] | None:
        """(setting, why) when an abi = mlas kernel of this target cannot follow MLAS's layouts."""
        return None

    def validate(self, spec: KernelSpec, refuse: Refuse) -> KernelSpec:
        """The target's own rules on a spec the generic rules accepted; returns it with target
        defaults filled in (e.g. vlen)."""
        return spec

    def register_budget(self, spec: KernelSpec) -> dict[str, int]:
        """Vector registers the kernel's inner loop keeps live, by class (empty: none)."""
        return {}

    # --- the kernels ort-accelerate derives where the board has no tuning table ---

    def serving_settings(self, op: str, block: int) -> dict[str, object] | None:
        """DSL settings (tile, unpack, panel, k_unroll) of the target's own kernel for op (gemv or gemm) at `block`
        (None: it has none; ort-accelerate then needs a tuning table for the board)."""
        return None

    def hp_decode_settings(self, op: str) -> dict[str, object] | None:
        """Settings that turn the target's serving gemv (op) into one with block-scaled FP16 vmadots and its gemm
        into one reading the same packed B (ort-accelerate --decode hp), for the groups they validate for; None:
        the target has none."""
        return None

    # --- attention kernels (ir.build_attention, render.render_attention) ---

    def validate_attention(self, spec, refuse: Refuse):
        """An AttentionSpec's target rules; returns it with target defaults filled in."""
        refuse("target", f"target {self.name} has no attention kernels")
        return spec

    def plan_attention(self, spec):
        """The AttentionPlan templates/attention_*.c.j2 renders."""
        raise NotImplementedError(f"target {self.name} has no attention kernels")

    # --- where it runs (check, verify, the dispatch's supported()) ---

    def accepts_vlen(self, spec: KernelSpec, vlen: int) -> bool:
        """Does the kernel run on a hart of this VLEN (else it returns IMEGEN_ERR_VLEN)?"""
        return True

    def vlen_need(self, spec: KernelSpec) -> str:
        """The harts it runs on, as its supported() comment says it."""
        return "any hart"

    def supported_body(self, spec: KernelSpec) -> tuple[str, ...]:
        """The C statements of NAME_supported(): 1 when the running hart can run the kernel."""
        return ("return 1;",)

    # --- layouts and lowering (plan.plan_kernel) ---

    def pack_codes(self, spec: KernelSpec) -> tuple[str, str]:
        """Where packed B keeps code (c, kk): (byte, shift) as C expressions (see plan.PackLayout)."""
        return byte_row_codes(spec)

    def zp_nibbles(self, spec: KernelSpec) -> bool:
        """Zero points packed two per byte in packed B (else one byte per column)."""
        return False

    def a_index(self, spec: KernelSpec) -> tuple[str, int, int]:
        """Where quantized (or staged fp32) A[m][k] lives: (C expr in m, k, Kpad; rows padded to; tail bytes)."""
        return "m * Kpad + k", spec.tile_m, 0

    def a_chunk_stride(self, spec: KernelSpec) -> int | None:
        """Bytes between a row's 8-k chunks of quantized A when a vector quantizer stores whole blocks
        into the kernel's layout (plan.KernelPlan.a_chunk_stride); None: codes copied one by one."""
        return None

    def a_scale_group(self, spec: KernelSpec) -> int:
        """A's block scales by groups of this many rows (1: row-major [Mpad][k_blocks])."""
        return 1

    def quantize_lmul(self, spec: KernelSpec) -> int:
        """LMUL of the vector A quantizer's fp32 groups (templates/quantize_block.c.j2)."""
        return 8

    def finishes_pack(self, spec: KernelSpec) -> str:
        """What the target's micro template's NAME_finish_pack(N, K, packed_b) does, which pack_b then calls once every
        chunk is packed, to rework the chunks and write one fp32 factor after them that the kernel multiplies its
        results by (packed_scales then says what the kernel computes with); "" when it has none."""
        return ""

    def packed_scales(self, spec: KernelSpec, half, widths: list[int]):
        """The fp16 B scales ([N, kb], as the packer rounds them) a kernel with fp16 scales computes with, B cut into
        column slices of `widths`, each packed alone: as stored, unless finish_pack reworks them."""
        return half

    def exact_on_exact_data(self, spec: KernelSpec) -> bool:
        """Is the kernel exact on exactly representable data (imegen check compares it so)?"""
        return True

    def a_row_finish(self, spec: KernelSpec) -> str:
        """What the target's a_store_template's finish_row(q, scale, extra, kb, whole) does, which quantize_rows then
        calls on each row once its codes (q: the row's first), fp32 scales and int32 code sums (extra) are in place,
        to rework them into the form its kernel reads (its quantize_row_to may store its `whole` blocks so already);
        "" when it has none."""
        return ""

    def lower(self, spec: KernelSpec, pack) -> object | None:
        """The target's part of the KernelPlan (stored in the field plan_part names), given the
        packed-B layout (plan.PackLayout)."""
        return None
