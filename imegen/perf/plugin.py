"""Build and run the instruction-count QEMU plugin (insn_count.c).

The plugin is compiled for the host against QEMU's own plugin header, `qemu-plugin.h`, which
Debian ships only in the qemu source package. `ensure_plugin()` finds the header (see
`header_candidates`), fetching it with `apt-get source --download-only qemu` when a deb-src
entry is configured (.ci/install creates one), and caches the built .so under
`$XDG_CACHE_HOME/imegen` (default ~/.cache/imegen), keyed by the hash of source and header.

    python3 -m imegen.perf.plugin      # fetch the header if needed, build, print the .so path
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import toolchain
from ..toolchain import ToolchainError

SOURCE = Path(__file__).with_name("insn_count.c")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "imegen"


def header_candidates() -> list[Path]:
    """Where qemu-plugin.h may be, in order: $IMEGEN_QEMU_PLUGIN_H, our cache, system include dirs."""
    env = os.environ.get("IMEGEN_QEMU_PLUGIN_H")
    found = [Path(env)] if env else []
    return found + [cache_dir() / "qemu-include" / "qemu-plugin.h",
                    Path("/usr/include/qemu-plugin.h"), Path("/usr/include/qemu/qemu-plugin.h")]


class PluginUnavailable(RuntimeError):
    pass


def fetch_header() -> Path:
    """Download Debian's qemu source package (orig tarball only) and extract qemu-plugin.h."""
    dest = cache_dir() / "qemu-include" / "qemu-plugin.h"
    if shutil.which("apt-get") is None:
        raise PluginUnavailable("qemu-plugin.h not found and apt-get is unavailable to fetch it")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(["apt-get", "source", "--download-only", "qemu"], cwd=tmp,
                              capture_output=True, text=True)
        tarballs = sorted(Path(tmp).glob("qemu_*.orig.tar.*"))
        if proc.returncode != 0 or not tarballs:
            raise PluginUnavailable(
                "qemu-plugin.h not found, and `apt-get source --download-only qemu` failed "
                "(is a deb-src entry configured? .ci/install creates /etc/apt/sources.list.d/imegen-src.sources "
                f"and runs apt-get update):\n{proc.stderr.strip()}")
        with tarfile.open(tarballs[0]) as tar:
            member = next((m for m in tar if m.name.endswith("/include/qemu/qemu-plugin.h")), None)
            if member is None:
                raise PluginUnavailable(f"{tarballs[0].name} has no include/qemu/qemu-plugin.h")
            data = tar.extractfile(member).read()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_dest = dest.with_suffix(".tmp")
    tmp_dest.write_bytes(data)
    tmp_dest.rename(dest)
    return dest


def find_header(*, fetch: bool = True) -> Path:
    for path in header_candidates():
        if path.is_file():
            return path
    if not fetch:
        raise PluginUnavailable("qemu-plugin.h not found in: " + ", ".join(map(str, header_candidates())))
    return fetch_header()


def ensure_plugin(*, fetch: bool = True) -> Path:
    """Path of the built plugin (.so), building it (and fetching the header) on first use."""
    header = find_header(fetch=fetch)
    key = hashlib.sha256(SOURCE.read_bytes() + header.read_bytes()).hexdigest()[:16]
    so = cache_dir() / f"insn_count-{key}.so"
    if so.exists():
        return so
    so.parent.mkdir(parents=True, exist_ok=True)
    tmp = so.with_suffix(f".{os.getpid()}.tmp")
    cmd = [toolchain.HOST_CC, "-O2", "-shared", "-fPIC", "-std=c11", "-Wall", "-Wextra", "-Werror",
           f"-I{header.parent}", "-o", str(tmp), str(SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError("building the QEMU plugin failed", cmd, proc.returncode, proc.stdout, proc.stderr)
    tmp.rename(so)
    return so


def plugin_available() -> bool:
    try:
        ensure_plugin()
        return True
    except (PluginUnavailable, ToolchainError):
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
                beat_bytes: int = 16, timeout: float = 600, cpu_extra: str = "") -> PluginRun:
    """Run `exe` under qemu-riscv64 with the plugin; return its counts."""
    so = ensure_plugin()
    with tempfile.TemporaryDirectory() as tmp:
        rfile, ofile = Path(tmp) / "ranges.txt", Path(tmp) / "counts.txt"
        rfile.write_text("".join(f"{lo:x} {hi:x} {tag}\n" for lo, hi, tag in ranges))
        spec = f"{so},ranges={rfile},out={ofile},beat={beat_bytes}"
        if begin is not None:
            spec += f",begin={begin:x},end={end:x}"
        cmd = [toolchain.QEMU, "-plugin", spec, "-L", str(toolchain.SYSROOT), "-cpu", f"rv64,v=true,vlen={vlen}{cpu_extra}",
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
    except (PluginUnavailable, ToolchainError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
