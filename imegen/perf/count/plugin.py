"""Build and run the instruction-count QEMU plugin (insn_count.c).

The plugin is compiled for the host against QEMU's own plugin header, `qemu-plugin.h`, which
Debian ships only in the qemu source package. `ensure_plugin()` finds the header (see
`header_candidates`), fetching it with `apt-get source --download-only qemu` when a deb-src
entry is configured (.ci/install creates one), and caches header and .so in imegen's per-user
cache (imegen/cache.py), the .so keyed by source, header, flags and host compiler. An unusable
cache directory is reported as such, before any fetch is tried.

    python3 -m imegen.perf.count.plugin      # fetch the header if needed, build, print the .so path
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ... import cache, toolchain
from ...toolchain import ToolchainError

SOURCE = Path(__file__).with_name("insn_count.c")


FLAGS = ("-O2", "-shared", "-fPIC", "-std=c11", "-Wall", "-Wextra", "-Werror")


def header_candidates() -> list[Path]:
    """Where qemu-plugin.h may be, in order: $IMEGEN_QEMU_PLUGIN_H, our cache, system include dirs."""
    env = os.environ.get("IMEGEN_QEMU_PLUGIN_H")
    found = [Path(env)] if env else []
    return found + [cache.root() / "qemu-include" / "qemu-plugin.h",
                    Path("/usr/include/qemu-plugin.h"), Path("/usr/include/qemu/qemu-plugin.h")]


class PluginUnavailable(RuntimeError):
    pass


def qemu_source_package() -> str:
    """`qemu=VERSION` for the installed qemu-user's source version, else plain `qemu`. The header must be
    the running QEMU's: the plugin API is checked at load, and with several deb-src suites configured
    (.ci/install adds trixie's for the ORT tree) apt would otherwise pick the newest qemu, whose header
    also needs glib."""
    proc = subprocess.run(["dpkg-query", "-W", "-f", "${source:Version}", "qemu-user"], capture_output=True, text=True) \
        if shutil.which("dpkg-query") else None
    return f"qemu={proc.stdout.strip()}" if proc is not None and proc.returncode == 0 and proc.stdout.strip() else "qemu"


def fetch_header() -> Path:
    """Download Debian's qemu source package (orig tarball only) and extract qemu-plugin.h."""
    dest = cache.root() / "qemu-include" / "qemu-plugin.h"
    if shutil.which("apt-get") is None:
        raise PluginUnavailable("qemu-plugin.h not found and apt-get is unavailable to fetch it")
    package = qemu_source_package()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(["apt-get", "source", "--download-only", package], cwd=tmp,
                              capture_output=True, text=True)
        tarballs = sorted(Path(tmp).glob("qemu_*.orig.tar.*"))
        if proc.returncode != 0 or not tarballs:
            raise PluginUnavailable(
                f"qemu-plugin.h not found, and `apt-get source --download-only {package}` failed "
                "(is a deb-src entry configured? .ci/install creates /etc/apt/sources.list.d/imegen-src.sources "
                f"and runs apt-get update):\n{proc.stderr.strip()}")
        with tarfile.open(tarballs[0]) as tar:
            member = next((m for m in tar if m.name.endswith("/include/qemu/qemu-plugin.h")), None)
            if member is None:
                raise PluginUnavailable(f"{tarballs[0].name} has no include/qemu/qemu-plugin.h")
            data = tar.extractfile(member).read()
    dest.parent.mkdir(parents=True, exist_ok=True)
    cache.write_file(dest, data)
    return dest


def find_header(*, fetch: bool = True) -> Path:
    for path in header_candidates():
        if path.is_file():
            return path
    if not fetch:
        raise PluginUnavailable("qemu-plugin.h not found in: " + ", ".join(map(str, header_candidates())))
    return fetch_header()


def plugin_inputs(header: Path) -> cache.Inputs:
    """What the .so depends on: its source, QEMU's header, the flags and the host compiler."""
    return cache.Inputs((SOURCE, header), FLAGS, (toolchain.HOST_CC,))


def ensure_plugin(*, fetch: bool = True) -> Path:
    """Path of the built plugin (.so), building it (and fetching the header) on first use.

    Raises cache.CacheError first if the cache directory is unusable (e.g. a read-only HOME):
    that, not a missing deb-src entry, is then why nothing can be fetched or built."""
    root = cache.root()
    header = find_header(fetch=fetch)
    so = root / f"insn_count-{plugin_inputs(header).key()}.so"
    if so.exists():
        return so
    tmp = cache.tmp_name(so)
    cache.track(tmp)
    try:
        cmd = [toolchain.HOST_CC, *FLAGS, f"-I{header.parent}", "-o", str(tmp), str(SOURCE)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolchainError("building the QEMU plugin failed", cmd, proc.returncode, proc.stdout, proc.stderr)
        os.replace(tmp, so)
    finally:
        cache.untrack(tmp)
    return so


def plugin_available() -> bool:
    try:
        ensure_plugin()
        return True
    except (PluginUnavailable, ToolchainError, cache.CacheError):
        return False


@dataclass(frozen=True)
class Counts:
    """One region (or the whole run): counter name -> value, names from the plugin's header line."""

    values: dict[str, int]

    def __getitem__(self, key: str) -> int:
        return self.values[key]

    def get(self, key: str, default: int = 0) -> int:
        return self.values.get(key, default)


@dataclass(frozen=True)
class PluginRun:
    regions: list[Counts]
    total: Counts
    stdout: str = ""


def parse_output(text: str) -> PluginRun:
    lines = text.splitlines()
    if not lines or not lines[0].startswith("format "):
        raise ValueError("plugin output has no format line")
    names = lines[0].split()[1:]
    regions, total = [], None
    for line in lines[1:]:
        tokens = line.split()
        if tokens[0] not in ("total", "region"):
            raise ValueError(f"unexpected plugin output line: {line[:60]!r}")
        values = [int(v) for v in tokens[1 if tokens[0] == "total" else 2:]]
        if len(values) != len(names):
            raise ValueError(f"plugin line has {len(values)} values, format has {len(names)}")
        counts = Counts(dict(zip(names, values)))
        if tokens[0] == "total":
            total = counts
        else:
            regions.append(counts)
    if total is None:
        raise ValueError("plugin output has no total line (did the program exit normally?)")
    return PluginRun(regions, total)


def run_counted(exe: Path, args: list[str], ranges: list[tuple[int, int, str]], *,
                begin: int | None = None, end: int | None = None, vlen: int = 256,
                beat_bytes: int = 16, timeout: float = 600, guest_env: dict[str, str] | None = None) -> PluginRun:
    """Run `exe` under qemu-riscv64 with the plugin; return its counts. guest_env: variables set in the
    program's environment only (QEMU's -E)."""
    so = ensure_plugin()
    with tempfile.TemporaryDirectory() as tmp:
        rfile, ofile = Path(tmp) / "ranges.txt", Path(tmp) / "counts.txt"
        rfile.write_text("".join(f"{lo:x} {hi:x} {tag}\n" for lo, hi, tag in ranges))
        spec = f"{so},ranges={rfile},out={ofile},beat={beat_bytes}"
        if begin is not None:
            spec += f",begin={begin:x},end={end:x}"
        cmd = [toolchain.QEMU, "-plugin", spec, "-L", str(toolchain.SYSROOT), "-cpu", toolchain.qemu_cpu(vlen),
               *(a for k, v in (guest_env or {}).items() for a in ("-E", f"{k}={v}")),
               str(Path(exe).resolve()), *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ToolchainError(f"timed out after {timeout} s", cmd) from None
        if proc.returncode != 0:
            raise ToolchainError("program failed under the counting plugin", cmd, proc.returncode,
                                 proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))
        run = parse_output(ofile.read_text())
        return PluginRun(run.regions, run.total, proc.stdout.decode(errors="replace"))


def main() -> int:
    try:
        print(ensure_plugin())
    except (PluginUnavailable, ToolchainError, cache.CacheError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
