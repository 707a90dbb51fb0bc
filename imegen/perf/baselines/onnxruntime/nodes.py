"""`imegen bench` rows for real riscv64 onnxruntime: stock MatMulNBits per Run, and ORT + imegen's library.

Each Qwen shape (the bench's blocks and M values) becomes a single-node com.microsoft MatMulNBits model:
seeded random weights quantized by onnxruntime's own quantizer (4-bit, blocks 32/64/128, asymmetric,
accuracy_level 4: what a user's int4 Qwen export holds), A seeded random. It runs in Debian's riscv64
ORT 1.23 under QEMU (run_counts.py: per-Run counts, session creation excluded) with 1 and 4 intra-op
threads; its output is checked against the NumPy CompInt8 oracle (imegen/reference.py) within ORT's
level-4 tolerance before any count is used. The same model rewritten to imegen's domain (imegen.ort.
rewrite) with the qemu-flavour custom-op library of the case's tuned kernel gives the real integration
path's per-Run count ("ORT+imegen"); minus the kernel's own count (the imegen row) it is the glue.

MODELED time (model/x60.py): the per-Run class counts as one core's work (4 threads: the sum over threads
split evenly, since the plugin's counters are process-wide), max(core cycles / clock, DRAM bytes /
5.24 GB/s), DRAM bytes = the ORT-format weights (int4 codes, fp32 scales, packed 4-bit zero points) +
A + C in fp32 for stock ORT, the imegen kernel's own traffic for ORT+imegen.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .... import reference as ref
from ....ort.customop import build_library
from ...model import x60
from ...workload import Case
from . import run_counts

BLOCK = 32  # the block a user's int4 export uses; Q4_0's too
STOCK_THREADS = (1, 4)
SEED = 1234
DESCRIBES = ("4-bit, the bench's blocks, asymmetric (uint8 zero points), accuracy_level 4, weights quantized by onnxruntime's "
             "MatMulNBitsQuantizer; level 4 asks for int8 compute, but Debian's riscv64 build (rv64gc, no RVV) has no "
             "int8 MLAS kernel and computes in fp32: its outputs match the float64 fp32 oracle to ~1e-6")


def _quantizer_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def node_model(d: Path, M: int, N: int, K: int, block: int = BLOCK, specs=None):
    """(model path, feeds, wanted, check) of one MatMulNBits node; specs: rewrite it for imegen's library."""
    import onnx

    from ....ort import ort_check
    from ....ort.rewrite import rewrite

    rng = np.random.default_rng([SEED, M, N, K, block])
    W = (0.02 * rng.standard_normal((K, N), dtype=np.float32)).astype(np.float32)
    qw = ort_check.ort_quantized_weights(W, 4, block, symmetric=False)
    A = rng.standard_normal((M, K), dtype=np.float32)
    model = ort_check.matmulnbits_model(M, qw, None, accuracy_level=4)
    if specs is not None and not any(x.moved for x in rewrite(model, specs)):
        raise RuntimeError(f"imegen's library serves no node of the {M}x{K}x{N} model")
    path = d / "node.onnx"
    onnx.save(model, str(path))

    def check(outputs: dict) -> dict:
        want, _ = ref.matmul_nbits_int8(A, qw)
        a, r = ort_check.TOLERANCE[4]
        worst = float((np.abs(outputs["Y"].astype(np.float64) - want) / (a + r * np.abs(want))).max())
        if not np.isfinite(worst) or worst > 1.0:
            raise RuntimeError(f"ORT's MatMulNBits {M}x{K}x{N} differs from the NumPy CompInt8 oracle: "
                               f"{worst:.3g} x the level-4 tolerance")
        return {"worst": worst}

    return path, {"A": A}, ["Y"], check


def runs_for(M: int, N: int, K: int) -> int:
    """Two counted Runs where they are cheap (the test of consistency), one for the big shapes."""
    return 2 if M * N * K <= 2e8 else 1


def mean_counts(runs: list[dict]) -> dict[str, float]:
    return {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}


@dataclass(frozen=True)
class NodeCount:
    counts: dict[str, float]  # mean per-Run, sum over threads
    runs: list[float]  # total instructions of each counted Run
    worst: float  # output vs NumPy, fraction of the level-4 tolerance
    version: str


def count_node(case: Case, threads: int, specs=None, library: Path | None = None) -> NodeCount:
    M, N, K = case.mnk
    parts = ("matmulnbits-node", f"{M}x{N}x{K}", f"block={case.block}", f"seed={SEED}", _quantizer_version(),
             inspect.getsource(node_model), Path(ref.__file__).read_text())  # what decides the model and its check
    if specs is not None:
        parts += tuple(s.describe() for s in specs)
    rc = run_counts.cached_count_runs(parts, lambda d: node_model(d, M, N, K, case.block, specs), threads=threads,
                                     runs=runs_for(M, N, K), custom_ops=library)
    return NodeCount(mean_counts(rc.runs), [x60.total_instructions(r) for r in rc.runs], rc.check["worst"], rc.version)


@dataclass(frozen=True)
class OrtRow:
    case: Case
    stock: dict[int, NodeCount]  # threads -> stock ORT per Run
    imegen_lib: NodeCount | None  # ORT + imegen's custom-op library, 1 thread

    def modeled(self, threads: int) -> tuple[float, str]:
        return modeled_stock(self.stock[threads].counts, self.case, threads)


def stock_dram_bytes(case: Case) -> int:
    M, N, K = case.mnk
    return x60.ort_weight_bytes(N, K, case.block) + 4 * M * K + 4 * M * N


def modeled_time(counts: dict, dram_bytes: float, cores: int, p: x60.X60Params = x60.X60) -> tuple[float, str]:
    """(MODELED seconds, bound): the counts split evenly over `cores`, max(core time, DRAM time)."""
    core_s = x60.core_seconds({k: v / cores for k, v in counts.items()}, p)
    dram_s = dram_bytes / p.dram_effective
    return (dram_s, "dram") if dram_s >= core_s else (core_s, "core")


def modeled_stock(counts: dict, case: Case, threads: int) -> tuple[float, str]:
    return modeled_time(counts, stock_dram_bytes(case), threads)


def chosen_cases(cases: list[Case], quick: bool) -> list[Case]:
    """Every case but the LM head at M > 1 (the bench's prefill figures take it at M = 1, and stock
    ORT's M = 128 LM head would retire ~40 G instructions under QEMU, M = 512 ~150 G)."""
    return [c for c in cases if c.M == 1 or c.shape != "lm_head"]


def imegen_specs_for(tuned, case: Case) -> list:
    return [tuned.best[case].spec]


def lib_cases(cases: list[Case], quick: bool) -> list[Case]:
    """Where the ORT+imegen path is counted: every emulated vmadot traps, so M <= 128 only."""
    return [c for c in cases if c.M <= 128]


def rows(cases: list[Case], tuned, *, quick: bool = False, log=None) -> list[OrtRow]:
    out = []
    chosen = chosen_cases(cases, quick)
    with_lib = set(lib_cases(chosen, quick))
    for c in chosen:
        if log:
            log(f"stock ORT: {c.label}")
        stock = {t: count_node(c, t) for t in STOCK_THREADS}
        lib = None
        if c in with_lib:
            specs = imegen_specs_for(tuned, c)
            lib = count_node(c, 1, specs, build_library(specs, "tuned.imegen", flavour="qemu"))
        out.append(OrtRow(c, stock, lib))
    return out
