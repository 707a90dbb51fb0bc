"""Thin wrapper around the RISC-V toolchain and QEMU user mode.

Everything that shells out to a compiler or emulator goes through here, so failures always
surface as a ToolchainError that carries the exact command and its stderr.

Where imegen runs decides the tools (`current_host()`, detected once): on any other machine it
cross-compiles with clang-19 --target=riscv64-linux-gnu / riscv64-linux-gnu-gcc against SYSROOT and
runs every program under qemu-riscv64; on a riscv64 machine it compiles with the native clang / gcc
and runs programs natively, except those the hart cannot run (a VLEN other than its own, IME on a
machine without it), which go through qemu-riscv64 if it is installed and are refused otherwise.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from . import cache
from .cache import Inputs

RUNTIME_DIR = Path(__file__).parent / "runtime"
BENCH_MARKERS = RUNTIME_DIR / "bench_markers.h"  # counting-plugin markers, included by drivers

SYSROOT = Path("/usr/riscv64-linux-gnu")
CLANG = "clang-19"
GCC = "riscv64-linux-gnu-gcc"
HOST_CC = "cc"
QEMU = "qemu-riscv64"
NATIVE_CLANG = "clang"  # on a riscv64 host: the distribution's own compilers
NATIVE_GCC = "gcc"
IME_HARTS_ENV = "IMEGEN_IME_HARTS"  # which harts execute vmadot: "0-3", "0,2", "" or "none"; overrides /proc/cpuinfo
# marchid of the K1's cores: X60 (all eight harts, as the K1's kernels report them) and A60 (the IME cores, if a kernel
# reports them apart). A K1 reporting eight X60 harts has IME on harts 0-3 (docs/ime-isa.md §1).
MARCHID_X60 = 0x8000000058000001
MARCHID_A60 = 0x8000000041000001
K1_IME_HARTS = (0, 1, 2, 3)


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


class HostError(ToolchainError):
    """This machine cannot do what was asked (e.g. run a program its hart cannot, with no QEMU): nothing ran."""

    def __init__(self, message: str, cmd: Sequence[str] = ()) -> None:
        RuntimeError.__init__(self, message + (f"\n  command: {shlex.join(cmd)}" if cmd else ""))
        self.cmd, self.returncode, self.stdout, self.stderr = list(cmd), None, "", ""


@dataclass(frozen=True)
class MatrixHarts:
    """Where this machine runs the programs of one matrix ISA (the marchid of the cores that have it)."""

    marchid: int
    isa: str = "IME"  # how messages name it (a target's title)
    harts: tuple[int, ...] = ()  # none: no hart here has it
    vlen: int | None = None  # those harts' VLEN (a K3's A100 harts have 1024, its other harts 256)
    route_file: str = ""  # written with a thread's id to make it a thread of those harts ("": pin to them)

    def prefix(self) -> list[str]:
        """The command prefix that runs a program on these harts: through the routing file where this machine
        has it (the program's own pid, then exec), else pinned with taskset."""
        if self.route_file and Path(self.route_file).exists():
            return ["sh", "-c", f'echo $$ > {self.route_file} && exec "$@"', "sh"]
        return ["taskset", "-c", hart_list(self.harts)]


@dataclass(frozen=True)
class Host:
    """The machine imegen runs on, as far as building and running riscv64 programs goes."""

    machine: str  # platform.machine()
    vlen: int | None = None  # riscv64: the hart's VLEN in bits (None: no V)
    ime_harts: tuple[int, ...] = ()  # riscv64: the harts that execute the K1's IME vmadot
    qemu: bool = False  # riscv64: qemu-riscv64 is installed, for the programs the hart cannot run
    matrix: tuple[MatrixHarts, ...] = ()  # riscv64: the harts of other matrix ISAs found here (a K3's IME2)

    @property
    def native(self) -> bool:
        """True on a riscv64 machine: native compilers, programs run natively where the hart can."""
        return self.machine == "riscv64"

    def matrix_harts(self, marchid: int) -> MatrixHarts:
        """Where the matrix ISA of the cores reporting `marchid` runs here (MARCHID_A60: the K1's IME, on
        `ime_harts` at this hart's VLEN)."""
        if marchid == MARCHID_A60:
            return MatrixHarts(marchid, "IME", self.ime_harts, self.vlen)
        found = next((m for m in self.matrix if m.marchid == marchid), None)
        return found or next((b for b in matrix_boards() if b.marchid == marchid),  # known, but no hart here
                             MatrixHarts(marchid, f"the matrix ISA of marchid {marchid:#x}"))

    def cannot_run(self, vlen: int | None, ime: bool, marchid: int = MARCHID_A60) -> str | None:
        """Why this machine cannot run natively a program needing `vlen` (None: any) and, if `ime`, the matrix ISA
        of `marchid`'s cores (None: it can)."""
        have_vlen, whose = self.vlen, "this machine's has"
        if ime:
            where = self.matrix_harts(marchid)
            if not where.harts:
                return f"the program uses {where.isa} (vmadot) and no hart of this machine has it"
            have_vlen, whose = where.vlen, f"this machine's {where.isa} harts have"
        if vlen is not None and vlen != have_vlen:
            have = f"VLEN {have_vlen}" if have_vlen else "no vector unit (V)"
            return f"the program needs a hart with VLEN {vlen} and {whose} {have}"
        return None


@functools.cache
def current_host() -> Host:
    """This machine, detected once per process (tests replace this function to simulate another)."""
    machine = platform.machine()
    if machine != "riscv64":
        return Host(machine)
    cpuinfo = _read_cpuinfo()
    override = os.environ.get(IME_HARTS_ENV)
    return Host(machine, vlen=hart_vlen(cpuinfo), ime_harts=ime_harts(cpuinfo, override),
                qemu=shutil.which(QEMU) is not None, matrix=_matrix_harts(cpuinfo, override))


def matrix_boards() -> tuple[MatrixHarts, ...]:
    """The matrix ISAs whose cores report a marchid of their own (not the K1's rule), as the targets describe
    their boards (Target.ime_harts: a K3's A100 cores for IME2), with no harts found yet."""
    from . import targets  # the targets know the boards; nothing they import reaches this module

    return tuple(MatrixHarts(t.ime_harts.marchid, t.title, route_file=t.ime_harts.route_file)
                 for t in targets.ALL if t.ime_harts is not None and t.ime_harts.marchid != MARCHID_A60)


def _matrix_harts(cpuinfo: str, override: str | None) -> tuple[MatrixHarts, ...]:
    """Each such ISA's harts here (by marchid, or the override) and their VLEN, probed on them."""
    if not isa_has_v(cpuinfo):
        return ()
    found = []
    for board in matrix_boards():
        harts = ime_harts(cpuinfo, override, board.marchid)
        if harts:
            where = replace(board, harts=harts)
            found.append(replace(where, vlen=_probe_vlen(where.prefix())))
    return tuple(found)


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def isa_has_v(cpuinfo: str) -> bool:
    """Whether /proc/cpuinfo's first `isa` line names V among its single-letter extensions (rv64imafdcv_...)."""
    m = re.search(r"^isa\s*:\s*rv\d+([a-z]*)", cpuinfo, re.M)
    return bool(m) and "v" in m.group(1)


# Reads vlenb by its CSR number (0xc22), so any assembler and any -march take it.
VLEN_PROBE = """#include <stdio.h>
int main(void) {
    unsigned long vlenb;
    __asm__ volatile("csrr %0, 0xc22" : "=r"(vlenb));
    printf("%lu\\n", vlenb * 8);
    return 0;
}
"""


def hart_vlen(cpuinfo: str) -> int | None:
    """The hart's VLEN in bits, read by a probe program (None: no V, or the probe could not run)."""
    return _probe_vlen([]) if isa_has_v(cpuinfo) else None


def _probe_vlen(prefix: list[str]) -> int | None:
    """VLEN as the probe program reads it, run behind `prefix` (e.g. pinned to some harts); None if it cannot run."""
    try:
        exe = _vlen_probe()
        out = subprocess.run([*prefix, str(exe)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError, ToolchainError):
        return None
    return int(out.stdout) if out.returncode == 0 and out.stdout.strip().isdigit() and int(out.stdout) else None


def _vlen_probe() -> Path:
    def fill(d: Path) -> None:
        (d / "probe.c").write_text(VLEN_PROBE)
        cmd = [HOST_CC, "-O2", "-o", str(d / "vlen_probe"), str(d / "probe.c")]
        proc = _spawn(cmd, text=True)
        if proc.returncode != 0:
            raise ToolchainError("compilation failed", cmd, proc.returncode, proc.stdout, proc.stderr)

    return cache.entry("vlen-probe", Inputs(strings=(VLEN_PROBE,), tools=(HOST_CC,)).key(), fill) / "vlen_probe"


CPU_SETSIZE = 1024  # glibc's cpu_set_t: the harts runtime/harts.h can name


def parse_harts(text: str) -> tuple[int, ...]:
    """A hart list ("0-3", "0,2", "0-1,6"; "" or "none": none) -> the hart numbers; a malformed one is a
    HostError. Exactly what the custom-op library and the emulator accept (runtime/harts.h; tests/test_serving.py
    runs both on the same lists): no spaces, no empty items, harts below CPU_SETSIZE."""
    if text in ("", "none"):
        return ()
    harts: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        low = int(m.group(1)) if m else 0
        high = int(m.group(2) or low) if m else -1
        if not m or high < low or high >= CPU_SETSIZE:
            raise HostError(f"{IME_HARTS_ENV}={text!r}: expected hart numbers and ranges below {CPU_SETSIZE} such as "
                            "0-3 or 0,2, or none")
        harts.update(range(low, high + 1))
    return tuple(sorted(harts))


def ime_harts(cpuinfo: str, override: str | None = None, marchid: int = MARCHID_A60) -> tuple[int, ...]:
    """The harts that execute vmadot: IMEGEN_IME_HARTS if set, else from /proc/cpuinfo's marchid per hart
    (harts reporting `marchid`; for the K1's A60, also harts 0-3 of a K1 reporting eight X60 harts), as
    runtime/harts.h reads it. QEMU reports no marchid: none."""
    if override is not None:
        return parse_harts(override)
    marchids = {}
    for block in re.split(r"\n\s*\n", cpuinfo):
        hart = re.search(r"^processor\s*:\s*(\d+)", block, re.M)
        arch = re.search(r"^marchid\s*:\s*(0x[0-9a-fA-F]+)", block, re.M)
        if hart and arch:
            marchids[int(hart.group(1))] = int(arch.group(1), 16)
    named = tuple(sorted(h for h, a in marchids.items() if a == marchid))
    if named:
        return named
    if marchid == MARCHID_A60 and sorted(marchids) == list(range(8)) and set(marchids.values()) == {MARCHID_X60}:
        return K1_IME_HARTS
    return ()


def hart_list(harts: Sequence[int]) -> str:
    """(0, 1, 2, 3, 6) -> "0-3,6" (taskset's and IMEGEN_IME_HARTS's syntax)."""
    runs: list[list[int]] = []
    for h in sorted(harts):
        if runs and h == runs[-1][1] + 1:
            runs[-1][1] = h
        else:
            runs.append([h, h])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def missing_tools() -> list[str]:
    """Executables this module needs that are not on PATH (empty list: all present). On a riscv64
    host QEMU is optional: only programs the hart cannot run need it."""
    tools = (NATIVE_CLANG, NATIVE_GCC, HOST_CC) if current_host().native else (CLANG, GCC, QEMU, HOST_CC)
    return [t for t in tools if shutil.which(t) is None]


def runtime_files() -> list[Path]:
    """The runtime sources and headers every driver build may compile or include."""
    return sorted(RUNTIME_DIR.glob("*.[ch]"))


def inputs(compiler: str, *, host: bool = False, marches: Sequence[str] = ("rv64gcv",)) -> Inputs:
    """What a build through compile_c depends on besides its own sources, for cache keys: the
    compiler command line per -march with COMMON_FLAGS, the compiler's identity, and (cross
    builds) the sysroot's libc/libm, which drivers link and whose headers they include."""
    argvs = [" ".join(_compiler_argv(compiler, m, host) + list(COMMON_FLAGS)) for m in marches]
    cross = not host and not current_host().native  # a riscv64 host builds against its own libc, not SYSROOT's
    libs = tuple(p for p in (SYSROOT / "lib" / "libc.a", SYSROOT / "lib" / "libm.a") if p.exists()) if cross else ()
    return Inputs(libs, tuple(argvs), (_compiler_argv(compiler, "", host)[0],))


def compiler_tool(compiler: str = "clang") -> str:
    """The executable `compiler` ("clang" or "gcc") names on this machine (for cache keys)."""
    return _compiler_argv(compiler, "", False)[0]


def _compiler_argv(compiler: str, march: str, host: bool) -> list[str]:
    if host:
        return [HOST_CC]
    native = current_host().native
    if compiler == "clang":
        return [NATIVE_CLANG, f"-march={march}"] if native else [
            CLANG, "--target=riscv64-linux-gnu", "--gcc-toolchain=/usr", f"-march={march}"]
    if compiler == "gcc":
        return [NATIVE_GCC if native else GCC, f"-march={march}"]
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
    return compile_emulator("ime_emu", out, compiler=compiler)


def compile_emulator(name: str, out: Path, *, compiler: str = "clang") -> Path:
    """Build the trap-and-emulate runtime runtime/NAME.c (a Target's `emulator`: ime_emu for the K1's IME,
    ime2_emu for the K3's IME2) into object `out`, -march=rv64gc: its C code must not touch the V registers
    it emulates on."""
    return compile_c([RUNTIME_DIR / f"{name}.c"], out, compiler=compiler, march="rv64gc")


def _on_named_ime_harts(ime: bool) -> list[str]:
    """Under QEMU the IME emulator gives every hart IME, or only those IMEGEN_IME_HARTS names: a program that
    executes vmadot then runs pinned to them, as a K1 runs it on its IME cores (taskset's prefix, or none)."""
    named = os.environ.get(IME_HARTS_ENV)
    if not ime or named is None:
        return []
    harts = parse_harts(named)
    if not harts:
        raise HostError(f"not run: {IME_HARTS_ENV}={named!r} names no hart with IME, and this program executes vmadot")
    return ["taskset", "-c", hart_list(harts)]


def launch(exe: str, *, vlen: int | None = 256, ime: bool = False, host: bool = False,
           marchid: int = MARCHID_A60) -> list[str]:
    """The command that runs riscv64 program `exe` on a hart of `vlen` (None: any; under QEMU its default)
    that has, if `ime`, the matrix ISA of the cores reporting `marchid` (the K1's IME by default; a target's
    Target.ime_harts.marchid for another): qemu-riscv64 on another machine; on a riscv64 one, the program itself where a hart can run
    it (matrix programs pinned or routed to those harts), else qemu-riscv64, else a HostError saying why.
    host=True: `exe` was built for this machine."""
    if host:
        return [exe]
    here = current_host()
    if not here.native:
        return _on_named_ime_harts(ime) + [QEMU, "-L", str(SYSROOT), "-cpu", qemu_cpu(vlen), exe]
    why = here.cannot_run(vlen, ime, marchid)
    if why is None:
        return (here.matrix_harts(marchid).prefix() if ime else []) + [exe]
    if here.qemu:  # built against this machine's own libc: no -L
        return [QEMU, "-cpu", qemu_cpu(vlen), exe]
    raise HostError(f"not run on this machine: {why}, and {QEMU} is not installed to emulate such a hart "
                    f"(install qemu-user)", [exe])


def run(exe: Path, args: Sequence[str] = (), *, vlen: int | None = 256, ime: bool = False, host: bool = False,
        marchid: int = MARCHID_A60, input: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `exe` (see launch: under qemu-riscv64, natively on a riscv64 hart that can, or natively if
    host=True) and return the completed process.

    vlen=None keeps QEMU's default VLEN. ime=True: the program executes vmadot, of the matrix ISA of the cores
    reporting `marchid` (matters on riscv64 hosts).
    stdout/stderr are returned as bytes. Raises ToolchainError on non-zero exit, death by signal or timeout,
    and HostError (nothing ran) where this machine cannot run it.
    """
    exe = str(Path(exe).resolve())  # a bare name would be looked up on PATH
    cmd = launch(exe, vlen=vlen, ime=ime, host=host, marchid=marchid) + list(args)
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
