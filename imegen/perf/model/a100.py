"""An analytic cost model of the SpacemiT K3's A100 cores (IME2, VLEN 1024), beside x60.py's for the K1.

Everything here is MODELED, not measured on hardware: nothing was run on a K3. Inputs are exact instruction
counts by class from the QEMU plugin (count/, with the IME2 layout instructions split out by the emulator:
baselines/llama_cpp/ime2_counts.py), the vector bytes they accessed, and the DRAM bytes a call moves. Each
figure below names its public source or is marked ASSUMPTION; `FIGURES` lists them with the value the
sensitivity column of the IME2 table (report/ime2.py) swaps in.

  clock     2.0 GHz. ASSUMPTION: no A100 clock is published; the K3's X100 cores are advertised at up to
            2.5 GHz. Sensitivity: 2.4 GHz (compute-bound times scale by 1/1.2).
  vector    VLEN 1024 [SpacemiT docs-ai, AI Matrix Extension profile §2.1.2]. DLEN 512: ASSUMPTION (the K1's
            X60 has DLEN = VLEN / 2; LLVM's A100 model keeps the X60's RVV timings, "remain to be
            calibrated"). Loads and stores move DLEN / 8 bytes per cycle; vector integer and FP arithmetic
            retire 2 DLEN beats per cycle each, as on the X60 (x60.py); one vector instruction issues per
            cycle; scalar and vector instructions share 2 issue slots (LLVM's A100 model inherits the X60's
            dual issue). Sensitivity: DLEN 256.
  vsetvli   3 cycles each back to back (LLVM RISCVSchedSpacemitA100.td: "Back-to-back vsetvli/vsetivli
            configurations measured three cycles", on a K3).
  IME2      one vmadot* (int8 8x16x8 or int4 8x32x8 tile, `.hp` included) per cycle per matrix unit: LLVM
            RISCVSchedSpacemitA100.td, calibrated on a K3: "Twelve independent accumulators sustain
            approximately one dot per cycle"; latency 8 cycles (integer), 10 (`.hp`), measured there too. A
            kernel whose k loop keeps `acc` independent accumulators cannot issue faster than one vmadot
            per latency / acc cycles: IME cycles = n x max(1 / share, latency / acc).
  matrix    one matrix unit ("Tensor Core") per pair of A100 cores: SpacemiT forum post
  unit      https://forum.spacemit.com/t/topic/935 ("The two vector cores share a single Tensor Core ... The
            K3 chip integrates two A100 clusters"). One core alone gets the whole unit (share 1); a pair
            running the same matmul gets half each (share 1/2).
  layout    vpack 4 cycles of the vector integer unit, vupack 13 (imm2 0/1) or 4 (imm2 2/3), vnpack4 2: LLVM
            RISCVSchedSpacemitA100.td ("K3 A100 LMUL=1 measurements").
  DRAM      LPDDR5 (SpacemiT's K3 announcement: up to 32 GB LPDDR5); no bus width, speed or measured
            bandwidth was found. ASSUMPTION: 25.6 GB/s effective (half of a 64-bit LPDDR5-6400 bus's
            51.2 GB/s, about the K1's measured fraction of its theoretical figure). Sensitivity: 12.8 GB/s
            (an early-test summary calls the K3's memory bandwidth comparable to a Raspberry Pi 5's).
  caches    ASSUMPTION: 1 MB of L2 a call's B slice may stay in (the cluster's shared L2, size not found).

Core time is a resource bound (the busiest of issue slots, scalar load/store, vector issue, vsetvli, vector
load/store, vector integer and FP units, IME2); dependencies other than the IME2 accumulator chains, cache
misses and branch mispredictions are not modeled. Kernel time = max(core time, DRAM bytes / bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import x60

GB = 1e9
LAYOUT_KINDS = ("vpack", "vupack_slow", "vupack", "vnpack4")


@dataclass(frozen=True)
class A100Params:
    clock_hz: float = 2.0e9
    vlen: int = 1024
    dlen: int = 512
    issue_width: int = 2
    scalar_mem_per_cycle: int = 2
    vector_issue_per_cycle: int = 1
    vieu_beats_per_cycle: int = 2
    vfp_beats_per_cycle: int = 2
    vlsx_elements_per_cycle: int = 1
    vset_cycles: int = 3
    vmadot_per_cycle: float = 1.0  # per matrix unit
    vmadot_latency: int = 8
    vmadot_hp_latency: int = 10
    cores_per_matrix_unit: int = 2
    layout_cycles: tuple[tuple[str, int], ...] = (("vpack", 4), ("vupack_slow", 13), ("vupack", 4), ("vnpack4", 2))
    dram_effective: float = 25.6 * GB
    l2_bytes: int = 1 << 20


A100 = A100Params()


@dataclass(frozen=True)
class Figure:
    name: str
    value: str
    source: str
    sensitivity: str  # the value the sensitivity column uses ("" for a sourced figure)
    params: dict      # the A100Params fields the sensitivity case changes


FIGURES = (
    Figure("clock", "2.0 GHz", "ASSUMPTION (no A100 clock published; X100 advertised up to 2.5 GHz)", "2.4 GHz",
           {"clock_hz": 2.4e9}),
    Figure("VLEN", "1024", "docs-ai AI Matrix Extension profile §2.1.2", "", {}),
    Figure("DLEN", "512", "ASSUMPTION (X60: VLEN/2; LLVM's A100 RVV timings uncalibrated)", "256", {"dlen": 256}),
    Figure("issue", "2 per cycle, 1 vector", "LLVM A100 model (inherits the X60's; uncalibrated)", "", {}),
    Figure("vsetvli", "3 cycles", "LLVM RISCVSchedSpacemitA100.td (measured on a K3)", "", {}),
    Figure("vmadot", "1 per cycle per matrix unit; latency 8 (int), 10 (.hp)",
           "LLVM RISCVSchedSpacemitA100.td (measured on a K3)", "", {}),
    Figure("matrix unit", "1 per pair of A100 cores", "SpacemiT forum post forum.spacemit.com/t/topic/935", "", {}),
    Figure("vpack/vupack/vnpack4", "4 / 13 (imm2 0,1) or 4 / 2 cycles",
           "LLVM RISCVSchedSpacemitA100.td (measured on a K3)", "", {}),
    Figure("DRAM", "25.6 GB/s effective", "ASSUMPTION (LPDDR5 per SpacemiT; width and speed not found)", "12.8 GB/s",
           {"dram_effective": 12.8 * GB}),
    Figure("L2 for B", "1 MB", "ASSUMPTION (cluster L2 size not found)", "256 KB", {"l2_bytes": 256 << 10}),
)


def sensitivity_params(p: A100Params = A100) -> dict[str, A100Params]:
    """The model with each ASSUMPTION's sensitivity value (FIGURES), by figure name."""
    return {f.name: replace(p, **f.params) for f in FIGURES if f.params}


