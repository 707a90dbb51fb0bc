"""Run a spec's MLAS dispatch the way ORT's MLAS driver would (imegen/runtime/mlas_driver.c), under QEMU,
against the NumPy reference: CompFp32 against dequantize-then-matmul, CompInt8 against the
MLAS integer model."""

from __future__ import annotations

import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import cache
from .. import reference as ref
from .. import toolchain
from .mlas import COMPUTE_INT8, DispatchPlan
from ..render import render_dispatch, render_kernel
from ..verify import Case, Comparison, Result, compare

DRIVER = toolchain.RUNTIME_DIR / "mlas_driver.c"  # the MLAS-driver stand-in


@dataclass(frozen=True)
class MlasCase:
    case: Case  # A, weights (ORT layout), bias
    compute: int  # mlas.COMPUTE_FP32 | COMPUTE_INT8


def sources(d: DispatchPlan, spec_file: str) -> dict[str, str]:
    files = {}
    for plan in d.kernels:
        files.update(render_kernel(plan, spec_file))
    files.update(render_dispatch(d, spec_file))
    return files


def build_inputs(d: DispatchPlan, spec_file: str, *, compiler: str = "clang") -> tuple[dict[str, str], cache.Inputs]:
    """The generated files, and everything the driver build depends on: them, the driver stand-in,
    the runtime (emulator, its header, the bench markers), the compiler, its flags and version."""
    files = sources(d, spec_file)
    own = cache.Inputs((DRIVER, *toolchain.runtime_files()),
                       tuple(f"{name}\n{text}" for name, text in sorted(files.items())) + _flags(d))
    return files, own + toolchain.inputs(compiler, marches=("rv64gcv", "rv64gc"))


def _ime(d: DispatchPlan) -> bool:
    return any(p.target.needs_ime for p in d.kernels)


def _emulator(d: DispatchPlan) -> str:
    """The runtime/NAME.c emulator of the dispatch's IME kernels (a spec's mlas kernels share one VLEN: one board)."""
    return next(p.target.emulator for p in d.kernels if p.target.needs_ime)


def _flags(d: DispatchPlan) -> tuple[str, ...]:
    """The driver's and kernels' -D flags: with IME kernels their emulator, and for kernels that keep their calls
    on their harts (Target.mlas_hart_routing) the emulation build's rule: every hart has the unit, unless
    IMEGEN_IME_HARTS names some."""
    flags = (f'-DIMEGEN_DISPATCH_HEADER="{d.prefix}dispatch.h"',)
    if not _ime(d):
        return flags
    flags += ("-DIMEGEN_IME", f"-DIMEGEN_EMULATOR={_emulator(d)}")
    return flags + (("-DIMEGEN_IME_EMULATION",) if any(p.target.mlas_hart_routing for p in d.kernels) else ())


def build(d: DispatchPlan, spec_file: str, *, compiler: str = "clang") -> Path:
    """Kernels + dispatch + the MLAS-driver stand-in (+ the IME emulator), cached by build_inputs."""
    files, inputs = build_inputs(d, spec_file, compiler=compiler)

    def fill(work: Path) -> None:
        for name, text in files.items():
            (work / name).write_text(text)
        objs = [work / n for n in files if n.endswith(".c")] + [DRIVER]
        if _ime(d):
            objs.append(toolchain.compile_emulator(_emulator(d), work / f"{_emulator(d)}.o", compiler=compiler))
        toolchain.compile_c(objs, work / "driver", compiler=compiler, extra_flags=list(_flags(d)),
                            include_dirs=[work, toolchain.RUNTIME_DIR])

    return cache.entry(f"mlas-{d.prefix}", inputs.key(), fill) / "driver"


def encode(cases: list[MlasCase]) -> bytes:
    """The driver's input file (see imegen/runtime/mlas_driver.c)."""
    parts = [struct.pack("<Q", len(cases))]
    for mc in cases:
        c = mc.case
        M, N, K = c.shape
        parts += [struct.pack("<8Q", M, N, K, c.qw.block_size, mc.compute, c.qw.zero_points is not None, c.bias is not None,
                              c.qw.bits),
                  c.A.astype(np.float32).tobytes(), c.qw.data.tobytes(), c.qw.scales.astype(np.float32).tobytes()]
        if c.qw.zero_points is not None:
            parts.append(c.qw.zero_points.tobytes())
        if c.bias is not None:
            parts.append(c.bias.astype(np.float32).tobytes())
    return b"".join(parts)


def decode(raw: bytes, cases: list[MlasCase]) -> list[Result]:
    results, pos = [], 0
    for mc in cases:
        M, N, _ = mc.case.shape
        status, vmadots = struct.unpack_from("<iQ", raw, pos)
        C = np.frombuffer(raw, np.float32, M * N, pos + 12).reshape(M, N)
        pos += 12 + 4 * M * N
        results.append(Result(status, vmadots, C))
    return results


def run(exe: Path, cases: list[MlasCase], *, vlen: int = 256, runner=None) -> list[Result]:
    """Run the cases in one driver process; `runner(exe, args)` replaces plain QEMU (e.g. counting)."""
    with tempfile.TemporaryDirectory() as tmp:
        inp, outp = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
        inp.write_bytes(encode(cases))
        (runner or (lambda e, a: toolchain.run(e, a, vlen=vlen)))(exe, [str(inp), str(outp)])
        return decode(outp.read_bytes(), cases)


def supported(exe: Path, *, vlen: int) -> bool:
    """The dispatch's supported() on a hart of this VLEN, asked as MLAS asks it: once, with no emulator."""
    out = toolchain.run(exe, ["--supported"], vlen=vlen).stdout.decode().strip()
    if out not in ("0", "1"):
        raise toolchain.ToolchainError(f"mlas_driver --supported printed {out!r}, not 0 or 1", [str(exe)], 0, out, "")
    return out == "1"


def check(d: DispatchPlan, mc: MlasCase, result: Result, *, exact: bool = False) -> Comparison:
    """Compare one case with the reference of its compute type (the group's kernels define it)."""
    qw = mc.case.qw
    group = next((g for g in d.groups if (g.bits, g.block, g.compute) == (qw.bits, qw.block_size, mc.compute)), None)
    if group is None:
        ok = result.status == 1
        return Comparison(ok, 0.0, 0.0, "ok (no kernel: ORT falls back)" if ok else f"status {result.status}, expected 1")
    # verify.compare also checks the vmadot count against one kernel's plan; the dispatch mixes
    # kernels (gemv for M == 1), so compare numbers only and check IME use separately.
    plan = group.packer
    ime = any(getattr(group, r) is not None and getattr(group, r).target.needs_ime for r in ("gemv", "gemm"))
    if ime and mc.compute == COMPUTE_INT8 and result.vmadots == 0:
        return Comparison(False, np.inf, np.inf, "IME kernels were not executed (no vmadot)")
    return compare(plan, mc.case, result, exact=exact, check_vmadots=False)


def random_case(rng: np.random.Generator, M: int, N: int, K: int, block: int, symmetric: bool, bias: bool,
                compute: int, exact: bool = False, bits: int = 4) -> MlasCase:
    if exact:
        A, qw = ref.exact_test_data(rng, M, N, K, bits, block, symmetric)
        b = rng.integers(-100, 101, N).astype(np.float32) if bias else None
    else:
        A = rng.normal(0, 0.5, (M, K)).astype(np.float32)
        qw = ref.quantize_weights(rng.normal(0, 0.5, (K, N)).astype(np.float32), bits, block, symmetric)
        b = rng.uniform(1, 5, N).astype(np.float32) if bias else None
    return MlasCase(Case(A, qw, b), compute)
