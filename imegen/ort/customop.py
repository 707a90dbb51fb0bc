"""imegen kernels inside stock ONNX Runtime: the custom-op library and which nodes it serves.

`build_library(specs)` generates each imegen-ABI kernel, the kernel table
(templates/customop_kernels.c.j2) and links them with imegen/ort/customop_lib.c (the ORT glue)
into a riscv64 shared library exporting `RegisterCustomOps`. It is built against ORT 1.21's
onnxruntime_c_api.h (API version 21), which ORT 1.21 and later accept. Flavours: "hardware"
(what a K1 loads) and "qemu" (links the SIGILL IME emulator, imegen/runtime/ime_emu.c; never for
hardware). `serving_kernels` is the rule the library applies at session creation, in Python, so
`imegen ort-rewrite` moves exactly the nodes the library will accept.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .. import toolchain
from ..ir import KernelSpec
from ..plan import KernelPlan, plan_kernel
from ..render import _env, march_for, render_kernel
from ..verify import CACHE, cached_dir
from . import sysroot

DOMAIN = "ai.imegen"
LIB_SOURCES = (Path(__file__).parent / "customop_lib.c", Path(__file__).parent / "customop_lib.h")
FLAVOURS = ("hardware", "qemu")
HEADER_VERSION = "1.21"  # the oldest supported ORT: its C API header serves it and every newer ORT
COMPUTE_FOR_LEVEL = {0: "fp32", 1: "fp32", 4: "int8"}


class CustomOpError(ValueError):
    pass


def library_plans(specs: list[KernelSpec]) -> list[KernelPlan]:
    """The kernels a library can hold: imegen-ABI ones (abi = mlas kernels plug into MLAS instead)."""
    plans = [plan_kernel(s) for s in specs if s.abi == "imegen"]
    if not plans:
        raise CustomOpError("the spec has no abi = imegen kernel for the custom-op library")
    return plans


@dataclass(frozen=True)
class NodeNeeds:
    """What a MatMulNBits node asks of a kernel."""

    bits: int
    block: int
    accuracy_level: int
    asymmetric: bool
    bias: bool
    g_idx: bool = False
    zero_points_uint8: bool = True


def serving_kernels(specs: list[KernelSpec], need: NodeNeeds) -> tuple[list[str], str]:
    """(kernel names serving the node: gemv first, then gemm; or [] with the reason)."""
    if need.g_idx:
        return [], "g_idx (act-order) is not supported"
    if not need.zero_points_uint8:
        return [], "float zero points are not supported (imegen takes ORT's packed uint8 ones)"
    compute = COMPUTE_FOR_LEVEL.get(need.accuracy_level)
    if compute is None:
        return [], f"accuracy_level {need.accuracy_level} (imegen serves 0/1: fp32 compute, 4: int8)"
    found = {}
    for s in specs:
        if (s.abi == "imegen" and s.bits == need.bits and s.block == need.block and s.compute == compute
                and (s.zero_point == "asymmetric") == need.asymmetric and s.bias == need.bias):
            found.setdefault(s.op, s.name)  # the library takes the first of each op, as here
    if not found:
        return [], (f"no kernel serves bits {need.bits}, block {need.block}, {compute} compute, "
                    f"{'asymmetric' if need.asymmetric else 'symmetric'} zero points, "
                    f"{'with' if need.bias else 'no'} bias")
    return [found[op] for op in ("gemv", "gemm") if op in found], ""


def render_library(plans: list[KernelPlan], spec_file: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for plan in plans:
        files.update(render_kernel(plan, spec_file))
    files["customop_kernels.c"] = _env().get_template("customop_kernels.c.j2").render(
        plans=plans, spec_file=spec_file, domain=DOMAIN)
    return files


def build_library(specs: list[KernelSpec], spec_file: str = "<spec>", *, flavour: str = "qemu") -> Path:
    """Build (cached by every input) the custom-op shared library; returns its path."""
    if flavour not in FLAVOURS:
        raise CustomOpError(f"unknown library flavour {flavour!r} (expected {' or '.join(FLAVOURS)})")
    plans = library_plans(specs)
    files = render_library(plans, Path(spec_file).name)
    include = sysroot.include_dir(sysroot.ensure(HEADER_VERSION))
    emulate = flavour == "qemu" and any(p.spec.target == "ime" for p in plans)
    inputs = [sorted(files.items()), flavour, [p.read_text() for p in LIB_SOURCES], Path(__file__).read_text(),
              (include / "onnxruntime_c_api.h").read_text(), (toolchain.RUNTIME_DIR / "ime_emu.c").read_text(),
              toolchain.COMMON_FLAGS]  # this file: the build recipe
    key = hashlib.sha256(repr(inputs).encode()).hexdigest()[:16]
    name = f"libimegen_ort{'_qemu' if flavour == 'qemu' else ''}.so"

    def fill(d: Path) -> None:
        for fname, text in files.items():
            (d / fname).write_text(text)
        incs = [d, LIB_SOURCES[0].parent, include, toolchain.RUNTIME_DIR]
        pic = ["-fPIC"]
        objs = [toolchain.compile_c([d / f"{p.name}.c"], d / f"{p.name}.o", march=march_for(p), extra_flags=pic,
                                    include_dirs=incs) for p in plans]
        objs.append(toolchain.compile_c([d / "customop_kernels.c"], d / "customop_kernels.o", march="rv64gc",
                                        extra_flags=pic, include_dirs=incs))
        glue = pic + (["-DIMEGEN_IME_EMULATION"] if emulate else []) + [f'-DIMEGEN_DOMAIN="{DOMAIN}"']
        objs.append(toolchain.compile_c([LIB_SOURCES[0]], d / "customop_lib.o", march="rv64gc", extra_flags=glue,
                                        include_dirs=incs))
        if emulate:  # rv64gc: the emulator's own C code must not touch the V registers it emulates on
            objs.append(toolchain.compile_c([toolchain.RUNTIME_DIR / "ime_emu.c"], d / "ime_emu.o", march="rv64gc",
                                            extra_flags=pic, include_dirs=incs))
        # Export only the ORT entry point and the counters: kernel symbols must not clash with the host's.
        (d / "exports.map").write_text("{ global: RegisterCustomOps; imegen_ort_stats; local: *; };\n")
        toolchain.compile_c(objs, d / name, march="rv64gcv",
                            extra_flags=["-shared", "-Wl,-z,defs", f"-Wl,--version-script={d / 'exports.map'}"])

    return cached_dir(CACHE / f"ort-customop-{flavour}-{key}", fill) / name


def parse_stats(text: str) -> dict[str, int]:
    """imegen_ort_stats() text -> {kernel name: calls, ..., "vmadots": n (qemu flavour with IME)}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "calls":
            out[parts[0]] = int(parts[2])
        elif len(parts) == 2 and parts[0] == "vmadots":
            out["vmadots"] = int(parts[1])
    return out
