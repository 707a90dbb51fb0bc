"""Per-Run counts of a model run as onnxruntime-genai runs its KV cache (past_present_share_buffer): each
shared output written into an input's own buffer (ort_bench_shared_runner.c: the output pre-allocated as the
input's OrtValue, as genai does). Otherwise exactly run_counts.count_runs / cached_count_runs (same plugin,
ranges, markers, warm-up Run, cache layout), with one intra-op thread.

It is a separate runner so that adding sharing left run_counts.py and ort_bench_runner.c, and with them every
cached count keyed by their text, as they were; with no pair shared the runner behaves as ort_bench_runner.c.
"""

from __future__ import annotations

import json
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from .... import cache, toolchain
from ....ort import sysroot
from ....toolchain import ToolchainError
from ...count import plugin
from ...count.image import symbols
from ...count.measure import VLEN
from . import run_counts as rc

RUNNER_SOURCE = Path(__file__).with_name("ort_bench_shared_runner.c")


def runner(version: str = rc.ORT_VERSION) -> Path:
    """The counted-Run runner with sharing, non-PIE (static marker addresses), cached by its inputs."""
    root = sysroot.ensure(version)
    header = sysroot.include_dir(root) / "onnxruntime_c_api.h"
    inputs = cache.Inputs(files=(RUNNER_SOURCE, header, toolchain.BENCH_MARKERS),
                          strings=(repr(toolchain.COMMON_FLAGS), "-no-pie"), tools=(toolchain.CLANG,))

    def fill(d: Path) -> None:
        toolchain.compile_c([RUNNER_SOURCE], d / "ort_bench_shared_runner", march="rv64gc",
                            include_dirs=[sysroot.include_dir(root), toolchain.RUNTIME_DIR],
                            extra_flags=["-std=gnu11", "-no-pie", "-ldl"])

    return cache.entry("ort-bench-shared-runner", inputs.key(), fill) / "ort_bench_shared_runner"


def write_feeds(path: Path, feeds: dict[str, np.ndarray], wanted: list[str], share: tuple[tuple[str, str], ...]):
    """run_counts' feeds file, then u32 n, (output, input)[n]."""
    rc.write_feeds(path, feeds, wanted)
    pairs = [rc._string(s) for pair in share for s in pair]
    with path.open("ab") as f:
        f.write(b"".join([struct.pack("<I", len(share)), *pairs]))


def count_runs(model: Path, feeds: dict[str, np.ndarray], wanted: list[str], share: tuple[tuple[str, str], ...], *,
               runs: int = 1, custom_ops: Path | None = None, version: str = rc.ORT_VERSION,
               timeout: float = 3600) -> rc.RunCounts:
    """run_counts.count_runs (1 intra-op thread) with each (output, input) of `share` written in place."""
    missing = [o for o, _ in share if o not in wanted] + [i for _, i in share if i not in feeds]
    if missing:
        raise ValueError(f"shared {missing[0]!r} is not among the wanted outputs and feeds")
    root = sysroot.ensure(version)
    exe = runner(version)
    syms = symbols(exe)
    so = plugin.ensure_plugin()
    base = [toolchain.QEMU, "-L", str(root), "-cpu", toolchain.qemu_cpu(VLEN, zfh=bool(custom_ops))]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        write_feeds(t / "feeds.bin", feeds, wanted, share)
        args = [str(exe), str(sysroot.library(root)), str(Path(model).resolve()),
                str(Path(custom_ops).resolve()) if custom_ops else "-", "1"]
        tail = [str(t / "feeds.bin"), str(t / "out.bin")]
        probe = subprocess.run(base + args + ["-1"] + tail, capture_output=True, text=True, timeout=timeout)
        if probe.returncode != 0:
            raise ToolchainError("ORT shared-buffer bench runner failed", base + args, probe.returncode,
                                 probe.stdout[-2000:], rc._stderr(probe.stderr))
        maps = rc.parse_maps(probe.stdout)
        ranges = rc.ranges_for(maps, exe, custom_ops)
        (t / "ranges.txt").write_text("".join(f"{lo:x} {hi:x} {tag}\n" for lo, hi, tag in ranges))
        spec = (f"{so},ranges={t / 'ranges.txt'},out={t / 'counts.txt'},beat={rc.BEAT_BYTES},"
                f"begin={syms['imegen_bench_begin'][0]:x},end={syms['imegen_bench_end'][0]:x}")
        cmd = base[:1] + ["-plugin", spec] + base[1:] + args + [str(runs)] + tail
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise ToolchainError("ORT shared-buffer bench runner failed under the counting plugin", cmd,
                                 proc.returncode, proc.stdout[-2000:], rc._stderr(proc.stderr))
        if rc._code(rc.parse_maps(proc.stdout)) != rc._code(maps):
            raise ToolchainError("the libraries were mapped at other addresses under the plugin than in the probe "
                                 "run: the ranges would be wrong", cmd)
        run = plugin.parse_output((t / "counts.txt").read_text())
        if len(run.regions) != runs:
            raise ToolchainError(f"{len(run.regions)} regions for {runs} Runs", cmd)
        return rc.RunCounts([dict(r.values) for r in run.regions], rc.read_outputs(t / "out.bin"),
                            dict(run.total.values), sysroot.full_version(root))


def cached_count_runs(key_parts: tuple[str, ...], make, share: tuple[tuple[str, str], ...], *, runs: int = 1,
                      custom_ops: Path | None = None, version: str = rc.ORT_VERSION) -> rc.RunCounts:
    """run_counts.cached_count_runs for count_runs above: `make(directory)` gives (model, feeds, wanted, check);
    cached by `key_parts`, the sharing, this runner and everything run_counts' counts depend on."""
    root = sysroot.ensure(version)
    base = rc.counts_inputs()
    inputs = cache.Inputs(base.files + (Path(__file__), RUNNER_SOURCE) + ((Path(custom_ops),) if custom_ops else ()),
                          base.strings + tuple(key_parts) + (repr(share), sysroot.full_version(root), f"runs={runs}"),
                          base.tools)

    def fill(d: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            model, feeds, wanted, check = make(Path(tmp))
            counted = count_runs(model, feeds, wanted, share, runs=runs, custom_ops=custom_ops, version=version)
            checked = check(counted.outputs)  # raises: a wrong output is never cached
        (d / "counts.json").write_text(json.dumps({"runs": counted.runs, "total": counted.total,
                                                   "version": counted.version, "check": checked}))
        np.savez(d / "outputs.npz", **counted.outputs)

    d = cache.entry("ort-shared-runs", inputs.key(), fill)
    data = json.loads((d / "counts.json").read_text())
    with np.load(d / "outputs.npz") as z:
        outputs = {k: z[k] for k in z.files}
    return rc.RunCounts(data["runs"], outputs, data["total"], data["version"], data["check"])
