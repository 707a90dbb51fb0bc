"""An analytic cost model of the SpacemiT K1 / X60 (the A60 cores, with IME) for imegen kernels.

Everything here is MODELED, not measured on hardware. Inputs are exact instruction counts by
class and the bytes vector loads/stores really accessed (QEMU plugin, count/measure.py), and the bytes
a kernel moves to and from DRAM (from its plan's layouts). Outputs: cycles, seconds and a
roofline bound. Sources: docs/ime-isa.md §7 (each figure with its public source), in particular LLVM's
RISCVSchedSpacemitX60.td.

  core     in-order, dual issue (LLVM IssueWidth = 2); 2 scalar load/store pipes; 1 scalar FP
           pipe; divide/sqrt occupy a divider for 15 cycles (LLVM: fdiv.s 15, div 12-20).
  vector   VLEN = 256, DLEN = 128 (LLVM: DLEN = VLEN / 2); one vector load/store unit (LLVM
           SMX60_VLS), one integer (VIEU) and one FP (VFP) vector unit. Work is counted in
           128-bit beats. Arithmetic on a group of EMUL registers (vtype LMUL, doubled for
           widening/narrowing) needs max(1, EMUL * VLEN / DLEN) beats; VIEU and VFP retire 2 beats
           per cycle, calibrated on SpacemiT's cpufp: vfmacc.vv f32 32.0 GFLOPS per core = 256 bits
           per cycle at 2.0 GHz (the f16, f64 and 0.128 TOPS int8 vector figures agree).
           Loads/stores are charged what they accessed: max(1, ceil(bytes / 16)) beats each, at
           1 beat (16 B) per cycle (ASSUMPTION: no measured vector load bandwidth); strided and
           indexed accesses 1 element per cycle (ASSUMPTION). At most one vector instruction
           issues per cycle (ASSUMPTION: one vector issue queue).
  IME      one 4x8x4 vmadot (128 int8 MACs) per cycle per core: cpufp measured 511.5 GOPS on one
           core and 2.046 TOPS on cores 0-3, i.e. 256 ops/cycle at 2.0 GHz. Only cores 0-3 have IME.
  clock    2.0 GHz, the frequency at which the cpufp figures are whole per-cycle rates
           (BPI-F3 boards ship at 1.6 GHz: compute-bound times scale by 1.25 there).
  caches   32 KB L1 per core, 512 KB L2 per 4-core cluster, 64 B lines (capacity only).
  DRAM     32-bit LPDDR4X-2666, 10.66 GB/s theoretical. Measured (tinymembench, one thread,
           BPI-F3): memcpy 2.62 GB/s, memset 7.18 GB/s. A copy reads and writes every byte, so a
           core sustains at least 2 x 2.62 = 5.24 GB/s of DRAM traffic: the model's "effective"
           bandwidth (an inference). No multi-core STREAM figure exists, so 4 cores share the
           same 5.24 GB/s; the theoretical figure is reported as the ultimate memory bound.

Measured occupancies (core_cycles(measured=True), the bench's sensitivity): LLVM's SpacemiT-X60
schedule now gives hardware-measured cycles per instruction and LMUL for every RVV load, store and
arithmetic group (docs/ime-isa.md §7); the plugin histograms the counted instructions by those
groups and occupancy.py applies the tables, in place of the VLS/VIEU/VFP charges above. It agrees
with the beats above for LMUL >= 2 loads and for vadd/vfmacc, and is up to 16x costlier for
vrgather.vv at LMUL 4, 2x for logical ops, shifts, extensions and conversions.

Core time is a resource bound: the busiest of issue slots, scalar load/store, scalar FP, divider,
vector issue, vector LSU, VIEU, VFP and IME. Dependencies, latencies, branch mispredictions and
cache-miss stalls are NOT modeled, so core time is optimistic for code with long dependency
chains. Kernel time = max(core time, DRAM time): transfers overlap computation perfectly.

DRAM traffic of one matmul call (abi_imegen.c.j2's loop order: K chunks (k_chunks), M blocks whose
workspace rows over a chunk's K fit 3/4 of the L2 (plan.A_BLOCK_BYTES), then N tiles, then M tiles):
the packed B once per M block; A (fp32) read once; C written once, and re-read and rewritten once per
further K chunk; the A workspace (a_workspace_dram): int8 kernels of imegen's ABI quantize each M block
just before its N tiles into one buffer every block reuses, which stays in the L2 and is written back
once; a workspace prepared whole first (fp32 staging, MLAS's ABI) is written once and, when it is larger
than the A block budget, read back from DRAM once more. L1/L2 bandwidth is not modeled.

Roofline: max(2MNK / IME peak of the cores used, compulsory bytes / 5.24 GB/s), compulsory
bytes = the weights in the most compact format imegen or ONNX Runtime stores (int4 codes, fp16
scales as imegen's scale_type = fp16, 4-bit packed zero points as ORT's) + A and C in fp32. A kernel's efficiency is modeled time / roofline
time: 1.00 is ideal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ...plan import KernelPlan
from . import occupancy

GB = 1e9


@dataclass(frozen=True)
class X60Params:
    clock_hz: float = 2.0e9
    vlen: int = 256
    dlen: int = 128
    issue_width: int = 2
    scalar_mem_per_cycle: int = 2
    scalar_fp_per_cycle: int = 1
    div_cycles: int = 15  # fdiv.s (LLVM X60: 15); integer divide 12-20
    vector_issue_per_cycle: int = 1
    vls_beats_per_cycle: int = 1
    vieu_beats_per_cycle: int = 2
    vfp_beats_per_cycle: int = 2
    vlsx_elements_per_cycle: int = 1
    vmadot_per_cycle: float = 1.0
    vmadot_macs: int = 128  # 4 x 8 x 4
    ime_cores: int = 4
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 512 * 1024
    dram_theoretical: float = 10.66 * GB
    dram_memcpy_1t: float = 2.62 * GB  # measured, bytes copied per second
    dram_effective: float = 2 * 2.62 * GB  # memcpy moves every byte twice

    @property
    def peak_ops_per_core(self) -> float:
        """int8 ops (2 per MAC) per second on one core's IME."""
        return 2 * self.vmadot_macs * self.vmadot_per_cycle * self.clock_hz


