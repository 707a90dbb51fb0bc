"""Per-Run instruction counts of a model in real riscv64 onnxruntime (Debian's build) under QEMU.

ort_bench_runner.c creates the session, makes one uncounted warm-up Run, then brackets each counted
Run with the plugin's begin/end markers, so session creation, model loading, weight prepacking and
the runner's own input/output handling never reach a per-Run figure (tests/test_ort_bench.py checks
it). Two QEMU processes: the first stops after printing the executable mappings (libraries are
loaded where QEMU's deterministic mmap puts them), the second runs with the plugin and ranges built
from them, and must print the same mappings.

Accounting (plugin tags, imegen/perf/count/insn_count.c):
  kernel    libonnxruntime.so and, with the custom-op path, imegen's custom-op library (kernels and
            glue), minus its IME emulator
  callee    every other library: libc, libm, libstdc++, libgcc, libonnx/protobuf ... ("other libs")
  excluded  the runner executable (it only calls OrtRun between the markers) and the IME emulator
  outside   QEMU's signal trampoline and vdso (2 instructions per emulated vmadot)
so a per-Run figure is everything ORT executes for the Run on every thread (kernel + callee), which
is what the X60 model (model/x60.py's TAGS) turns into time.

Threads: the plugin's counters are process-wide (one set for every vCPU), so with several intra-op
threads a region holds the sum over threads; the busiest thread is not separable. The thread pool's
spinning is off (session.intra_op.allow_spinning = 0), so the sum is work, not idle spinning.
"""

from __future__ import annotations

import functools
import json
import os
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .... import cache, toolchain
from ....ort import sysroot
from ....ort.riscv import DTYPES, HARMLESS_STDERR, ONNX_TYPE
from ....toolchain import ToolchainError
from ...count import plugin
from ...count.image import NM, symbols
from ...count.measure import BEAT_BYTES, VLEN

RUNNER_SOURCE = Path(__file__).with_name("ort_bench_runner.c")
ORT_VERSION = "1.23"


def runner(version: str = ORT_VERSION) -> Path:
    """The counted-Run runner, non-PIE (static marker addresses), cached by its inputs."""
    root = sysroot.ensure(version)
    header = sysroot.include_dir(root) / "onnxruntime_c_api.h"
    inputs = cache.Inputs(files=(RUNNER_SOURCE, header, toolchain.BENCH_MARKERS),
                          strings=(repr(toolchain.COMMON_FLAGS), "-no-pie"), tools=(toolchain.CLANG,))

    def fill(d: Path) -> None:
        toolchain.compile_c([RUNNER_SOURCE], d / "ort_bench_runner", march="rv64gc",
                            include_dirs=[sysroot.include_dir(root), toolchain.RUNTIME_DIR],
                            extra_flags=["-std=gnu11", "-no-pie", "-ldl"])

    return cache.entry("ort-bench-runner", inputs.key(), fill) / "ort_bench_runner"


def _stderr(text: str) -> str:
    return "\n".join(x for x in text.splitlines() if x.strip() and not x.startswith(HARMLESS_STDERR))


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def write_feeds(path: Path, feeds: dict[str, np.ndarray], wanted: list[str]) -> None:
    parts = [struct.pack("<I", len(feeds))]
    for name, value in feeds.items():
        a = np.ascontiguousarray(value)
        parts += [_string(name), struct.pack("<II", ONNX_TYPE[a.dtype], a.ndim), struct.pack(f"<{a.ndim}q", *a.shape),
                  struct.pack("<Q", a.nbytes), a.tobytes()]
    parts += [struct.pack("<I", len(wanted))] + [_string(n) for n in wanted]
    path.write_bytes(b"".join(parts))


def read_outputs(path: Path) -> dict[str, np.ndarray]:
    data, pos, out = path.read_bytes(), 0, {}

    def take(n: int) -> bytes:
        nonlocal pos
        pos += n
        return data[pos - n:pos]

    for _ in range(struct.unpack("<I", take(4))[0]):
        name = take(struct.unpack("<I", take(4))[0]).decode()
        etype, rank = struct.unpack("<II", take(8))
        dims = struct.unpack(f"<{rank}q", take(8 * rank))
        nbytes = struct.unpack("<Q", take(8))[0]
        out[name] = np.frombuffer(take(nbytes), dtype=DTYPES[etype]).reshape(dims).copy()
    return out


