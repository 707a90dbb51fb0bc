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
    kernel's own code; tests/test_perf.py checks it against a direct run.
"""

from __future__ import annotations

import json
import math
import re
import struct
import subprocess
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path

from .. import cache, toolchain
from ..plan import KernelPlan, expected_vmadots
from ..render import march_for, render_kernel
from ..toolchain import ToolchainError
from . import plugin, x60
from .plugin import run_counted

DRIVER = Path(__file__).with_name("bench_driver.c")
NM = "riscv64-linux-gnu-nm"
VLEN = 256  # K1
BEAT_BYTES = 16  # vector memory beats of DLEN = 128 bits (x60.X60Params.dlen)

METHOD = (
    "Counts are instructions retired under qemu-riscv64 (TCG plugin imegen/perf/insn_count.c), "
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


def exec_segments(exe: Path) -> list[tuple[int, int]]:
    """[vaddr, vaddr + memsz) of every executable PT_LOAD segment of an ELF64 file."""
    data = exe.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{exe} is not an ELF64 file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    segs = []
    for i in range(phnum):
        p_type, p_flags, _, p_vaddr, _, _, p_memsz, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 1 and p_flags & 1:  # PT_LOAD, PF_X
            segs.append((p_vaddr, p_vaddr + p_memsz))
    return segs


_MAP_LINE = re.compile(r"^\s*(\.text\S*)?\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+(\S.*)$")


def code_ranges_from_map(map_text: str, objects: dict[str, str]) -> list[tuple[int, int, str]]:
    """Address ranges of the `.text*` input sections of each object in a GNU ld map.

    `objects` maps an object path (as it appears in the map) to the tag of its code.
    A section name longer than the map's column is printed on its own line, with the
    address, size and file on the next line; both forms are handled.
    """
    ranges: list[tuple[int, int, str]] = []
    pending = None
    in_text_output = False
    for line in map_text.splitlines():
        if line.startswith("."):  # an output section
            in_text_output = line.split()[0] == ".text"
            pending = None
            continue
        if not in_text_output:
            continue
        stripped = line.strip()
        if re.fullmatch(r"\.text\S*", stripped):
            pending = stripped
            continue
        m = _MAP_LINE.match(line)
        if m and (m.group(1) or pending) and m.group(4).strip() in objects:
            lo, size = int(m.group(2), 16), int(m.group(3), 16)
            if size:
                ranges.append((lo, lo + size, objects[m.group(4).strip()]))
        pending = None
    return ranges


def symbols(exe: Path) -> dict[str, tuple[int, int, str]]:
    proc = subprocess.run([NM, "--print-size", "--defined-only", str(exe)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError("nm failed", [NM, str(exe)], proc.returncode, proc.stdout, proc.stderr)
    syms = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4:
            syms[parts[3]] = (int(parts[0], 16), int(parts[1], 16), parts[2])
        elif len(parts) == 3:
            syms[parts[2]] = (int(parts[0], 16), 0, parts[1])
    return syms


def save_ranges(d: Path, ranges: list[tuple[int, int, str]]) -> None:
    """The link map names objects by their path at link time, a temporary directory that the
    cache renames: resolve the ranges then and keep them next to the executable."""
    (d / "ranges.json").write_text(json.dumps(ranges))


def load_ranges(d: Path) -> list[tuple[int, int, str]]:
    return [(lo, hi, tag) for lo, hi, tag in json.loads((d / "ranges.json").read_text())]


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
               "IMEGEN_BENCH_IME": int(s.target == "ime")}
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
        if s.target == "ime":
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


@dataclass(frozen=True)
class CaseCounts:
    M: int
    N: int
    K: int
    prep: dict[str, int]  # prepare_a alone
    matmul: dict[str, int]  # the whole matmul call (prepare_a + tiles)
    emulated_vmadots: int


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


def _sub(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a[k] - b[k] for k in a}


def _axpy(base: dict[str, int], *terms: tuple[float, dict[str, int]]) -> dict[str, float]:
    out = {k: float(v) for k, v in base.items()}
    for scale, d in terms:
        if scale:
            for k, v in d.items():
                out[k] += scale * v
    return out


def tiles_of(plan: KernelPlan, M: int, N: int) -> tuple[int, int, int, int]:
    """(M tiles, N tiles, rows of the last M tile, cols of the last N tile)."""
    tm, tn = plan.spec.tile_m, plan.spec.tile_n
    mt, nt = -(-M // tm), -(-N // tn)
    return mt, nt, M - (mt - 1) * tm, N - (nt - 1) * tn


def sample_shapes(plan: KernelPlan, M: int, N: int, K: int) -> list[tuple[int, int, int]]:
    """The reduced shapes run to extrapolate (M, N, K)."""
    mt, nt, rm, rn = tiles_of(plan, M, N)
    xs = [rm] if mt == 1 else [rm, plan.spec.tile_m + rm]
    ys = [rn] if nt == 1 else [rn, plan.spec.tile_n + rn]
    return [(m, n, K) for m, n in product(xs, ys)]


@dataclass(frozen=True)
class ShapeCounts:
    """Counts of one kernel at one full shape, from the reduced runs.

    `prep(mt)` is linear and `tiles(mt, nt)` bilinear in whole tiles; `matmul(cores)` is the
    count one core executes when N tiles are split across `cores` cores and the A preparation
    is split evenly (the way ORT/llama.cpp parallelise).
    """

    M: int
    N: int
    K: int
    mt: int
    nt: int
    p0: dict[str, int]
    dp: dict[str, int]
    f00: dict[str, int]
    dm: dict[str, int]
    dn: dict[str, int]
    dmn: dict[str, int]
    samples: tuple[tuple[int, int, int], ...] = field(default=())
    m_blocks: int = 1  # M blocks per K chunk of the full shape (x60.m_block_rows); the samples lie in one

    def prep(self) -> dict[str, float]:
        return _axpy(self.p0, (self.mt - 1, self.dp))

    def tiles(self, nt: int | None = None) -> dict[str, float]:
        """The tile loop over mt x nt tiles. What one M block costs besides its M tiles (the N loop,
        and a staged B's staging of every N tile) is f00 + y dn - (dm + y dmn): once per further block
        (which also repeats the call's entry code, ~130 instructions a block: the only inexact part)."""
        nt = self.nt if nt is None else nt
        x, y = self.mt - 1, nt - 1
        per_block = _axpy(self.f00, (y, self.dn), (-1, self.dm), (-y, self.dmn))
        return _axpy(self.f00, (x, self.dm), (y, self.dn), (x * y, self.dmn), (self.m_blocks - 1, per_block))

    def matmul(self, cores: int = 1) -> dict[str, float]:
        """Per-core count: all of A's preparation / cores + the tiles of ceil(nt / cores) N tiles."""
        prep, tiles = self.prep(), self.tiles(-(-self.nt // cores))
        return {k: prep[k] / cores + tiles[k] for k in prep}


def extrapolate(plan: KernelPlan, M: int, N: int, K: int, measured: dict[tuple[int, int, int], CaseCounts]) -> ShapeCounts:
    samples = sample_shapes(plan, M, N, K)
    mt, nt, rm, rn = tiles_of(plan, M, N)
    tm, tn = plan.spec.tile_m, plan.spec.tile_n

    def at(i: int, j: int) -> CaseCounts:
        return measured[(rm + i * tm, rn + j * tn, K)]

    def tiles(c: CaseCounts) -> dict[str, int]:
        return _sub(c.matmul, c.prep)

    zero = {k: 0 for k in at(0, 0).prep}
    c00 = at(0, 0)
    p0, f00 = c00.prep, tiles(c00)
    dp = _sub(at(1, 0).prep, p0) if mt > 1 else zero
    dm = _sub(tiles(at(1, 0)), f00) if mt > 1 else zero
    dn = _sub(tiles(at(0, 1)), f00) if nt > 1 else zero
    dmn = (_sub(_sub(tiles(at(1, 1)), tiles(at(1, 0))), _sub(tiles(at(0, 1)), f00))
           if mt > 1 and nt > 1 else zero)
    rows = x60.m_block_rows(plan, x60.chunk_k(plan, K, x60.k_chunks(plan, M, N, K)))
    return ShapeCounts(M, N, K, mt, nt, p0, dp, f00, dm, dn, dmn, tuple(samples), -(-M // rows))


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
