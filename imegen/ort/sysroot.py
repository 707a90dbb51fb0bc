"""riscv64 sysroots holding Debian's onnxruntime builds (run under qemu-riscv64 -L SYSROOT).

Each version comes from one Debian suite (1.21: trixie, 1.23: sid) through a private apt
instance whose only architecture is riscv64 (its own sources, lists and cache under the imegen
cache): the host's dpkg and apt configuration are never touched, so the host's amd64
`apt-get install` keeps working. The package and its dependency closure (`apt-cache depends
--recurse`) are fetched with `apt-get download` and unpacked with `dpkg-deb -x`; a `lib -> usr/lib`
link lets the dynamic loader find libc. The result is cached as `ort-sysroot-<full version>`, so a
second call costs nothing. sid moves: whatever it serves must still be `libonnxruntime1.23`
(version 1.23.*), or ensure("1.23") fails saying what it found.

`python3 -m imegen.ort.sysroot` prepares both and prints where they are.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import cache

MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MULTIARCH = "usr/lib/riscv64-linux-gnu"


@dataclass(frozen=True)
class OrtRelease:
    suite: str
    runtime_package: str
    pinned_version: str | None  # None: take what the suite serves (checked against the series)


RELEASES = {
    "1.21": OrtRelease("trixie", "libonnxruntime1.21", "1.21.0+dfsg-1"),
    "1.23": OrtRelease("sid", "libonnxruntime1.23", None),
}


class SysrootError(RuntimeError):
    pass


def cache_root() -> Path:
    return cache.root()


def _apt_dir(suite: str) -> Path:
    return cache_root() / f"apt-riscv64-{suite}"


def _apt_options(suite: str) -> list[str]:
    d = _apt_dir(suite)
    return ["-o", f"Dir::Etc::SourceList={d / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", f"Dir::State={d / 'state'}", "-o", f"Dir::State::status={d / 'status'}",
            "-o", f"Dir::Cache={d / 'cache'}", "-o", "APT::Architecture=riscv64",
            "-o", "APT::Architectures::=riscv64", "-o", "Debug::NoLocking=1",
            "-o", "APT::Sandbox::User=root"]  # the private dirs live in the user's cache


def _apt(tool: str, suite: str, *args: str, cwd: Path | None = None) -> str:
    cmd = [tool, *_apt_options(suite), *args]
    try:
        # LC_ALL=C: apt's messages in English, the ones _reason looks for
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env={**os.environ, "LC_ALL": "C"})
    except FileNotFoundError:
        raise SysrootError(f"imegen fetches Debian's riscv64 onnxruntime with {tool}, which is not installed "
                           "(a Debian or Ubuntu host has it)") from None
    # apt-get update exits 0 when it cannot fetch an index: it warns and keeps the lists it had. This
    # private apt has no lists to fall back on, so a fetch that failed is an error here.
    if proc.returncode != 0 or "Failed to fetch" in proc.stderr:
        status = f" (exit {proc.returncode})" if proc.returncode else ""
        raise SysrootError(f"{_what(tool, args)} for Debian {suite} riscv64 failed{status}: {_reason(proc.stderr)}")
    return proc.stdout


def _what(tool: str, args: tuple[str, ...]) -> str:
    """The apt command in a few words: `apt-get update`, `apt-get download (41 packages)`."""
    words = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] != "-o")]
    return f"{tool} {words[0]} ({len(words) - 1} packages)" if len(words) > 2 else " ".join([tool, *words])


def _reason(stderr: str) -> str:
    """apt's most telling line: the first failed fetch, else its first error, else its last word."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    line = next((x for x in lines if "Failed to fetch" in x), None) or next((x for x in lines if x.startswith("E:")), None)
    line = line or (lines[-1] if lines else "no message")
    return " ".join(line.removeprefix("E:").removeprefix("W:").split())


def _update(suite: str) -> None:
    d = _apt_dir(suite)
    for sub in ("state/lists/partial", "cache/archives/partial"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "status").touch()
    (d / "sources.list").write_text(f"deb [arch=riscv64 signed-by={KEYRING}] {MIRROR} {suite} main\n")
    _apt("apt-get", suite, "-o", "APT::Update::Error-Mode=any", "-qq", "update")  # apt >= 2.3: a failed fetch exits 100