@dataclass(frozen=True)
class Mapping:
    lo: int
    hi: int
    perms: str
    offset: int
    path: str


def parse_maps(stdout: str) -> list[Mapping]:
    out = []
    for line in stdout.splitlines():
        if line.startswith("map "):
            _, lo, hi, perms, off, path = line.split(" ", 5)
            out.append(Mapping(int(lo, 16), int(hi, 16), perms, int(off, 16), path))
    return out


def _code(maps: list[Mapping]) -> list[Mapping]:
    """The file-backed executable mappings (thread stacks and heaps may move between runs; they hold no code)."""
    return [m for m in maps if "x" in m.perms and m.path.startswith("/")]


def _function_names(obj: Path) -> set[str]:
    proc = subprocess.run([NM, "--defined-only", str(obj)], capture_output=True, text=True, check=True)
    return {p[2] for p in (line.split() for line in proc.stdout.splitlines()) if len(p) == 3 and p[1] in "tT"}


def emulator_ranges(library: Path, base: int) -> list[tuple[int, int, str]]:
    """Code of the IME emulator inside a qemu-flavour custom-op library (its ime_emu.o's functions)."""
    emu = library.parent / "ime_emu.o"
    if not emu.exists():
        return []
    names = _function_names(emu)
    found = [(base + a, base + a + s, "excluded") for n, (a, s, k) in symbols(library).items()
             if n in names and k in "tT" and s]
    if not found:
        raise ToolchainError(f"no IME emulator functions found in {library}", [])
    return found


def ranges_for(maps: list[Mapping], exe: Path, custom: Path | None) -> list[tuple[int, int, str]]:
    """Plugin ranges (first match wins): emulator and runner excluded, ORT (+ custom lib) kernel, the rest image."""
    exe_path, custom_path = str(exe.resolve()), str(custom.resolve()) if custom else None
    bases = {m.path: m.lo for m in sorted(maps, key=lambda m: m.lo) if m.offset == 0}
    first, kernel, image = [], [], []
    for m in maps:
        if "x" not in m.perms:
            continue
        if m.path == exe_path:
            first.append((m.lo, m.hi, "excluded"))
        elif "libonnxruntime.so" in Path(m.path).name or m.path == custom_path:
            kernel.append((m.lo, m.hi, "kernel"))
        elif m.path.startswith("/"):
            image.append((m.lo, m.hi, "image"))
    if custom_path:
        if custom_path not in bases:
            raise ToolchainError(f"the custom-op library {custom_path} is not mapped", [])
        first = emulator_ranges(custom, bases[custom_path]) + first
    if not kernel:
        raise ToolchainError("libonnxruntime.so is not among the mapped libraries", [])
    return first + kernel + image


@functools.lru_cache(maxsize=None)
def serialized_threads_exact() -> bool:
    """Whether guest threads can run under SCHED_FIFO here (needs CAP_SYS_NICE or an rtprio limit)."""
    return subprocess.run(["chrt", "-f", "1", "true"], capture_output=True).returncode == 0


def serializer() -> list[str]:
    """The command prefix that makes a multi-threaded guest's counts exact: every QEMU thread on one host
    CPU, under SCHED_FIFO, so none is preempted between the load and the store of a plugin counter
    (the counters are plain process-wide memory; a preempted update would overwrite another thread's
    whole time slice of counts). Without SCHED_FIFO only the pinning is applied and the counts are
    approximate (serialized_threads_exact() says which)."""
    pin = ["taskset", "-c", str(min(os.sched_getaffinity(0)))]
    return (["chrt", "-f", "1"] if serialized_threads_exact() else []) + pin


@dataclass(frozen=True)
class RunCounts:
    runs: list[dict[str, int]]  # one plugin region per counted Run
    outputs: dict[str, np.ndarray]  # the last Run's outputs
    total: dict[str, int]  # the whole process (session creation included)
    version: str  # onnxruntime's Debian version
    check: dict | None = None  # what the caller's output check returned (cached_count_runs)


