"""What ORT's calling convention costs: a spec's CompInt8 MLAS-ABI kernels, driven like
MlasQNBitGemmBatch, next to the imegen-ABI kernel of the same configuration, in retired
instructions under QEMU (`imegen bench --mlas SPEC`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import cache, targets, toolchain
from ...abi import mlas_check
from ...abi.mlas import COMPUTE_INT8, DispatchPlan, Group
from ...plan import KernelPlan, expected_vmadots, plan_kernel
from . import image, measure
from .plugin import run_counted

METHOD = (
    "MLAS path: the spec's dispatch, kernels and the IME emulator linked statically with the MLAS-driver "
    "stand-in (imegen/runtime/mlas_driver.c: ORT's pack calls, two thread ranges split at a multiple of 16, "
    "128-column chunks, the 4-bit row loop / 8-bit 128-row ranges); counted under qemu-riscv64 with the "
    "TCG plugin: only the kernel objects' code (and libc it calls) between the driver's markers, A "
    "quantization (QuantizeARow*) and the GEMM calls; dispatch routing, packing and the driver excluded. "
    "Its output is checked against the NumPy reference. imegen path: the same kernel configuration "
    "with abi = imegen (its own packed B with inline scales, asymmetric), through `imegen bench`'s "
    "driver: prepare_a and the tile loop. Full shapes are run, no extrapolation; QEMU VLEN = 256; "
    "clang-19 -O2."
)
SHAPES = ((1, 896, 896), (16, 896, 896))  # Qwen2.5-0.5B q/o projection: decode, a 16-token prefill


@dataclass(frozen=True)
class Row:
    kernel: str
    bits: int
    shape: tuple[int, int, int]
    vmadots: int
    mlas_quant: int  # instructions: QuantizeARow* over all rows
    mlas_gemm: int  # ... the GEMM calls
    mlas_scalar: int  # of mlas_gemm: scalar (int, mem, branch, fp, div)
    own_prep: int  # imegen ABI: prepare_a
    own_tiles: int  # ... the tile loop (matmul minus prepare_a)


def _total(counts: dict[str, int], tag: str = "kernel", classes=None) -> int:
    return sum(v for k, v in counts.items()
               if k.count(".") == 1 and k.split(".")[0] in (tag, "callee") and (classes is None or k.split(".")[1] in classes))


def build_inputs(d: DispatchPlan, spec_file: str) -> tuple[dict[str, str], cache.Inputs]:
    """mlas_check's driver inputs, built statically with the IME define for counting."""
    files, inputs = mlas_check.build_inputs(d, spec_file)
    return files, inputs + cache.Inputs(strings=("counts: -static -DIMEGEN_IME",))


def build(d: DispatchPlan, spec_file: str) -> tuple:
    """Static MLAS driver with a link map; returns (exe, ranges, begin, end)."""
    files, inputs = build_inputs(d, spec_file)
    kernel_names = [f"{p.name}.o" for p in d.kernels]

    def fill(work: Path) -> None:
        for name, text in files.items():
            (work / name).write_text(text)
        kernel_objs = [toolchain.compile_c([work / f"{p.name}.c"], work / obj, include_dirs=[work])
                       for p, obj in zip(d.kernels, kernel_names)]
        flags = [f'-DIMEGEN_DISPATCH_HEADER="{d.prefix}dispatch.h"', "-DIMEGEN_IME"]
        rest = [toolchain.compile_c([work / f"{d.prefix}dispatch.c"], work / "dispatch.o", include_dirs=[work]),
                toolchain.compile_c([mlas_check.DRIVER], work / "mlas_driver.o", extra_flags=flags,
                                    include_dirs=[work, toolchain.RUNTIME_DIR]),
                toolchain.compile_ime_emu(work / "ime_emu.o")]
        toolchain.compile_c(kernel_objs + rest, work / "driver", extra_flags=["-static", f"-Wl,-Map={work / 'driver.map'}"])
        objects = {str(o): "kernel" for o in kernel_objs}
        objects.update({str(work / n): "excluded" for n in ("dispatch.o", "mlas_driver.o", "ime_emu.o")})
        image.save_ranges(work, image.code_ranges_from_map((work / "driver.map").read_text(), objects))

    work = cache.entry(f"mlas-counts-{d.prefix}", inputs.key(), fill)
    exe, ranges = work / "driver", image.load_ranges(work)
    ranges += [(lo, hi, "image") for lo, hi in image.exec_segments(exe)]
    syms = image.symbols(exe)
    return exe, ranges, syms["imegen_bench_begin"][0], syms["imegen_bench_end"][0]