def _candidate(suite: str, package: str) -> str | None:
    for line in _apt("apt-cache", suite, "policy", package).splitlines():
        if line.strip().startswith("Candidate:"):
            v = line.split(":", 1)[1].strip()
            return None if v == "(none)" else v
    return None


def _closure(suite: str, roots: list[str]) -> list[str]:
    out = _apt("apt-cache", suite, "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
               "--no-breaks", "--no-replaces", "--no-enhances", "--no-pre-depends", *roots)
    names = {line.strip() for line in out.splitlines() if line and not line[0].isspace()}
    return sorted(n for n in names if not n.startswith("<"))  # <virtual> packages have no .deb


def _resolve(version: str) -> tuple[OrtRelease, str]:
    if version not in RELEASES:
        raise SysrootError(f"unknown onnxruntime version {version!r} (expected one of {', '.join(RELEASES)})")
    rel = RELEASES[version]
    _update(rel.suite)
    full = _candidate(rel.suite, rel.runtime_package)
    dev = _candidate(rel.suite, "libonnxruntime-dev")
    if full is None:
        raise SysrootError(f"Debian {rel.suite} no longer serves {rel.runtime_package} for riscv64 "
                           f"(libonnxruntime-dev there: {dev}); update imegen.ort.sysroot.RELEASES")
    if rel.pinned_version and full != rel.pinned_version:
        raise SysrootError(f"Debian {rel.suite} serves {rel.runtime_package} {full}, expected {rel.pinned_version}")
    if not full.startswith(version + ".") or dev != full:
        raise SysrootError(f"Debian {rel.suite} serves {rel.runtime_package} {full} with libonnxruntime-dev {dev}: "
                           f"not a matching {version}.x pair; update imegen.ort.sysroot.RELEASES")
    return rel, full


def cached(version: str) -> Path | None:
    """The newest complete cached sysroot for `version`, without any network access."""
    rel = RELEASES.get(version)
    pattern = f"ort-sysroot-{rel.pinned_version if rel and rel.pinned_version else version + '.*'}"
    done = sorted(p for p in cache_root().glob(pattern) if (p / ".complete").exists())
    return done[-1] if done else None


def ensure(version: str) -> Path:
    """Path of a riscv64 sysroot with onnxruntime `version` ("1.21" or "1.23"), built on first use."""
    hit = cached(version)
    if hit is not None:
        return hit
    rel, full = _resolve(version)
    root = cache_root() / f"ort-sysroot-{full}"
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    debs = tmp.with_name(tmp.name + "-debs")
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir(parents=True)
    packages = _closure(rel.suite, [f"{rel.runtime_package}={full}", f"libonnxruntime-dev={full}"])
    print(f"imegen: fetching onnxruntime {full} (riscv64, Debian {rel.suite}): {len(packages)} packages",
          file=sys.stderr)
    _apt("apt-get", rel.suite, "-qq", "download", *packages, cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        unpack = subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], capture_output=True, text=True)
        if unpack.returncode != 0:
            raise SysrootError(f"dpkg-deb -x {deb.name} failed (exit {unpack.returncode}): {_reason(unpack.stderr)}")
    if not (tmp / "lib").exists():
        (tmp / "lib").symlink_to("usr/lib")
    header = tmp / "usr/include/onnxruntime/onnxruntime_c_api.h"
    if not header.exists() or not library(tmp).exists():
        raise SysrootError(f"onnxruntime {full}: header or library missing after unpacking into {tmp}")
    (tmp / "IMEGEN_ORT_VERSION").write_text(full + "\n" + "\n".join(sorted(d.name for d in debs.glob("*.deb"))) + "\n")
    (tmp / ".complete").touch()
    shutil.rmtree(debs)
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root


def full_version(sysroot: Path) -> str:
    return (Path(sysroot) / "IMEGEN_ORT_VERSION").read_text().split("\n", 1)[0]


def include_dir(sysroot: Path) -> Path:
    return Path(sysroot) / "usr/include/onnxruntime"


def library(sysroot: Path) -> Path:
    """libonnxruntime.so (the -dev package's link to the versioned runtime library)."""
    return Path(sysroot) / MULTIARCH / "libonnxruntime.so"


def main() -> int:
    try:
        for v in RELEASES:
            p = ensure(v)
            print(f"onnxruntime {full_version(p)} (riscv64): {p}")
    except SysrootError as e:
        print(f"imegen: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