def count_runs(model: Path, feeds: dict[str, np.ndarray], wanted: list[str], *, threads: int = 1, runs: int = 1,
               custom_ops: Path | None = None, version: str = ORT_VERSION, timeout: float = 3600,
               one_host_cpu: bool = True) -> RunCounts:
    root = sysroot.ensure(version)
    exe = runner(version)
    syms = symbols(exe)
    so = plugin.ensure_plugin()
    pin = serializer() if threads > 1 and one_host_cpu else []
    base = [toolchain.QEMU, "-L", str(root), "-cpu", toolchain.qemu_cpu(VLEN, zfh=bool(custom_ops))]  # stock ORT runs as counted before
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        write_feeds(t / "feeds.bin", feeds, wanted)
        args = [str(exe), str(sysroot.library(root)), str(Path(model).resolve()),
                str(Path(custom_ops).resolve()) if custom_ops else "-", str(threads)]
        tail = [str(t / "feeds.bin"), str(t / "out.bin")]
        probe = subprocess.run(base + args + ["-1"] + tail, capture_output=True, text=True, timeout=timeout)
        if probe.returncode != 0:
            raise ToolchainError("ORT bench runner failed", base + args, probe.returncode, probe.stdout[-2000:],
                                 _stderr(probe.stderr))
        maps = parse_maps(probe.stdout)
        ranges = ranges_for(maps, exe, custom_ops)
        (t / "ranges.txt").write_text("".join(f"{lo:x} {hi:x} {tag}\n" for lo, hi, tag in ranges))
        spec = (f"{so},ranges={t / 'ranges.txt'},out={t / 'counts.txt'},beat={BEAT_BYTES},"
                f"begin={syms['imegen_bench_begin'][0]:x},end={syms['imegen_bench_end'][0]:x}")
        cmd = pin + base[:1] + ["-plugin", spec] + base[1:] + args + [str(runs)] + tail
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise ToolchainError("ORT bench runner failed under the counting plugin", cmd, proc.returncode,
                                 proc.stdout[-2000:], _stderr(proc.stderr))
        if _code(parse_maps(proc.stdout)) != _code(maps):
            raise ToolchainError("the libraries were mapped at other addresses under the plugin than in the probe "
                                 "run: the ranges would be wrong", cmd)
        run = plugin.parse_output((t / "counts.txt").read_text())
        if len(run.regions) != runs:
            raise ToolchainError(f"{len(run.regions)} regions for {runs} Runs", cmd)
        return RunCounts([dict(r.values) for r in run.regions], read_outputs(t / "out.bin"), dict(run.total.values),
                         sysroot.full_version(root))


def counts_inputs() -> cache.Inputs:
    """What a cached per-Run count depends on besides the model and feeds."""
    so = plugin.ensure_plugin()
    return cache.Inputs((Path(__file__), RUNNER_SOURCE, Path(plugin.__file__)),
                        (so.name, f"vlen={VLEN}", f"beat={BEAT_BYTES}"), (toolchain.QEMU,))


def cached_count_runs(key_parts: tuple[str, ...], make, **kw) -> RunCounts:
    """count_runs of the model, feeds, wanted outputs and output check `make(directory)` returns, cached
    (cache.entry) by `key_parts` (everything that decides what `make` builds), the ORT sysroot, the
    runner, the plugin and the count_runs arguments; the model is built only on a miss."""
    version = kw.get("version", ORT_VERSION)
    root = sysroot.ensure(version)
    custom = kw.get("custom_ops")
    base = counts_inputs()
    params = repr(sorted((k, str(v)) for k, v in kw.items() if k != "custom_ops"))
    params += f" exact-threads={serialized_threads_exact()}"
    inputs = cache.Inputs(base.files + ((Path(custom),) if custom else ()),
                          base.strings + tuple(key_parts) + (sysroot.full_version(root), params), base.tools)

    def fill(d: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            model, feeds, wanted, check = make(Path(tmp))
            rc = count_runs(model, feeds, wanted, **kw)
            checked = check(rc.outputs)  # raises: a wrong output is never cached
        (d / "counts.json").write_text(json.dumps({"runs": rc.runs, "total": rc.total, "version": rc.version,
                                                   "check": checked}))
        np.savez(d / "outputs.npz", **rc.outputs)

    d = cache.entry("ort-runs", inputs.key(), fill)
    data = json.loads((d / "counts.json").read_text())
    with np.load(d / "outputs.npz") as z:
        outputs = {k: z[k] for k in z.files}
    return RunCounts(data["runs"], outputs, data["total"], data["version"], data["check"])