def _twin(plan: KernelPlan) -> KernelPlan:
    """The same configuration with imegen's own ABI."""
    return plan_kernel(dataclasses.replace(plan.spec, abi="imegen", scales="inline", zero_point="asymmetric",
                                           name=f"{plan.name}_own"))


def count_group(d: DispatchPlan, g: Group, spec_file: str, shapes=SHAPES, seed: int = 0) -> list[Row]:
    exe, ranges, begin, end = build(d, spec_file)
    rng = np.random.default_rng(seed)
    rows = []
    for M, N, K in shapes:
        plan = g.gemv if (M == 1 and g.gemv) else (g.gemm or g.gemv)
        case = mlas_check.random_case(rng, M, N, K, g.block, False, False, COMPUTE_INT8, bits=g.bits)
        box = {}

        def counted(e, args):
            box["run"] = run_counted(e, args, ranges, begin=begin, end=end, vlen=measure.VLEN,
                                     beat_bytes=measure.BEAT_BYTES)

        [res] = mlas_check.run(exe, [case], runner=counted)
        verdict = mlas_check.check(d, case, res)
        if not verdict.ok:
            raise toolchain.ToolchainError(f"{plan.name} {M}x{N}x{K} through the MLAS driver: {verdict.message}", [str(exe)])
        quant, gemm = (r.values for r in box["run"].regions)
        twin = _twin(plan)
        [own] = measure.run_cases(measure.build_bench(twin), [(M, N, K)])
        want = expected_vmadots(plan, M, N, K)
        if gemm["kernel.vmadot"] != want:
            raise toolchain.ToolchainError(f"{plan.name}: counted {gemm['kernel.vmadot']} vmadot, the plan expects {want}", [])
        rows.append(Row(plan.name, g.bits, (M, N, K), want, _total(quant), _total(gemm),
                        _total(gemm, classes=("int", "mem", "branch", "fp", "div")),
                        _total(own.prep), _total(own.matmul) - _total(own.prep)))
    return rows


def run(d: DispatchPlan, spec_file: str, log=None) -> list[Row]:
    rows = []
    for g in d.groups:
        if g.compute == COMPUTE_INT8 and any(targets.of(p.spec).needs_ime for p in (g.gemv, g.gemm) if p):  # vmadot kernels
            if log:
                log(f"counting {'+'.join(p.name for p in (g.gemv, g.gemm) if p)} ({g.bits}-bit, block {g.block})")
            rows += count_group(d, g, spec_file)
    return rows


def report(rows: list[Row]) -> str:
    head = ("kernel", "bits", "M,N,K", "vmadot", "MLAS quantize A", "MLAS GEMM", "of it scalar", "imegen prepare_a",
            "imegen tiles", "GEMM / tiles")
    body = [(r.kernel, str(r.bits), ",".join(map(str, r.shape)), str(r.vmadots), str(r.mlas_quant), str(r.mlas_gemm),
             str(r.mlas_scalar), str(r.own_prep), str(r.own_tiles), f"{r.mlas_gemm / r.own_tiles:.2f}") for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["METHOD: " + METHOD, "", "Retired instructions per call (whole shape):", ""]
    lines += ["  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head, tuple("-" * w for w in widths), *body]]
    return "\n".join(lines)