@dataclass(frozen=True)
class CoreCycles(x60.ResourceCycles):
    """The A100's resources."""

    issue: float
    scalar_mem: float
    vector_issue: float
    vset: float
    vls: float
    vieu: float
    vfp: float
    ime: float


def layout_counts(counts: dict[str, float]) -> dict[str, float]:
    """IME2 layout instructions (vpack, vupack, vnpack4) by kind, from reclassified counts."""
    return {k: counts.get(f"kernel.ime2.{k}", 0) + counts.get(f"callee.ime2.{k}", 0) for k in LAYOUT_KINDS}


def _beats(counts: dict[str, float], unit: str, p: A100Params) -> float:
    """DLEN beats of vector arithmetic from the plugin's EMUL histogram: max(1, EMUL x VLEN / DLEN) each."""
    return sum(counts.get(f"{t}.{unit}.e{b - 3}", 0) * max(1.0, 2.0 ** (b - 3) * p.vlen / p.dlen)
               for t in x60.TAGS for b in range(10))


def core_cycles(counts: dict[str, float], *, accumulators: int, hp: bool, share: float = 1.0,
                p: A100Params = A100) -> CoreCycles:
    """One core's busy cycles per resource. accumulators: the independent vmadot chains the kernel's k loop
    keeps; hp: its vmadots are .hp (latency 10); share: the matrix unit's fraction this core gets."""
    cls = x60.class_totals(counts)
    layout = layout_counts(counts)
    vector = sum(cls[c] for c in x60.VECTOR_CLASSES) + sum(layout.values())
    mem_bytes = sum(x60.mem_stat(counts, c, "bytes") for c in ("vload", "vstore"))
    latency = p.vmadot_hp_latency if hp else p.vmadot_latency
    per_vmadot = max(1.0 / (p.vmadot_per_cycle * share), latency / max(1, accumulators))
    return CoreCycles(
        issue=(sum(cls.values()) + sum(layout.values())) / p.issue_width,
        scalar_mem=cls["mem"] / p.scalar_mem_per_cycle,
        vector_issue=vector / p.vector_issue_per_cycle,
        vset=cls["vset"] * p.vset_cycles,
        vls=max(mem_bytes / (p.dlen // 8), cls["vload"] + cls["vstore"])
        + max(x60.mem_stat(counts, "vlsx", "elems"), cls["vlsx"]) / p.vlsx_elements_per_cycle,
        vieu=_beats(counts, "vieu", p) / p.vieu_beats_per_cycle
        + sum(n * dict(p.layout_cycles)[k] for k, n in layout.items()),
        vfp=_beats(counts, "vfp", p) / p.vfp_beats_per_cycle,
        ime=cls["vmadot"] * per_vmadot,
    )


@dataclass(frozen=True)
class Modeled:
    core: CoreCycles
    core_s: float
    dram_bytes: float
    dram_s: float
    time_s: float
    bound: str


def model(per_core_counts: dict[str, float], dram_bytes: float, *, accumulators: int, hp: bool, share: float = 1.0,
          p: A100Params = A100) -> Modeled:
    core = core_cycles(per_core_counts, accumulators=accumulators, hp=hp, share=share, p=p)
    core_s = core.cycles / p.clock_hz
    dram_s = dram_bytes / p.dram_effective
    return Modeled(core, core_s, dram_bytes, dram_s, max(core_s, dram_s), "dram" if dram_s >= core_s else core.bound)


def llama_q40_dram(M: int, N: int, K: int, p: A100Params = A100) -> float:
    """DRAM bytes of llama.cpp's Q4_0 matmul on IME2, one thread: B (18 bytes per column and 32 codes: fp16 scale
    and 16 bytes of nibbles) streams once per pass, A (fp32) is read once and C written once. ime.cpp tiles M
    into tasks of 16 rows when N // M <= 64, else one task of all rows; each task calls the kernel per 4 rows on
    all its columns, so B streams once per task when it fits the L2 budget, else once per call."""
    b_bytes = N * K * 18 // 32
    task_rows = M if N // M > 64 else 16
    tasks = -(-M // task_rows)
    calls_per_task = len(_row_groups(min(M, task_rows)))
    passes = tasks * (1 if b_bytes <= p.l2_bytes else calls_per_task)
    return float(b_bytes * passes + 4 * M * K + 4 * M * N)


def _row_groups(M: int) -> list[int]:
    q, r = divmod(M, 4)
    return [4] * q + [1] * r