X60 = X60Params()

SCALAR_CLASSES = ("int", "branch", "mem", "fp", "div")
VECTOR_CLASSES = ("vload", "vstore", "vlsx", "valu", "vfpu", "vmadot")
CLASSES = SCALAR_CLASSES + ("vset",) + VECTOR_CLASSES
TAGS = ("kernel", "callee")  # counted work; "excluded"/"outside" never reach the model
# The brief's five display groups.
GROUPS = {"vmadot": ("vmadot",), "vec ld/st": ("vload", "vstore", "vlsx"), "vec cfg": ("vset",),
          "vec ALU": ("valu", "vfpu"), "scalar": SCALAR_CLASSES}


def class_totals(counts: dict[str, float], tags=TAGS) -> dict[str, float]:
    """Instruction counts per class, summed over the counted tags (kernel + callee)."""
    return {c: sum(counts.get(f"{t}.{c}", 0) for t in tags) for c in CLASSES}


def total_instructions(counts: dict[str, float], tags=TAGS) -> float:
    """Every instruction of the given tags, whatever its class."""
    return sum(class_totals(counts, tags).values())


def group_totals(counts: dict[str, float], tags=TAGS) -> dict[str, float]:
    cls = class_totals(counts, tags)
    return {g: sum(cls[c] for c in members) for g, members in GROUPS.items()}


