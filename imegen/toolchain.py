"""Thin wrapper around the RISC-V cross toolchain and QEMU user mode.

Everything that shells out to a compiler or emulator goes through here, so failures always
surface as a ToolchainError that carries the exact command and its stderr.
"""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Sequence

from .cache import Inputs

RUNTIME_DIR = Path(__file__).parent / "runtime"
BENCH_MARKERS = RUNTIME_DIR / "bench_markers.h"  # counting-plugin markers, included by drivers

SYSROOT = Path("/usr/riscv64-linux-gnu")
CLANG = "clang-19"
GCC = "riscv64-linux-gnu-gcc"
HOST_CC = "cc"
QEMU = "qemu-riscv64"


def qemu_cpu(vlen: int | None = 256, *, zfh: bool = True) -> str:
    """QEMU's -cpu for the K1's X60 features the kernels use: RVV 1.0 at `vlen` (None: QEMU's
    default) and Zfh, which the X60 has and QEMU 7.2 leaves off: a16 kernels round A scales with
    `fcvt.h.s`, and QEMU 7.2 also wants it for SEW-16 `vfwcvt.f.f.v` (docs/ime-isa.md §5)."""
    return "rv64,v=true" + (",Zfh=true" if zfh else "") + (f",vlen={vlen}" if vlen is not None else "")

# Warnings are errors: generated code must be warning-clean under both compilers.
COMMON_FLAGS = ("-O2", "-Wall", "-Wextra", "-Werror", "-std=c11")


class ToolchainError(RuntimeError):
    """A compile or run step failed. `returncode` < 0 means killed by signal -returncode."""

    def __init__(self, what: str, cmd: Sequence[str], returncode: int | None = None,
                 stdout: str = "", stderr: str = "") -> None:
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        msg = f"{what}: {_describe_status(returncode)}\n  command: {shlex.join(self.cmd)}"
        if stderr.strip():
            msg += "\n  stderr:\n" + _indent(stderr.rstrip())
        super().__init__(msg)


def _describe_status(returncode: int | None) -> str:
    if returncode is None:
        return "did not complete"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-returncode} ({name})"
    return f"exit status {returncode}"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def missing_tools() -> list[str]:
    """Executables this module needs that are not on PATH (empty list: all present)."""
    return [t for t in (CLANG, GCC, QEMU, HOST_CC) if shutil.which(t) is None]


def runtime_files() -> list[Path]:
    """The runtime sources and headers every driver build may compile or include."""
    return sorted(RUNTIME_DIR.glob("*.[ch]"))


def inputs(compiler: str, *, host: bool = False, marches: Sequence[str] = ("rv64gcv",)) -> Inputs:
    """What a build through compile_c depends on besides its own sources, for cache keys: the
    compiler command line per -march with COMMON_FLAGS, the compiler's identity, and (cross
    builds) the sysroot's libc/libm, which drivers link and whose headers they include."""
    argvs = [" ".join(_compiler_argv(compiler, m, host) + list(COMMON_FLAGS)) for m in marches]
    libs = () if host else tuple(p for p in (SYSROOT / "lib" / "libc.a", SYSROOT / "lib" / "libm.a") if p.exists())
    return Inputs(libs, tuple(argvs), (_compiler_argv(compiler, "", host)[0],))


def _compiler_argv(compiler: str, march: str, host: bool) -> list[str]:
    if host:
        return [HOST_CC]
    if compiler == "clang":
        return [CLANG, "--target=riscv64-linux-gnu", "--gcc-toolchain=/usr", f"-march={march}"]
    if compiler == "gcc":
        return [GCC, f"-march={march}"]
    raise ValueError(f"unknown compiler {compiler!r} (expected 'clang' or 'gcc')")


def compile_c(sources: list[Path], out: Path, *, compiler: str = "clang", march: str = "rv64gcv",
              host: bool = False, extra_flags: Sequence[str] = (),
              include_dirs: Sequence[Path] = ()) -> Path:
    """Compile and link `sources` (C files and/or objects) into `out`; return `out`.

    If `out` ends in ".o", compile only (-c, no -lm): with -Werror, clang would otherwise
    reject the unused linker input. Use this to build an object with a different -march,
    e.g. the IME emulator, which must not be compiled with V.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    object_only = out.suffix == ".o"
    cmd = _compiler_argv(compiler, march, host) + list(COMMON_FLAGS)
    cmd += [f"-I{d}" for d in include_dirs]
    cmd += list(extra_flags)
    cmd += ["-c"] if object_only else []
    cmd += ["-o", str(out)] + [str(s) for s in sources]
    cmd += [] if object_only else ["-lm"]
    proc = _spawn(cmd, text=True)
    if proc.returncode != 0:
        raise ToolchainError("compilation failed", cmd, proc.returncode, proc.stdout, proc.stderr)
    return out


def compile_ime_emu(out: Path, *, compiler: str = "clang") -> Path:
    """Build runtime/ime_emu.c into object `out` (rv64gc: its C code must not touch V registers)."""
    return compile_c([RUNTIME_DIR / "ime_emu.c"], out, compiler=compiler, march="rv64gc")


def run(exe: Path, args: Sequence[str] = (), *, vlen: int | None = 256, host: bool = False,
        input: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `exe` (under qemu-riscv64 unless host=True) and return the completed process.

    vlen=None keeps QEMU's default VLEN. stdout/stderr are returned as bytes.
    Raises ToolchainError on non-zero exit, death by signal or timeout.
    """
    exe = str(Path(exe).resolve())  # a bare name would be looked up on PATH
    if host:
        cmd = [exe]
    else:
        cmd = [QEMU, "-L", str(SYSROOT), "-cpu", qemu_cpu(vlen), exe]
    cmd += list(args)
    try:
        proc = _spawn(cmd, input=input, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ToolchainError(f"timed out after {timeout} s", cmd, None,
                             _text(e.stdout), _text(e.stderr)) from None
    if proc.returncode != 0:
        raise ToolchainError("program failed", cmd, proc.returncode,
                             _text(proc.stdout), _text(proc.stderr))
    return proc


def _spawn(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run with output captured; a missing executable becomes a ToolchainError."""
    try:
        return subprocess.run(cmd, capture_output=True, **kwargs)
    except FileNotFoundError as e:
        missing = missing_tools()
        hint = f" (missing tools: {', '.join(missing)})" if missing else ""
        raise ToolchainError(f"cannot execute {e.filename}{hint}", cmd) from None


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode(errors="replace")
