"""The bench's `llama.cpp real` rows: llama.cpp's real SpacemiT IME1 Q4_0 kernels counted like imegen's own
(counts.py), their MODELED time with a latency sensitivity, the like-for-like imegen config (the
symmetric fp16-scale twin of the tuned one), and the whole-model figures that calibrate the X60 model
against llama.cpp's published ones."""

from __future__ import annotations

from dataclasses import dataclass

from ...model import occupancy, x60
from ...search.evaluate import Evaluation, evaluate
from ...search.settings import settings_of
from ...search.settings import validate as validate_spec
from ...workload import PREFILL_M, PUBLISHED_PP512_TPS, PUBLISHED_TG128_TPS, Case, shapes
from .check import validate
from .counts import Counter, split

DESCRIBES = "Q4_0: symmetric int4 (q-8), block 32, fp16 scale; A quantized to Q8 per 32 (fp32 scale)"
LOAD_USE_EXTRA = 2  # ASSUMPTION (no public X60 figure found): a vector load's result arrives 3 cycles later
VMADOT_LATENCY = 4  # ASSUMPTION (SpacemiT publishes throughput, not latency): cycles before a dependent vmadot


def dram_bytes(M: int, N: int, K: int, p: x60.X60Params | None = None) -> float:
    """Q4_0 weights (18 bytes per 32) once per M task when they exceed half the L2, A fp32, the Q8
    workspace written once (ime.cpp quantizes all of A before its barrier, then the tasks read it: back
    from DRAM once more when it outgrows the L2), C fp32."""
    p = p or x60.X60
    w = N * K // 32 * 18
    passes = split(1, M, N)[2] if w > p.l2_bytes // 2 else 1
    return w * passes + 4 * M * K + x60.prepared_whole_dram(M * (K // 32) * 36, p.l2_bytes) + 4 * M * N


def modeled_s(counts: dict, M: int, N: int, K: int, p: x60.X60Params | None = None) -> tuple[float, float]:
    """(MODELED time, the same with the latency sensitivity): max(core, DRAM) as x60.model does."""
    p = p or x60.X60
    core = x60.core_seconds(counts, p)
    cls = x60.class_totals(counts)
    stall = cls["vload"] * LOAD_USE_EXTRA + cls["vmadot"] / 8 * (VMADOT_LATENCY - 1)  # 8 vmadot per chain step
    dram = dram_bytes(M, N, K, p) / p.dram_effective
    return max(core, dram), max(core + stall / p.clock_hz, dram)


def measured_s(counts: dict, M: int, N: int, K: int, p: x60.X60Params | None = None) -> float:
    """MODELED time with the vector units' cycles from LLVM's measured X60 occupancies (x60.core_cycles)."""
    p = p or x60.X60
    return max(x60.core_seconds(counts, p, measured=True), dram_bytes(M, N, K, p) / p.dram_effective)


@dataclass(frozen=True)
class LlamaRow:
    case: Case
    one: dict  # one thread, whole call
    four: dict  # busiest of 4 threads
    imegen_sym: Evaluation | None  # the symmetric fp16-scale twin of imegen's tuned config (None: the validator refused it)

    def times(self) -> dict[str, tuple[float, float]]:
        c = self.case
        return {"1": modeled_s(self.one, c.M, c.N, c.K), "4": modeled_s(self.four, c.M, c.N, c.K)}

    def measured_times(self) -> dict[str, float]:
        c = self.case
        return {"1": measured_s(self.one, c.M, c.N, c.K), "4": measured_s(self.four, c.M, c.N, c.K)}


def rows(cases, tuned, log=None) -> list[LlamaRow]:
    """llama.cpp-real rows for the block-32 cases (Q4_0 has block 32 only)."""
    counter = Counter(log)
    out = []
    ok = [c for c in cases if c.block == 32]
    if ok:
        validate_ratio = validate(counter.b, 8, 64, 896, 4, counter.b.exe.parent / "validate")
        if log:
            log(f"llama.cpp real: outputs match NumPy (max err {validate_ratio:.3f} of 1e-6 x sum|terms|)")
    for c in ok:
        if log:
            log(f"llama.cpp real: {c.label}")
        s = {**settings_of(tuned.best[c].spec), "zero_point": "symmetric", "scale_type": "fp16"}
        spec = validate_spec(s)
        twin = evaluate([spec], [c])[(spec.name, c)] if hasattr(spec, "name") else None
        out.append(LlamaRow(c, counter.per_core(c.M, c.N, c.K, 1), counter.per_core(c.M, c.N, c.K, 4), twin))
    return out


def per_token_s(rs: list[LlamaRow], M: int) -> tuple[float, float, float | None] | None:
    """MODELED seconds per M-token step of Qwen's MatMulNBits on llama.cpp's real kernels, 4 threads:
    (base, with latency sensitivity, with LLVM's measured occupancies or None for older counts); None
    without every shape at M (and the LM head at M = 1)."""
    by = {(r.case.shape, r.case.M): r for r in rs}
    base = lat = occ = 0.0
    for s in shapes():
        r = by.get((s.name, 1 if s.name == "lm_head" else M))  # llama.cpp computes logits of the last token only
        if r is None:
            return None
        t = r.times()["4"]
        base, lat = base + s.per_token * t[0], lat + s.per_token * t[1]
        occ = None if occ is None or occupancy.measured_cycles(r.four) is None else occ + s.per_token * r.measured_times()["4"]
    return base, lat, occ


def calibration_points(rs: list[LlamaRow]):
    """(label, M, published tok/s, modeled seconds per M tokens as per_token_s gives them), or None."""
    points = []
    for label, M, published in (("decode tg128", 1, PUBLISHED_TG128_TPS), (f"prefill pp{PREFILL_M[-1]}", PREFILL_M[-1], PUBLISHED_PP512_TPS)):
        t = per_token_s(rs, M)
        if t is None:
            return None
        points.append((label, M, published, t))
    return points


def optimism_factors(rs: list[LlamaRow]) -> str:
    """The calibration's optimism factors in one line, for figures printed away from it."""
    points = calibration_points(rs)
    if points is None:
        return ""
    return ", ".join(f"{label.split()[0]} {M / t[0] / published:.2f}x" for label, M, published, t in points)