def _beats(counts: dict[str, float], unit: str, p: X60Params, tags=TAGS) -> float:
    """DLEN beats of vector arithmetic from the plugin's EMUL histogram: max(1, EMUL * VLEN / DLEN) each."""
    total = 0.0
    for t in tags:
        for b in range(10):
            n = counts.get(f"{t}.{unit}.e{b - 3}", 0)
            if n:
                total += n * max(1.0, 2.0 ** (b - 3) * p.vlen / p.dlen)
    return total


def mem_stat(counts: dict[str, float], cls: str, stat: str, tags=TAGS) -> float:
    """Measured vector-memory statistic (bytes, elems, beats) of a class, summed over tags."""
    return sum(counts.get(f"{t}.{cls}.{stat}", 0) for t in tags)


@dataclass(frozen=True)
class ResourceCycles:
    """Cycles each resource of a core model is busy (a subclass's fields); `cycles` is the binding one."""

    @property
    def cycles(self) -> float:
        return max(asdict(self).values())

    @property
    def bound(self) -> str:
        d = asdict(self)
        return max(d, key=d.get)


@dataclass(frozen=True)
class CoreCycles(ResourceCycles):
    """The X60's resources."""

    issue: float
    scalar_mem: float
    scalar_fp: float
    divider: float
    vector_issue: float
    vls: float
    vieu: float
    vfp: float
    ime: float


def core_cycles(counts: dict[str, float], p: X60Params = X60, measured: bool = False) -> CoreCycles:
    """measured: the vector units (VLS, VIEU, VFP) busy for the cycles LLVM's hardware-measured X60
    schedule gives each instruction (occupancy.py) instead of this model's beats; the rest as ever."""
    cls = class_totals(counts)
    vector = sum(cls[c] for c in VECTOR_CLASSES)
    units = {
        "vls": (mem_stat(counts, "vload", "beats") + mem_stat(counts, "vstore", "beats")) / p.vls_beats_per_cycle
        + max(mem_stat(counts, "vlsx", "elems"), cls["vlsx"]) / p.vlsx_elements_per_cycle,
        "vieu": _beats(counts, "vieu", p) / p.vieu_beats_per_cycle,
        "vfp": _beats(counts, "vfp", p) / p.vfp_beats_per_cycle,
    }
    if measured:
        units = occupancy.measured_cycles(counts)
        if units is None:
            raise ValueError("these counts predate the plugin's occupancy kinds: recount them")
    return CoreCycles(
        issue=sum(cls.values()) / p.issue_width,
        scalar_mem=cls["mem"] / p.scalar_mem_per_cycle,
        scalar_fp=cls["fp"] / p.scalar_fp_per_cycle,
        divider=cls["div"] * p.div_cycles,
        vector_issue=vector / p.vector_issue_per_cycle,
        ime=cls["vmadot"] / p.vmadot_per_cycle,
        **units,
    )


# ---------------------------------------------------------------------------------------------
# Bytes


