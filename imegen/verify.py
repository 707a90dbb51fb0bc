"""Stage 6: build a kernel's test driver, run cases (natively or under QEMU), compare to NumPy.

The oracle is imegen.reference, which knows nothing of the generator: fp32-compute kernels are
held to a forward-error bound of the dequantize-then-matmul definition, int8-compute kernels to
the exact integer model of MLAS CompInt8 plus the rounding of their fp32 block folding.
"""

from __future__ import annotations

import struct
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import cache
from . import reference as ref
from . import targets, toolchain
from .plan import KernelPlan, expected_vmadots
from .render import render_driver, render_kernel

EPS32 = 2.0**-24


@dataclass(frozen=True)
class Case:
    A: np.ndarray  # float32 [M, K]
    qw: ref.QuantizedWeights
    bias: np.ndarray | None = None  # float32 [N]
    lda_pad: int = 0  # extra floats per A row / C row: catches stride bugs
    ldc_pad: int = 0
    slices: int = 1  # > 1: B's columns in this many slices, each packed alone, run by matmul_prepared on one prepared A

    def slice_widths(self) -> list[int]:
        """Columns of each slice (the driver's cut: ceil(N / slices) each, the last the rest)."""
        N = self.qw.N
        w = -(-N // self.slices)
        return [min(w, N - n0) for n0 in range(0, N, w)]

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.A.shape[0], self.qw.N, self.qw.K


@dataclass(frozen=True)
class Result:
    status: int
    vmadots: int
    C: np.ndarray
    workspace_touched: int = 0  # workspace bytes the call wrote (changed from the driver's 0xa5 poison)
    # False where a real IME hart executed the vmadots: the emulator counts only those it traps
    vmadots_counted: bool = True


@dataclass(frozen=True)
class Build:
    plan: KernelPlan
    exe: Path
    host: bool
    compiler: str


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs: float
    max_rel: float
    message: str


def compilers_for(plan: KernelPlan) -> list[str]:
    """Compilers that can build this target (GCC 12 lacks RVV intrinsics, so rvv is clang only)."""
    return list(plan.target.compilers)


def build_inputs(plan: KernelPlan, spec_file: str = "<spec>", *, compiler: str = "clang",
                 host: bool = False) -> tuple[dict[str, str], cache.Inputs]:
    """The files build() writes, and everything its cache entry depends on: those sources, the
    runtime (emulator, its header, the bench markers), the compiler, its flags and version. The
    target is in the sources; VLEN is a run-time setting (QEMU's -cpu), not a build input."""
    sources = render_kernel(plan, spec_file)
    sources["driver.c"] = render_driver(plan, spec_file)
    own = cache.Inputs(tuple(toolchain.runtime_files()),
                       tuple(f"{name}\n{text}" for name, text in sorted(sources.items())) + (f"host={host}",))
    return sources, own + toolchain.inputs(compiler, host=host, marches=("rv64gcv", "rv64gc"))


def build(plan: KernelPlan, spec_file: str = "<spec>", *, compiler: str = "clang", host: bool = False) -> Build:
    """Generate kernel + driver and compile them (cached by build_inputs)."""
    if host and not plan.target.host_build:
        native = " or ".join(t.name for t in targets.ALL if t.host_build)
        raise ValueError(f"only target {native} builds for the host, not {plan.spec.target}")
    sources, inputs = build_inputs(plan, spec_file, compiler=compiler, host=host)

    def fill(d: Path) -> None:
        for name, text in sources.items():
            (d / name).write_text(text)
        objs: list[Path] = [d / f"{plan.name}.c", d / "driver.c"]
        emulator = plan.target.emulator
        if emulator:  # the target's matrix instructions trap under QEMU: its emulator runs them
            objs.append(toolchain.compile_emulator(emulator, d / f"{emulator}.o", compiler=compiler))
        toolchain.compile_c(objs, d / "driver", compiler=compiler, host=host, include_dirs=[d, toolchain.RUNTIME_DIR])

    d = cache.entry(plan.name, inputs.key(), fill)
    return Build(plan, d / "driver", host, compiler)


def _encode(plan: KernelPlan, cases: list[Case]) -> bytes:
    s = plan.spec
    parts = [struct.pack("<Q", len(cases))]
    for c in cases:
        M, N, K = c.shape
        lda, ldc = K + c.lda_pad, N + c.ldc_pad
        if (c.qw.bits, c.qw.block_size) != (s.bits, s.block):
            raise ValueError(f"case weights are {c.qw.bits}-bit block {c.qw.block_size}, kernel wants {s.bits}-bit block {s.block}")
        if (c.qw.zero_points is None) != (s.zero_point == "symmetric"):
            raise ValueError(f"case zero points do not match the kernel's zero_point = {s.zero_point}")
        if (c.bias is None) == s.bias:
            raise ValueError(f"case bias does not match the kernel's bias = {'yes' if s.bias else 'no'}")
        A = np.zeros((M, lda), np.float32)
        A[:, :K] = c.A
        parts += [struct.pack("<6Q", M, N, K, lda, ldc, c.slices), A.tobytes(), c.qw.data.tobytes(), c.qw.scales.astype(np.float32).tobytes()]
        if c.qw.zero_points is not None:
            parts.append(c.qw.zero_points.tobytes())
        if c.bias is not None:
            parts.append(c.bias.astype(np.float32).tobytes())
    return b"".join(parts)


def run_cases(b: Build, cases: list[Case], *, vlen: int | None = 256) -> list[Result]:
    """Run all cases in one process (QEMU start-up is the slow part)."""
    with tempfile.TemporaryDirectory() as tmp:
        inp, outp = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
        inp.write_bytes(_encode(b.plan, cases))
        ime = b.plan.target.needs_ime
        marchid = b.plan.target.ime_harts.marchid if ime else toolchain.MARCHID_A60  # whose cores have its vmadot
        toolchain.run(b.exe, [str(inp), str(outp)], vlen=vlen, host=b.host, ime=ime, marchid=marchid)
        raw = outp.read_bytes()
    # On a riscv64 machine with IME the program runs natively and no vmadot traps: nothing counts them.
    counted = not ime or toolchain.QEMU in toolchain.launch(str(b.exe), vlen=vlen, ime=True, host=b.host,
                                                            marchid=marchid)
    results, pos = [], 0
    for c in cases:
        M, N, _ = c.shape
        status, vmadots, touched = struct.unpack_from("<iQQ", raw, pos)
        pos += 20
        C = np.frombuffer(raw, np.float32, M * N, pos).reshape(M, N)
        pos += 4 * M * N
        results.append(Result(status, vmadots, C, touched, counted))
    return results


def oracle(plan: KernelPlan, case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Reference output (float64) and a per-element error bound for this kernel's compute type."""
    bias_mag = np.abs(case.bias).astype(np.float64) if case.bias is not None else 0.0
    if plan.spec.scale_type == "fp16":  # the kernel computes with its packed, fp16-rounded scales
        half = np.clip(case.qw.scales, -65504, 65504).astype(np.float16)  # the packer saturates, rounds to even
        half = plan.target.packed_scales(plan.spec, half, case.slice_widths())
        case = replace(case, qw=replace(case.qw, scales=half.astype(np.float32)))
    if plan.spec.compute == "fp32":
        Y = ref.matmul_nbits(case.A, case.qw, case.bias)
        W = ref.dequantize(case.qw)
        bound = ref.forward_error_bound(case.A, W, case.qw.K) + 2 * EPS32 * (np.abs(Y) + bias_mag)
        return Y, bound
    a16 = plan.spec.a_scale_type
    Y, acc = ref.matmul_nbits_int8(case.A, case.qw, case.bias, a16)
    if plan.spec.hp_blocks:
        return Y, hp_bound(case, plan.spec.hp_blocks) + 2 * EPS32 * (np.abs(Y) + bias_mag)
    _, a_scale = ref.quantize_a_int8(case.A, case.qw.block_size, a16)
    # Each block adds float(dot) * (a_scale * b_scale): dot is exact (< 2^24), the two products and
    # the sum round, so the fold of kb terms is within (kb + 3) * eps * sum |term|.
    mag, adds = np.abs(acc), case.qw.k_blocks
    if plan.blksum:  # per block float(sum qa (q - 128)) * sa * sb + (sa sum qa) * (sb (128 - zp)): two terms, each rounded
        qa, _ = ref.quantize_a_int8(case.A, case.qw.block_size, a16)
        qsum = qa.astype(np.int64).reshape(qa.shape[0], case.qw.k_blocks, -1).sum(axis=2)  # [M, kb]
        shift = (128 - ref.unpack_codes(case.qw)[1]).T.astype(np.int64)  # [N, kb]
        mag = np.abs(acc - shift[None] * qsum[:, None, :]) + np.abs(shift)[None] * np.abs(qsum)[:, None, :]
        adds = 2 * case.qw.k_blocks + 2
    terms = mag * np.abs(a_scale)[:, None, :] * np.abs(case.qw.scales.astype(np.float64))[None, :, :]
    bound = (adds + 3) * EPS32 * terms.sum(axis=2) + 2 * EPS32 * (np.abs(Y) + bias_mag)
    return Y, bound


FP16_U = 2.0 ** -11  # FP16's unit roundoff (round to nearest)
FP16_SUBNORMAL_HALF_ULP = 2.0 ** -25  # the most a rounding into FP16's subnormal range can move a value


def hp_bound(case: Case, S: int) -> np.ndarray:
    """How far a `.hp` gemv's result (docs/ime2-isa.md §10.8: A's codes c split into rows hi = c >> 4,
    lp = (c & 15) - 8 and ones, B signed w = q - 8, per block and column FP16 s = fp16(fp16(sa / F) fp16(d / D)),
    three FP16 sums of fp16(t_r s) over super-blocks of S blocks, added into fp32, combined 16 r0 + r1 + 8 r2 and
    multiplied by F D) may lie from the CompInt8 result, per element, from FP16's error model alone (not the
    kernel's order of operations): each of the four roundings up to a product (sa / F, d / D, s, t s: the dots t
    are exact, |t| <= 2048) and the S - 1 sums of a super-block moves a term by at most u of it, plus, where a
    value falls below FP16's normal range, 2^-25 absolute (three times per product, once per sum), in units of
    F D <= 2 max sa x 2 max |d|; and the fp32 steps after."""
    qw, kb, bs = case.qw, case.qw.k_blocks, case.qw.block_size
    qa, a_scale = ref.quantize_a_int8(case.A, bs)
    M, N = qa.shape[0], qw.N
    q, _ = ref.unpack_codes(qw)
    w = np.zeros((kb * bs, N), np.int64)
    w[: qw.K] = q
    w = (w - 8).reshape(kb, bs, N)  # padding k: code 0 -> -8, against A codes of 0
    a = qa.astype(np.int64).reshape(M, kb, bs)
    rows = {16: a >> 4, 1: (a & 15) - 8, 8: np.ones_like(a)}
    mag = np.zeros((M, N, kb))
    small = np.zeros((M, N, kb))
    for coef, r in rows.items():
        t = np.abs(np.einsum("mbk,bkn->mnb", r, w))
        mag += coef * t
        small += coef * (3 * t + 1)
    scales = np.abs(qw.scales.astype(np.float64))  # [N, kb], as packed (fp16)
    sigma = np.abs(a_scale.astype(np.float64))[:, None, :] * scales[None, :, :]
    terms = (mag * sigma).sum(axis=2)
    top_a = np.abs(a_scale.astype(np.float64)).max(axis=1)
    F = np.where(top_a >= 2.0 ** -126, 2 * top_a, 1.0)  # >= the kernel's row factor
    top_b = scales.max(initial=0.0)
    D = 2 * top_b if top_b > 0 else 1.0
    absolute = F[:, None] * D * FP16_SUBNORMAL_HALF_ULP * small.sum(axis=2)
    return (S + 3) * FP16_U * 1.01 * terms + absolute + (kb + 8) * EPS32 * terms


def compare(plan: KernelPlan, case: Case, result: Result, *, exact: bool = False, check_vmadots: bool = True) -> Comparison:
    M, N, K = case.shape
    if result.status != 0:
        return Comparison(False, np.inf, np.inf, f"kernel returned status {result.status}")
    want_vmadots = sum(expected_vmadots(plan, M, n, K) for n in case.slice_widths())
    if check_vmadots and result.vmadots_counted and result.vmadots != want_vmadots:
        return Comparison(False, np.inf, np.inf, f"executed {result.vmadots} vmadot, expected {want_vmadots}")
    Y, bound = oracle(plan, case)
    err = np.abs(result.C.astype(np.float64) - Y)
    max_abs = float(err.max(initial=0.0))
    max_rel = float((err / np.maximum(np.abs(Y), 1e-30)).max(initial=0.0))
    limit = np.zeros_like(bound) if exact else bound
    bad = ~(err <= limit)  # also catches NaN
    if bad.any():
        m, n = np.argwhere(bad)[0]
        what = "exact" if exact else f"bound {limit[m, n]:.3g}"
        return Comparison(False, max_abs, max_rel,
                          f"C[{m},{n}] = {result.C[m, n]!r}, reference {Y[m, n]!r} ({what}); {int(bad.sum())} of {M * N} elements off")
    return Comparison(True, max_abs, max_rel, "ok")
