"""The IME2 (K3 A100) table: imegen's IME2 kernels (examples/ime2_k3.imegen) against llama.cpp's own IME2 Q4_0
path at every Qwen2.5-0.5B MatMulNBits shape, decode (M = 1) and prefill (M = 128, 512), instruction counts
MEASURED under QEMU with the counting plugin, times MODELED by model/a100.py.

    python3 -m imegen.perf.report.ime2 --out bench/results     # writes ime2.csv and ime2.txt

imegen's kernels: the example's gemv (decode) and gemm (prefill) kernels, built with runtime/ime2_emu.c and
count/bench_driver.c (its IME hooks pointed at the IME2 emulator), run at VLEN 1024 at the reduced shapes
count/measure.py runs and extrapolated the same way (count/extrapolate.py); each checked first against
imegen.reference's NumPy oracle at a small shape, and every run's vmadot count against the plan's and the
emulator's. llama.cpp's: baselines/llama_cpp/ime2_counts.py (its quantizer and gemm entry point as ime.cpp
picks them, checked against the peer check's NumPy model on the very data it quantized).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ... import cache, toolchain
from ...api import load_spec
from ...plan import KernelPlan, expected_vmadots, plan_kernel
from ...render import march_for
from ...toolchain import ToolchainError
from ..baselines.llama_cpp import ime2_counts
from ..count.extrapolate import CaseCounts, ShapeCounts, extrapolate, sample_shapes
from ..count.image import code_ranges_from_map, exec_segments, load_ranges, save_ranges, symbols
from ..count.measure import DRIVER, bench_inputs
from ..count.plugin import run_counted
from ..model import a100, x60
from ..workload import DECODE_M, PREFILL_M, QWEN25_05B, shapes

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ime2_k3.imegen"
VLEN = 1024
# Decode in Q4_0's format (symmetric int4, fp16 scales: llama.cpp's own), the goal's comparison; prefill and a
# second decode row in ORT's asymmetric format (zero points, fp32 scales), labelled IMEGEN_ASYM_KIND.
DECODE_KERNEL, PREFILL_KERNEL, ASYM_DECODE_KERNEL = "q40_decode_k3", "q4_prefill_k3", "q4_decode_k3"
# Decode in Q4_0's format with block-scaled `.hp` vmadots (FP16 sums per super-block): rows of their own.
HP_DECODE_KERNEL = "q40_decode_hp_k3"
IMEGEN_KIND, IMEGEN_ASYM_KIND, IMEGEN_HP_KIND = "imegen", "imegen-asym", "imegen-hp"
LLAMA_KIND = "llama.cpp-ime2"
LLAMA_ACCUMULATORS = 4  # every Q4_0 kernel keeps 4 .hp accumulators (one per 8 of its 32 columns)
DECODE_GOAL, PREFILL_GOAL = 0.6, 0.5  # imegen / llama.cpp: decode instructions, prefill modeled time


# ---------------------------------------------------------------- imegen's IME2 kernels: build, check, count

@dataclass(frozen=True)
class Ime2Exe:
    plan: KernelPlan
    exe: Path
    ranges: tuple[tuple[int, int, str], ...]
    begin: int
    end: int


def build_bench(plan: KernelPlan) -> Ime2Exe:
    """The kernel with count/bench_driver.c, whose IME hooks (install, count) are pointed at the IME2
    emulator by -D; the emulator and the driver are excluded from the counts (count/measure.py's method)."""
    sources, defines, inputs = bench_inputs(plan)
    inputs += cache.Inputs((), ("ime2 emulator",))
    hooks = ["-Dimegen_ime_emu_install=imegen_ime2_emu_install", "-Dimegen_ime_emu_count=imegen_ime2_emu_count"]

    def fill(d: Path) -> None:
        for name, text in sources.items():
            (d / name).write_text(text)
        kobj = toolchain.compile_c([d / f"{plan.name}.c"], d / "kernel.o", march=march_for(plan), include_dirs=[d])
        dobj = toolchain.compile_c([DRIVER], d / "driver.o", include_dirs=[d, toolchain.RUNTIME_DIR],
                                   extra_flags=[*(f"-D{k}={v}" for k, v in defines.items()), *hooks])
        eobj = toolchain.compile_emulator("ime2_emu", d / "ime2_emu.o")
        toolchain.compile_c([kobj, dobj, eobj], d / "bench", extra_flags=["-static", f"-Wl,-Map={d / 'bench.map'}"])
        objects = {str(kobj): "kernel", str(dobj): "excluded", str(eobj): "excluded"}
        save_ranges(d, code_ranges_from_map((d / "bench.map").read_text(), objects))

    d = cache.entry(f"bench-ime2-{plan.name}", inputs.key(), fill)
    ranges = load_ranges(d) + [(lo, hi, "image") for lo, hi in exec_segments(d / "bench")]
    syms = symbols(d / "bench")
    return Ime2Exe(plan, d / "bench", tuple(ranges), syms["imegen_bench_begin"][0], syms["imegen_bench_end"][0])


def run_samples(b: Ime2Exe, samples: list[tuple[int, int, int]]) -> dict[tuple[int, int, int], CaseCounts]:
    """One QEMU run of every sample shape; each must return status 0 and run exactly the plan's vmadots (the
    plugin's count, the emulator's and the plan's)."""
    args = [f"{M}x{N}x{K}" for M, N, K in samples]
    run = run_counted(b.exe, args, list(b.ranges), begin=b.begin, end=b.end, vlen=VLEN, timeout=3600)
    lines = run.stdout.splitlines()
    if len(run.regions) != 2 * len(samples) or len(lines) != len(samples):
        raise ToolchainError(f"{b.plan.name}: {len(run.regions)} regions for {len(samples)} samples", [str(b.exe)])
    out = {}
    for i, (M, N, K) in enumerate(samples):
        _, _, _, status, emulated, checksum = lines[i].split()
        prep, mm = dict(run.regions[2 * i].values), dict(run.regions[2 * i + 1].values)
        want = expected_vmadots(b.plan, M, N, K)
        if b.plan.spec.hp_blocks:
            mm = _refile_hp_words(mm, want)
        seen = mm.get("kernel.vmadot", 0) + mm.get("callee.vmadot", 0)
        if int(status) != 0 or not math.isfinite(float(checksum)) or not int(emulated) == want == seen:
            raise ToolchainError(f"{b.plan.name} {M}x{N}x{K}: status {status}, vmadot plan {want} / plugin {seen} / "
                                 f"emulator {emulated}", [str(b.exe)])
        out[(M, N, K)] = CaseCounts(M, N, K, prep, mm, int(emulated))
    return out


def _refile_hp_words(counts: dict[str, int], planned: int) -> dict[str, int]:
    """A `.hp` gemv's vmadot.hp words, which the plugin (it knows IME2's int8 vmadot words) files as scalar int
    (ime2_counts.reclassify): the plan's count of them moved from int to vmadot, when the plugin saw no vmadot of
    its own and its int class holds them; else unchanged, for run_samples' cross-check to refuse."""
    plugin = counts.get("kernel.vmadot", 0) + counts.get("callee.vmadot", 0)
    if plugin or counts.get("kernel.int", 0) < planned:
        return counts
    return {**counts, "kernel.int": counts["kernel.int"] - planned, "kernel.vmadot": planned}


def imegen_counts(plan: KernelPlan, full: list[tuple[int, int, int]]) -> dict[tuple[int, int, int], ShapeCounts]:
    """Full-shape counts of `plan` (count/measure.py's method: a shape whose call splits K is sampled by a build
    forced to the same K chunks, since its small samples would not split on their own)."""
    chunks = {shape: x60.k_chunks(plan, *shape) for shape in full}
    out = {}
    for q in sorted(set(chunks.values())):
        mine = [shape for shape in full if chunks[shape] == q]
        built = plan if q == 1 or plan.forced_k_chunks else replace(plan, forced_k_chunks=q)
        needed = list(dict.fromkeys(s for shape in mine for s in sample_shapes(built, *shape)))
        measured = run_samples(build_bench(built), needed)
        out.update({shape: extrapolate(built, *shape, measured) for shape in mine})
    return out


def check_imegen(spec, M: int, N: int, K: int) -> str | None:
    """imegen.reference's NumPy oracle on the kernel at a small shape under QEMU at VLEN 1024; None if it
    agrees, else why not."""
    import numpy as np

    from ...api import build_kernel

    rng = np.random.default_rng(M * 1000 + N + K)
    kb = -(-K // spec.block)
    B = rng.integers(0, 256, (N, kb, spec.block * spec.bits // 8), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.01, (N, kb)).astype(np.float32)
    zp = rng.integers(0, 256, (N, -(-kb * spec.bits // 8)), dtype=np.uint8) if spec.zero_point == "asymmetric" else None
    A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    cmp = build_kernel(spec).compare(A, B, scales, zp, K=K, vlen=VLEN)
    return None if cmp.ok else cmp.message


# ---------------------------------------------------------------- rows

@dataclass(frozen=True)
class Row:
    shape: str
    M: int
    N: int
    K: int
    block: int
    kind: str          # IMEGEN_KIND, IMEGEN_ASYM_KIND or LLAMA_KIND
    config: str
    counts: dict       # one core, whole call
    pair_counts: dict  # one core of a pair (columns split, matrix unit shared)
    dram_bytes: float
    accumulators: int
    hp: bool

    @property
    def instructions(self) -> float:
        return x60.total_instructions(self.counts) + sum(a100.layout_counts(self.counts).values())

    def modeled(self, p: a100.A100Params = a100.A100) -> a100.Modeled:
        return a100.model(self.counts, self.dram_bytes, accumulators=self.accumulators, hp=self.hp, p=p)

    def modeled_pair(self, p: a100.A100Params = a100.A100) -> a100.Modeled:
        return a100.model(self.pair_counts, self.dram_bytes, accumulators=self.accumulators, hp=self.hp,
                          share=1 / p.cores_per_matrix_unit, p=p)


def workload(quick: bool = False) -> list[tuple[str, int, int, int]]:
    """(shape, M, N, K): every Qwen2.5-0.5B MatMulNBits shape at decode and both prefill sizes."""
    ms = [DECODE_M, *PREFILL_M]
    out = [(s.name, M, s.N, s.K) for s in shapes(QWEN25_05B) for M in ms]
    return [w for w in out if w[0] in ("q/o", "down")] if quick else out


def imegen_config(spec) -> str:
    return spec.describe()  # names target=ime2, which bench.csv's readers look for


def imegen_rows(work: list[tuple[str, int, int, int]], specs, log=None, asym_decode: bool = True) -> list[Row]:
    """imegen's rows: the Q4_0-format decode kernel and the prefill kernel (kind IMEGEN_KIND), and with
    asym_decode the ORT-format decode kernel too (IMEGEN_ASYM_KIND)."""
    by_name = {s.name: s for s in specs}
    kernels = [(DECODE_KERNEL, IMEGEN_KIND, True), (PREFILL_KERNEL, IMEGEN_KIND, False),
               (HP_DECODE_KERNEL, IMEGEN_HP_KIND, True)]
    if asym_decode:
        kernels.append((ASYM_DECODE_KERNEL, IMEGEN_ASYM_KIND, True))
    rows = []
    for name, kind, decode in kernels:
        spec = by_name[name]
        mine = [w for w in work if (w[1] == DECODE_M) == decode]
        if not mine:
            continue
        plan = plan_kernel(spec)
        bad = check_imegen(spec, min(plan.spec.tile_m + 3, 19), 64, 896)
        if bad:
            raise ToolchainError(f"{name} disagrees with imegen.reference before counting: {bad}", [])
        if log:
            log(f"ime2: counting {name} at {len(mine)} shapes")
        counts = imegen_counts(plan, [(M, N, K) for _, M, N, K in mine])
        acc = max(1, plan.spec.tile_m // 8) * (plan.spec.tile_n // 8)
        for shape, M, N, K in mine:
            c = counts[(M, N, K)]
            rows.append(Row(shape, M, N, K, spec.block, kind, imegen_config(spec), c.matmul(1), c.matmul(2),
                            x60.dram_traffic(plan, M, N, K).dram, acc, bool(spec.hp_blocks)))
    return rows


def llama_rows(work: list[tuple[str, int, int, int]], log=None) -> list[Row]:
    counter = ime2_counts.Counter(log)
    for K in sorted({K for *_, K in work}):
        chk = ime2_counts.check(counter.b, 5, 64, K, cache.root() / "tmp-ime2-check" / str(K))
        if not chk.model_units <= 1.0:
            raise ToolchainError(f"llama.cpp {ime2_counts.kernel_for(K)} K={K} misses its NumPy model by "
                                 f"{chk.model_units:.3g} units before counting", [])
    rows = []
    for shape, M, N, K in work:
        kernel = ime2_counts.kernel_for(K)
        config = (f"llama.cpp ime2_kernels.cpp gemm_kernel_{kernel.replace('hp', '_hp')}, Q4_0 (symmetric int4, fp16 "
                  f"scales), A as Q8 per {'256 (HP: per 32 fp16 scales)' if kernel == 'i8i4hp' else '32'}")
        rows.append(Row(shape, M, N, K, 256 if kernel == "i8i4hp" else 32, LLAMA_KIND, config,
                        counter.counts(M, N, K), counter.counts(M, N, K, cores=2), a100.llama_q40_dram(M, N, K),
                        LLAMA_ACCUMULATORS, True))
    return rows


@dataclass(frozen=True)
class Ime2Result:
    rows: list[Row]

    def pair(self, shape: str, M: int, kind: str = IMEGEN_KIND) -> tuple[Row, Row]:
        mine = [r for r in self.rows if r.shape == shape and r.M == M]
        return next(r for r in mine if r.kind == kind), next(r for r in mine if r.kind == LLAMA_KIND)

    def has(self, kind: str) -> bool:
        return any(r.kind == kind for r in self.rows)

    @property
    def cases(self) -> list[tuple[str, int]]:
        return list(dict.fromkeys((r.shape, r.M) for r in self.rows))


def run(*, quick: bool = False, log=None) -> Ime2Result:
    work = workload(quick)
    specs = load_spec(EXAMPLE)
    return Ime2Result(imegen_rows(work, specs, log) + llama_rows(work, log))


# ---------------------------------------------------------------- CSV and text

CSV_EXTRA = ("instructions", *(f"ime2_{k}" for k in a100.LAYOUT_KINDS), "ms_1core", "bound_1core", "ms_pair",
             "bound_pair", "dram_bytes", *(f"ms_1core_{f.name.replace(' ', '_')}_{f.sensitivity.replace(' ', '')}"
                                            for f in a100.FIGURES if f.params))


def bench_csv_rows(res: Ime2Result) -> list[list]:
    """Rows in bench.csv's columns (report/files.py): counts, one core's modeled time in ms_1core; the 4-core
    columns stay empty (the A100 model's multi-core figure is a pair sharing one matrix unit: ime2.csv)."""
    out = []
    for r in res.rows:
        cls = x60.class_totals(r.counts)
        vec = sum(x60.mem_stat(r.counts, c, "bytes") for c in ("vload", "vstore", "vlsx"))
        m = r.modeled()
        out.append([r.shape, r.M, r.N, r.K, r.block, r.kind, r.config, *(round(cls[c]) for c in x60.CLASSES),
                    round(vec), f"{m.time_s * 1e3:.6f}", m.bound, "", "", round(r.dram_bytes), "", "", "", "", ""])
    return out


def ime2_csv(res: Ime2Result) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["shape", "M", "N", "K", "block", "kernel", "config", *x60.CLASSES, *CSV_EXTRA])
    sens = a100.sensitivity_params()
    for r in res.rows:
        cls = x60.class_totals(r.counts)
        lay = a100.layout_counts(r.counts)
        one, pair = r.modeled(), r.modeled_pair()
        w.writerow([r.shape, r.M, r.N, r.K, r.block, r.kind, r.config, *(round(cls[c]) for c in x60.CLASSES),
                    round(r.instructions), *(round(lay[k]) for k in a100.LAYOUT_KINDS), f"{one.time_s * 1e3:.6f}",
                    one.bound, f"{pair.time_s * 1e3:.6f}", pair.bound, round(r.dram_bytes),
                    *(f"{r.modeled(p).time_s * 1e3:.6f}" for p in sens.values())])
    return buf.getvalue()


METHOD_TEXT = (
    "IME2 (K3 A100) METHOD: instructions MEASURED under qemu-riscv64 at VLEN 1024 (counting plugin "
    "imegen/perf/count/insn_count.c; IME2 words trapped by runtime/ime2_emu.c, which also sorts the ones the plugin "
    "files as scalar int (int4 and .hp vmadot, vpack, vupack, vnpack4) into vmadot and layout kinds; the emulator, "
    "driver and signal trampoline excluded). imegen: examples/ime2_k3.imegen's q40_decode_k3 (M = 1; Q4_0's "
    "format: int4 symmetric block 32, fp16 scales, the goal's comparison; int8 vmadots, exact int32 dots), "
    "q40_decode_hp_k3 (M = 1, Q4_0's format, block-scaled .hp vmadots with FP16 sums per 2 blocks, rows 'imegen-hp', "
    "a table of their own; the plugin files .hp words as int, the emulator's count moves them to vmadot) and "
    "q4_prefill_k3 (M = 128, 512; ORT's asymmetric format: zero points, fp32 scales), and q4_decode_k3 (M = 1, ORT's asymmetric format, rows "
    "'imegen-asym', a table of their own), A quantization included; run at reduced shapes and extrapolated by whole tiles (count/"
    "extrapolate.py), checked first against imegen.reference at a small shape. llama.cpp-ime2: llama-cpp-python "
    "0.3.36's ime2_kernels.cpp + rvv_kernels.cpp quantizers, Q4_0 as ime.cpp picks for IME2 (K = 896: "
    "gemm_kernel_i8i4, K blocks of 32; K = 4864: gemm_kernel_i8i4_hp, super-blocks of 256), rows in groups of 4 "
    "then 1, A quantization included; run at M = 5 (a group of 4 and one of 1) with N = 32 and 64 and the full K, "
    "extrapolated linearly in 32-column groups and row groups (exact for these loops; checked against direct runs "
    "in tests/test_ime2_bench.py), checked first against the peer check's NumPy model on the data its own quantizer "
    "wrote. Times MODELED (imegen/perf/model/a100.py): 1 core with a matrix unit of its own, and one core of a "
    "pair sharing one (columns split in two, DRAM shared).")


def figures_text() -> str:
    lines = ["A100 model figures (value, source; 'sens.' = the value the sensitivity columns of ime2.csv use):"]
    for f in a100.FIGURES:
        lines.append(f"  {f.name:22s} {f.value:42s} {f.source}" + (f"; sens. {f.sensitivity}" if f.sensitivity else ""))
    return "\n".join(lines)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def table_text(res: Ime2Result, kind: str = IMEGEN_KIND) -> str:
    head = (f"{'shape':8s} {'M':>4s} | {'instr (M)':>19s} {'ratio':>5s} | {'1 core ms':>19s} {'ratio':>5s} "
            f"{'bound':>13s} | {'pair ms':>17s} {'ratio':>5s} | {'ms @sens DRAM':>17s}")
    title = ("IME2 table: imegen / llama.cpp-ime2 (ratio < 1: imegen ahead; decode in Q4_0's format on both "
             "sides). instr = one call, one core, kernel + libc it calls (MEASURED); ms = MODELED."
             if kind == IMEGEN_KIND else
             "IME2 decode with block-scaled `.hp` vmadots (imegen-hp: Q4_0's format, FP16 sums per super-block of 2 "
             "blocks, docs/ime2-isa.md 10.8) / llama.cpp-ime2."
             if kind == IMEGEN_HP_KIND else
             "IME2 decode in ORT's asymmetric format (imegen-asym: zero points, fp32 scales, 672 B per 32x32 block) "
             "/ llama.cpp-ime2's Q4_0 (576 B): for reference, not the goal's comparison.")
    lines = [title, head, "-" * len(head)]
    dram_sens = a100.sensitivity_params()["DRAM"]
    for shape, M in res.cases:
        if not any(r.kind == kind and r.shape == shape and r.M == M for r in res.rows):
            continue
        i, l = res.pair(shape, M, kind)
        mi, ml, pi, pl = i.modeled(), l.modeled(), i.modeled_pair(), l.modeled_pair()
        di, dl = i.modeled(dram_sens), l.modeled(dram_sens)
        lines.append(f"{shape:8s} {M:4d} | {i.instructions / 1e6:9.3f}/{l.instructions / 1e6:9.3f} "
                     f"{_ratio(i.instructions, l.instructions):>5s} | {mi.time_s * 1e3:9.4f}/{ml.time_s * 1e3:9.4f} "
                     f"{_ratio(mi.time_s, ml.time_s):>5s} {mi.bound[:6] + '/' + ml.bound[:6]:>13s} | "
                     f"{pi.time_s * 1e3:8.4f}/{pl.time_s * 1e3:8.4f} {_ratio(pi.time_s, pl.time_s):>5s} | "
                     f"{di.time_s * 1e3:8.4f}/{dl.time_s * 1e3:8.4f}")
    return "\n".join(lines)


def goals_text(res: Ime2Result) -> str:
    dec = [(s, *res.pair(s, M)) for s, M in res.cases if M == DECODE_M]
    pre = [(s, M, *res.pair(s, M)) for s, M in res.cases if M != DECODE_M]
    lines = [f"Goals: decode instructions imegen <= {DECODE_GOAL} x llama.cpp-ime2; prefill modeled time (1 core) "
             f"imegen <= {PREFILL_GOAL} x llama.cpp-ime2."]
    for s, i, l in dec:
        r = i.instructions / l.instructions
        lines.append(f"  decode  {s:8s} instructions {r:.3f}  {'met' if r <= DECODE_GOAL else 'NOT met'}  (int8 path)")
    for s, M in res.cases:
        if M == DECODE_M and any(r.kind == IMEGEN_HP_KIND and r.shape == s and r.M == M for r in res.rows):
            i, l = res.pair(s, M, IMEGEN_HP_KIND)
            r = i.instructions / l.instructions
            lines.append(f"  decode  {s:8s} instructions {r:.3f}  {'met' if r <= DECODE_GOAL else 'NOT met'}  (.hp)")
    for s, M, i, l in pre:
        r = i.modeled().time_s / l.modeled().time_s
        lines.append(f"  prefill {s:8s} M={M:<4d} modeled time {r:.3f}  {'met' if r <= PREFILL_GOAL else 'NOT met'}")
    return "\n".join(lines)


def sensitivity_text(res: Ime2Result) -> str:
    """Per ASSUMPTION: the range of imegen / llama.cpp modeled-time ratios (1 core) with its sensitivity value,
    decode and prefill, beside the base model's: whether any goal's verdict could turn on it."""
    def ratios(p: a100.A100Params, decode: bool) -> list[float]:
        return [i.modeled(p).time_s / l.modeled(p).time_s for i, l in
                (res.pair(s, M) for s, M in res.cases if (M == DECODE_M) == decode)]

    def span(xs: list[float]) -> str:
        return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-"

    lines = ["Sensitivity (imegen / llama.cpp-ime2 modeled time, 1 core, min-max over shapes: decode | prefill):",
             f"  {'base model':34s} {span(ratios(a100.A100, True)):>11s} | {span(ratios(a100.A100, False))}"]
    for f in a100.FIGURES:
        if f.params:
            p = a100.sensitivity_params()[f.name]
            lines.append(f"  {f.name + ' ' + f.sensitivity:34s} {span(ratios(p, True)):>11s} | {span(ratios(p, False))}")
    return "\n".join(lines)


def report_text(res: Ime2Result) -> str:
    asym = ["", table_text(res, IMEGEN_ASYM_KIND)] if res.has(IMEGEN_ASYM_KIND) else []
    hp = ["", table_text(res, IMEGEN_HP_KIND)] if res.has(IMEGEN_HP_KIND) else []
    return "\n".join([METHOD_TEXT, figures_text(), "", table_text(res), *hp, *asym, "", goals_text(res), "",
                      sensitivity_text(res)])


def write_outputs(res: Ime2Result, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ime2.csv").write_text(ime2_csv(res))
    (out_dir / "ime2.txt").write_text(report_text(res) + "\n")
    return [out_dir / "ime2.csv", out_dir / "ime2.txt"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m imegen.perf.report.ime2",
                                 description="imegen's IME2 kernels against llama.cpp's IME2 Q4_0 path on a modeled "
                                             "K3 A100; writes ime2.csv and ime2.txt")
    ap.add_argument("--out", type=Path, default=Path("bench/results"), help="output directory (default bench/results)")
    ap.add_argument("--quick", action="store_true", help="q/o and down only")
    args = ap.parse_args(argv)
    try:
        res = run(quick=args.quick, log=lambda m: print(m, file=sys.stderr))
        written = write_outputs(res, args.out)
    except (ToolchainError, cache.CacheError, OSError) as e:
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 1
    print(report_text(res))
    print("wrote " + ", ".join(map(str, written)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
