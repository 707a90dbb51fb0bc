"""Deterministic instruction counts of a generated kernel, by class, under QEMU.

Method (printed by `imegen bench` as METHOD):
  * the kernel, a small driver (bench_driver.c) and, for IME, the SIGILL trap emulator are linked
    statically, with a GNU ld link map;
  * the map gives the address ranges of every code section of each object: the kernel object's
    code is "kernel"; the driver's and the emulator's are excluded; any other code of the image
    that runs between the markers is libc/libm the kernel calls ("callee": memset, roundf, ...);
    code outside the image (QEMU's signal trampoline, 2 instructions per emulated vmadot) is
    excluded too. As a cross-check every `NAME_`-prefixed symbol (`nm --print-size`) must lie
    in the kernel ranges;
  * qemu-riscv64 runs it with the counting plugin (insn_count.c), which classifies each retired
    instruction from its encoding and snapshots the counters at the driver's marker functions;
    for IME kernels the count of vmadot the plugin saw, the count the emulator executed and the
    count the plan predicts must agree;
  * full shapes are not run (every vmadot traps into the emulator): the kernel is run at
    M in {r_m, t_m + r_m} x N in {r_n, t_n + r_n} with the full K (t = tile, r = rows/columns in
    the last tile), and the counts are extrapolated to ceil(M/t_m) x ceil(N/t_n) tiles: A
    preparation linearly in the M tiles, the tile loop bilinearly in M and N tiles. The tile loop
    does the same work for every tile with the same (rows, cols), so this is exact for the
    kernel's own code (extrapolate.py); tests/test_perf_counts.py checks it against a direct run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from ... import cache, targets, toolchain
from ...plan import KernelPlan, expected_vmadots
from ...render import march_for, render_kernel
from ...toolchain import ToolchainError
from ..model import x60
from . import plugin
from .extrapolate import CaseCounts, ShapeCounts, extrapolate, sample_shapes
from .image import code_ranges_from_map, exec_segments, load_ranges, save_ranges, symbols
from .plugin import run_counted

DRIVER = Path(__file__).with_name("bench_driver.c")
VLEN = 256  # K1
BEAT_BYTES = 16  # vector memory beats of DLEN = 128 bits (x60.X60Params.dlen)

METHOD = (
    "Counts are instructions retired under qemu-riscv64 (TCG plugin imegen/perf/count/insn_count.c), "
    "classified from each instruction word: only the kernel object's code (address ranges from the "
    "link map) plus the libc/libm functions it calls; the IME SIGILL emulator, the signal trampoline "
    "and the driver are excluded; a vmadot is counted when attempted. Each kernel runs at "
    "M in {r_m, t_m+r_m} x N in {r_n, t_n+r_n} with the full K (t = tile, r = rows/cols of the last "
    "tile); counts are extrapolated to the full shape by whole tiles (A preparation linear in M tiles, "
    "tile loop bilinear in M and N tiles). QEMU VLEN = 256; compiler clang-19 -O2."
)


@dataclass(frozen=True)
class BenchExe:
    plan: KernelPlan
    exe: Path
    ranges: tuple[tuple[int, int, str], ...]
    begin: int
    end: int


def bench_inputs(plan: KernelPlan, *, compiler: str = "clang") -> tuple[dict[str, str], dict[str, object], cache.Inputs]:
    """The kernel sources, the driver's -D settings, and everything the bench executable depends
    on: them, the bench driver, the runtime (emulator, its header, the markers), the compiler,
    its flags (per -march) and version, the sysroot libc it links statically."""
    s = plan.spec
    if s.abi != "imegen":
        raise ValueError(f"{plan.name}: the bench drives the imegen ABI (NAME_matmul), not abi={s.abi}")
    sources = render_kernel(plan, "<bench>")
    defines = {"IMEGEN_BENCH_HEADER": f'"{plan.name}.h"', "IMEGEN_BENCH_PREFIX": f"{plan.name}_",
               "IMEGEN_BENCH_BLOCK": s.block, "IMEGEN_BENCH_BITS": s.bits,
               "IMEGEN_BENCH_ZP": int(s.zero_point == "asymmetric"), "IMEGEN_BENCH_BIAS": int(s.bias),
               "IMEGEN_BENCH_IME": int(targets.of(s).needs_ime)}
    inputs = cache.Inputs((DRIVER, *toolchain.runtime_files()),
                          tuple(f"{name}\n{text}" for name, text in sorted(sources.items()))
                          + tuple(f"-D{k}={v}" for k, v in sorted(defines.items())) + ("-static",))
    inputs += toolchain.inputs(compiler, marches=(march_for(plan), "rv64gcv", "rv64gc"))
    return sources, defines, inputs


def build_bench(plan: KernelPlan, *, compiler: str = "clang") -> BenchExe:
    """Compile kernel + bench driver (+ IME emulator) statically; locate the code ranges."""
    sources, defines, inputs = bench_inputs(plan, compiler=compiler)
    s = plan.spec

    def fill(d: Path) -> None:
        for name, text in sources.items():
            (d / name).write_text(text)
        kobj = toolchain.compile_c([d / f"{plan.name}.c"], d / "kernel.o", compiler=compiler, march=march_for(plan),
                                   include_dirs=[d])
        dobj = toolchain.compile_c([DRIVER], d / "driver.o", compiler=compiler,
                                   include_dirs=[d, toolchain.RUNTIME_DIR],
                                   extra_flags=[f"-D{k}={v}" for k, v in defines.items()])
        objs = [kobj, dobj]
        if targets.of(s).needs_ime:  # its vmadots trap into the emulator, excluded from the counts
            objs.append(toolchain.compile_ime_emu(d / "ime_emu.o", compiler=compiler))
        toolchain.compile_c(objs, d / "bench", compiler=compiler, extra_flags=["-static", f"-Wl,-Map={d / 'bench.map'}"])
        objects = {str(d / "kernel.o"): "kernel", str(d / "driver.o"): "excluded", str(d / "ime_emu.o"): "excluded"}
        save_ranges(d, code_ranges_from_map((d / "bench.map").read_text(), objects))

    d = cache.entry(f"bench-{plan.name}", inputs.key(), fill)
    exe, ranges = d / "bench", load_ranges(d)
    if not any(tag == "kernel" for *_, tag in ranges):
        raise ToolchainError(f"no code of {plan.name} found in the link map {d / 'bench.map'}", [])
    syms = symbols(exe)
    for name, (addr, _, kind) in syms.items():
        if name.startswith(f"{plan.name}_") and kind in "tT":
            if not any(lo <= addr < hi and tag == "kernel" for lo, hi, tag in ranges):
                raise ToolchainError(f"symbol {name} at {addr:#x} lies outside the kernel's code ranges", [])
    ranges += [(lo, hi, "image") for lo, hi in exec_segments(exe)]
    return BenchExe(plan, exe, tuple(ranges), syms["imegen_bench_begin"][0], syms["imegen_bench_end"][0])


def run_cases(b: BenchExe, shapes: list[tuple[int, int, int]]) -> list[CaseCounts]:
    """One QEMU run for all shapes; checks status and (IME) the vmadot counts."""
    if not shapes:
        return []
    with_args = [f"{M}x{N}x{K}" for M, N, K in shapes]
    run = run_counted(b.exe, with_args, list(b.ranges), begin=b.begin, end=b.end, vlen=VLEN, beat_bytes=BEAT_BYTES)
    out_lines = run.stdout.splitlines()
    if len(run.regions) != 2 * len(shapes) or len(out_lines) != len(shapes):
        raise ToolchainError(f"bench driver produced {len(run.regions)} regions / {len(out_lines)} lines "
                             f"for {len(shapes)} cases", [str(b.exe), *with_args])
    results = []
    for i, (M, N, K) in enumerate(shapes):
        _, _, _, status, emulated, checksum = out_lines[i].split()
        if int(status) != 0 or not math.isfinite(float(checksum)):
            raise ToolchainError(f"{b.plan.name} {M}x{N}x{K}: status {status}, checksum {checksum}", [str(b.exe)])
        prep, mm = run.regions[2 * i].values, run.regions[2 * i + 1].values
        want = expected_vmadots(b.plan, M, N, K)
        seen = mm["kernel.vmadot"] + mm["callee.vmadot"]
        if not (int(emulated) == want == seen):
            raise ToolchainError(f"{b.plan.name} {M}x{N}x{K}: plan expects {want} vmadot, plugin counted {seen}, "
                                 f"emulator executed {emulated}", [str(b.exe)])
        results.append(CaseCounts(M, N, K, dict(prep), dict(mm), int(emulated)))
    return results


def _load_cached(path: Path) -> dict[str, dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def measure_shapes(plan: KernelPlan, shapes: list[tuple[int, int, int]], *, compiler: str = "clang",
                   use_cache: bool = True) -> list[ShapeCounts]:
    """Build once, run every needed reduced shape in one QEMU process, extrapolate each shape.

    Counts are cached next to the bench executable (whose directory is keyed by its build
    inputs), in a file keyed by counts_inputs(), so a rerun reproduces them without QEMU.
    """
    # A shape whose call splits K is sampled by a build forced to the same K chunks: its small samples
    # would not split on their own.
    chunks = {shape: x60.k_chunks(plan, *shape) for shape in shapes}
    out = {}
    for q in sorted(set(chunks.values())):
        mine = [shape for shape in shapes if chunks[shape] == q]
        built = plan if q == 1 or plan.forced_k_chunks else replace(plan, forced_k_chunks=q)
        measured = _measure_samples(built, mine, compiler, use_cache)
        out.update({(M, N, K): extrapolate(built, M, N, K, measured) for M, N, K in mine})
    return [out[shape] for shape in shapes]


def _measure_samples(plan: KernelPlan, shapes: list[tuple[int, int, int]], compiler: str,
                     use_cache: bool) -> dict[tuple[int, int, int], CaseCounts]:
    needed = list(dict.fromkeys(s for M, N, K in shapes for s in sample_shapes(plan, M, N, K)))
    b = build_bench(plan, compiler=compiler)
    cache_file = b.exe.parent / f"counts-{counts_inputs().key()}.json"
    cached = _load_cached(cache_file) if use_cache else {}
    missing = [s for s in needed if "x".join(map(str, s)) not in cached]
    for c in run_cases(b, missing):
        cached["x".join(map(str, (c.M, c.N, c.K)))] = {"prep": c.prep, "matmul": c.matmul, "emulated": c.emulated_vmadots}
    if missing and use_cache:
        cache.write_file(cache_file, json.dumps(cached, sort_keys=True).encode())
    measured = {}
    for s in needed:
        c = cached["x".join(map(str, s))]
        measured[s] = CaseCounts(*s, c["prep"], c["matmul"], c["emulated"])
    return measured


def counts_inputs() -> cache.Inputs:
    """What counting adds to a bench executable: the plugin (its .so is named by its own inputs),
    QEMU, the run parameters and the Python that turns plugin output into counts."""
    return cache.Inputs((Path(__file__), Path(plugin.__file__)),
                        (plugin.ensure_plugin().name, f"vlen={VLEN}", f"beat={BEAT_BYTES}"), (toolchain.QEMU,))