def ort_weight_bytes(N: int, K: int, block: int, bits: int = 4, zero_points: bool = True, scale_bytes: int = 4) -> int:
    """ONNX Runtime MatMulNBits weight bytes: B codes, scales (fp32 in ORT), packed uint8 zero points."""
    kb = -(-K // block)
    zp = N * (-(-kb * bits // 8)) if zero_points else 0
    return N * kb * block * bits // 8 + N * kb * scale_bytes + zp


def compulsory_bytes(M: int, N: int, K: int, block: int, bits: int = 4, zero_points: bool = True) -> int:
    """Bytes any implementation must move: weights with fp16 scales (the most compact format any
    kernel here streams), A and C in fp32."""
    return ort_weight_bytes(N, K, block, bits, zero_points, scale_bytes=2) + 4 * M * K + 4 * M * N


def packed_b_bytes(plan: KernelPlan, N: int, K: int) -> int:
    L, s = plan.pack, plan.spec
    # packed_b_size() less the fold's zero-point over-read pad (L.tail_bytes): never streamed, at most
    # one cache line more per call, it must not decide DRAM-bound ties between layouts.
    return -(-N // L.panel) * -(-K // s.block) * (L.data_bytes + L.scale_bytes + L.zp_bytes)


def workspace_bytes(plan: KernelPlan, M: int, K: int) -> int:
    """A's part of workspace_size() (prepare_a_{int8,fp32}.c.j2); a staged B adds staged_bytes after it."""
    s = plan.spec
    kb = -(-K // s.block)
    kpad = kb * s.block
    rows = plan.a_rows_padded_to if s.compute == "int8" else s.tile_m
    mpad = -(-M // rows) * rows
    if s.compute == "fp32":
        return mpad * kpad * 4
    qa = -(-(mpad * (kpad + plan.a_tail_pad)) // 64) * 64
    return qa + mpad * kb * 8


@dataclass(frozen=True)
class Traffic:
    dram: float  # bytes between DRAM and the chip
    b_passes: int  # times the packed B streams from DRAM: once per M block (of any K chunk)


def staged_bytes(plan: KernelPlan, K: int) -> int:
    """The workspace's staged B of one N tile (stage_b = m_block; mirrors staged_bytes() of prepare_a_int8.c.j2)."""
    return -(-K // plan.spec.block) * plan.ime.stage_block_bytes if plan.ime and plan.ime.staged else 0


def m_block_rows(plan: KernelPlan, K: int) -> int:
    """Rows of A per M block (mirrors the kernel's mc): the workspace rows that fit the A budget, which
    staged kernels share with one N tile's staged B."""
    tm, staged = plan.spec.tile_m, staged_bytes(plan, K)
    return max(tm, max(0, plan.a_block_bytes - staged) // (workspace_bytes(plan, tm, K) // tm) // tm * tm)


def chunk_k(plan: KernelPlan, K: int, chunks: int) -> int:
    """The K extent of the longest of `chunks` K chunks (whole blocks), as the kernel sizes its M blocks."""
    kb = -(-K // plan.spec.block)
    return -(-kb // chunks) * plan.spec.block


def k_chunks(plan: KernelPlan, M: int, N: int, K: int) -> int:
    """The K chunks a call runs (mirrors k_chunks() of abi_imegen.c.j2): of 1..4, the count whose B
    passes plus the C round trips of the further chunks move the fewest bytes; MLAS's entry points
    take one K range."""
    if plan.spec.abi != "imegen":
        return 1
    if plan.forced_k_chunks:
        return min(plan.forced_k_chunks, -(-K // plan.spec.block))
    kb = -(-K // plan.spec.block)
    # the C code's criterion, B passes and C round trips: _traffic less A's workspace (A's read is the same for every q)
    return min((_traffic(plan, M, N, K, q, workspace=False).dram, q) for q in range(1, min(4, kb) + 1))[1]


def a_workspace_dram(plan: KernelPlan, M: int, K: int, q: int) -> int:
    """DRAM bytes of A's workspace in a call of q K chunks (the module docstring): one M block's buffer
    written back once when each block is quantized into it (abi_imegen.c.j2's run), else the whole
    workspace written, and read back when it outgrows the A block budget."""
    s = plan.spec
    if s.abi == "imegen" and s.compute == "int8":
        ck = chunk_k(plan, K, q)
        return workspace_bytes(plan, min(M, m_block_rows(plan, ck)), ck)
    return prepared_whole_dram(workspace_bytes(plan, M, K), plan.a_block_bytes)


def prepared_whole_dram(workspace: int, budget: int) -> int:
    """DRAM bytes of a workspace filled whole before the tiles run: written once and, when it outgrows
    the cache budget its readers have, read back once more."""
    return workspace * (2 if workspace > budget else 1)


def _traffic(plan: KernelPlan, M: int, N: int, K: int, q: int, workspace: bool = True) -> Traffic:
    """DRAM bytes of one call in q K chunks: B once per M block, A (fp32) read once, A's workspace
    (a_workspace_dram; not with workspace=False), C written once and re-read and rewritten once per further chunk."""
    passes = -(-M // m_block_rows(plan, chunk_k(plan, K, q)))
    ws = a_workspace_dram(plan, M, K, q) if workspace else 0
    dram = packed_b_bytes(plan, N, K) * passes + 4 * M * K + ws + 4 * M * N * (2 * q - 1)
    return Traffic(float(dram), passes)


def dram_traffic(plan: KernelPlan, M: int, N: int, K: int, p: X60Params = X60) -> Traffic:
    """DRAM bytes of one matmul call (see the module docstring); a staged B lives in the cache."""
    return _traffic(plan, M, N, K, k_chunks(plan, M, N, K))


def least_dram(plan: KernelPlan, M: int, N: int, K: int, p: X60Params = X60) -> float:
    """The fewest DRAM bytes any schedule of the kernel's kind moves (K chunks, M blocks, then N tiles):
    any number of K chunks, A's M blocks given the whole L2 (not 3/4 of it), and A's workspace never
    leaving it (a reused M block buffer need not be written back). A floor for a DRAM-bound call."""
    whole = replace(plan, a_block_bytes=p.l2_bytes, forced_k_chunks=0)
    return min(_traffic(whole, M, N, K, q, workspace=False).dram for q in range(1, -(-K // plan.spec.block) + 1))


# ---------------------------------------------------------------------------------------------
# Time


@dataclass(frozen=True)
class Modeled:
    cores: int
    core: CoreCycles
    core_s: float
    dram_bytes: float
    dram_s: float
    time_s: float
    bound: str  # the binding resource ("dram" or a core resource)
    roofline_s: float
    roofline_bound: str  # "compute" | "memory"
    ops: int

    @property
    def efficiency(self) -> float:
        """The issue's efficiency: modeled time / roofline time (1.0 = at the roofline)."""
        return self.time_s / self.roofline_s

    @property
    def gops(self) -> float:
        return self.ops / self.time_s / GB


def roofline(M: int, N: int, K: int, block: int, cores: int, p: X60Params = X60,
             bandwidth: float | None = None, bits: int = 4, zero_points: bool = True) -> tuple[float, str]:
    """max(2MNK / IME peak of `cores` cores, compulsory bytes / DRAM bandwidth)."""
    compute = 2 * M * N * K / (p.peak_ops_per_core * cores)
    memory = compulsory_bytes(M, N, K, block, bits, zero_points) / (bandwidth or p.dram_effective)
    return (compute, "compute") if compute >= memory else (memory, "memory")


def core_seconds(counts: dict[str, float], p: X60Params = X60, measured: bool = False) -> float:
    """MODELED core-side time of one core's counts alone (DRAM ignored)."""
    return core_cycles(counts, p, measured).cycles / p.clock_hz


def model(plan: KernelPlan, M: int, N: int, K: int, per_core_counts: dict[str, float], cores: int = 1,
          p: X60Params = X60, measured: bool = False) -> Modeled:
    """Model one matmul call from the per-core instruction counts (measure.ShapeCounts.matmul); measured:
    the vector units' cycles from LLVM's measured occupancies (core_cycles)."""
    core = core_cycles(per_core_counts, p, measured)
    core_s = core.cycles / p.clock_hz
    traffic = dram_traffic(plan, M, N, K, p)
    dram_s = traffic.dram / p.dram_effective
    time_s = max(core_s, dram_s)
    s = plan.spec
    roof_s, roof_bound = roofline(M, N, K, s.block, cores, p, bits=s.bits, zero_points=s.zero_point == "asymmetric")
    return Modeled(cores, core, core_s, traffic.dram, dram_s, time_s, "dram" if dram_s >= core_s else core.bound,
                   roof_s, roof_bound, 2 * M * N * K)
