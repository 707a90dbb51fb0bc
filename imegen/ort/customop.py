"""imegen kernels inside stock ONNX Runtime: the custom-op library and which nodes it serves.

`build_library(specs)` generates each imegen-ABI kernel, the kernel table
(templates/customop_kernels.c.j2) and links them with imegen/ort/customop_lib.c (the ORT glue)
into a riscv64 shared library exporting `RegisterCustomOps`. By default it is built against ORT 1.21's
onnxruntime_c_api.h (API version 21), which ORT 1.21 and later accept; `ort_include` names another ORT's
headers (1.21 or newer), and a riscv64 machine's own are preferred (ort_include_dir). Flavours: "hardware"
(what the board loads) and "qemu" (links the IME target's SIGILL emulator, imegen/runtime/ime_emu.c or
ime2_emu.c; never for hardware). A library serves one board: its IME kernels share one target, whose ImeHarts
tell the glue which harts run them and how a thread gets there. `serving_kernels` is the rule the library applies at session creation, in Python, so
`imegen ort-rewrite` moves exactly the nodes the library will accept.
"""

from __future__ import annotations

import re
from pathlib import Path

from .. import targets, toolchain
from ..ir import KernelSpec
from ..plan import KernelPlan, plan_kernel
from ..render import env, march_for, render_attention, render_kernel
from .. import cache
from . import sysroot
from .serving import NodeNeeds, serve, serving_kernels  # noqa: F401 (the library's rule, re-exported)

DOMAIN = "ai.imegen"
LIB_SOURCES = (Path(__file__).parent / "customop_lib.c", Path(__file__).parent / "customop_lib.h",
               Path(__file__).parent / "decoder_ops.c", Path(__file__).parent / "decoder_ops.h",
               Path(__file__).parent / "ort_glue.h")
FLAVOURS = ("hardware", "qemu")
HEADER_VERSION = "1.21"  # the oldest supported ORT: its C API header serves it and every newer ORT


class CustomOpError(ValueError):
    pass


def library_plans(specs: list[KernelSpec]) -> list[KernelPlan]:
    """The kernels a library can hold: imegen-ABI ones (abi = mlas kernels plug into MLAS instead)."""
    plans = [plan_kernel(s) for s in specs if s.abi == "imegen"]
    if not plans:
        raise CustomOpError("the spec has no abi = imegen kernel for the custom-op library")
    ime_board(plans)
    return plans


def ime_board(plans: list[KernelPlan]):
    """The ImeHarts of the plans' IME target (None: no IME kernel). One per library: its glue routes threads to
    one kind of hart and links one emulator."""
    ime: dict[str, KernelPlan] = {}  # target -> its first kernel
    for p in plans:
        if p.target.needs_ime:
            ime.setdefault(p.target.name, p)
    if len(ime) > 1:
        a, b = list(ime.values())[:2]
        raise CustomOpError(f"kernels '{a.name}' (target {a.spec.target}) and '{b.name}' (target {b.spec.target}): "
                            "one custom-op library serves one board; build a library per target")
    if not ime:
        return None
    plan = next(iter(ime.values()))
    if plan.target.ime_harts is None:
        raise CustomOpError(f"kernel '{plan.name}': target {plan.spec.target} says nothing of which harts run it")
    return plan.target.ime_harts


def board_flags(plans: list[KernelPlan], emulate: bool) -> list[str]:
    """The glue's -D flags for the board of the IME kernels (customop_lib.c's IMEGEN_IME_* and IMEGEN_EMULATOR)."""
    harts = ime_board(plans)
    if harts is None:
        return []
    flags = [f"-DIMEGEN_IME_MARCHID={harts.marchid:#x}ull", f'-DIMEGEN_IME_BOARD="{harts.board}"',
             f"-DIMEGEN_IME_CORES={harts.cores}", f'-DIMEGEN_IME_WHERE="{harts.where}"']
    if harts.route_file:
        flags.append(f'-DIMEGEN_IME_ROUTE_FILE="{harts.route_file}"')
    if harts.own_vlen:
        flags.append("-DIMEGEN_IME_PREPARE_THERE")
    if emulate:
        flags += ["-DIMEGEN_IME_EMULATION", f"-DIMEGEN_EMULATOR={emulator(plans)}"]
    return flags


def emulator(plans: list[KernelPlan]) -> str:
    """The runtime/NAME.c emulator of the plans' IME target."""
    return next(p.target.emulator for p in plans if p.target.needs_ime)


def packing(plan: KernelPlan) -> tuple:
    """What a kernel's pack_b bytes depend on: kernels that agree on it pack B identically, so one packed
    copy serves them all (tests/test_serving.py compares the bytes of such pairs)."""
    s = plan.spec
    return (s.bits, s.block, s.zero_point, s.scales, s.scale_type, plan.pack, plan.blksum)


def layouts(plans: list[KernelPlan]) -> dict[str, int]:
    """Kernel name -> a small id, equal for kernels whose packed B is byte-identical (packing())."""
    ids: dict[tuple, int] = {}
    return {p.name: ids.setdefault(packing(p), len(ids)) for p in plans}


def attention_plans(attention: list | None) -> list:
    """The AttentionPlans of a library's attention kernels (AttentionSpecs from the spec's attention blocks)."""
    from .. import targets

    return [targets.get(a.target).plan_attention(a) for a in attention or ()]


def render_library(plans: list[KernelPlan], spec_file: str, attention: list | None = None) -> dict[str, str]:
    files: dict[str, str] = {}
    for plan in plans:
        files.update(render_kernel(plan, spec_file))
    attn = attention_plans(attention)
    for a in attn:
        files.update(render_attention(a, spec_file))
    files["customop_kernels.c"] = env().get_template("customop_kernels.c.j2").render(
        plans=plans, attention=attn, spec_file=spec_file, domain=DOMAIN, layouts=layouts(plans))
    return files


MIN_ORT_API = 21  # the oldest ORT C API the library is built and tested against (ORT 1.21)
C_API_HEADER = "onnxruntime_c_api.h"
# A riscv64 machine's own ORT headers (Debian's libonnxruntime-dev, or a build installed under /usr)
SYSTEM_ORT_INCLUDES = (Path("/usr/include/onnxruntime"), Path("/usr/include"))


def ort_api_version(header: Path) -> int | None:
    """ORT_API_VERSION as `header` defines it (None: it does not)."""
    m = re.search(r"^[ \t]*#[ \t]*define[ \t]+ORT_API_VERSION[ \t]+(\d+)", header.read_text(errors="replace"), re.M)
    return int(m.group(1)) if m else None


def checked_ort_include(folder: Path | str) -> Path:
    """`folder` if it holds an ORT C API header of API version MIN_ORT_API or newer; else a CustomOpError."""
    folder = Path(folder)
    header = folder / C_API_HEADER
    if not header.is_file():
        what = "no such folder" if not folder.is_dir() else f"no {C_API_HEADER} in it"
        raise CustomOpError(f"ORT include folder {folder}: {what} (give the folder holding ONNX Runtime's "
                            f"{C_API_HEADER}, e.g. /usr/include/onnxruntime)")
    version = ort_api_version(header)
    if version is None:
        raise CustomOpError(f"{header}: no ORT_API_VERSION define: not ONNX Runtime's C API header")
    if version < MIN_ORT_API:
        raise CustomOpError(f"{header}: ORT_API_VERSION {version}, but the library uses ORT C API {MIN_ORT_API} "
                            f"calls: build against the headers of ORT 1.{MIN_ORT_API} or newer")
    return folder


def ort_include_dir(ort_include: Path | str | None = None) -> Path:
    """The folder of the onnxruntime_c_api.h the library is built against: the one given (checked); else, on a
    riscv64 machine, the system's own if it has one; else Debian's ORT 1.21 header (fetched once, cached)."""
    if ort_include is not None:
        return checked_ort_include(ort_include)
    if toolchain.current_host().native:
        for folder in SYSTEM_ORT_INCLUDES:
            if (folder / C_API_HEADER).is_file():
                return checked_ort_include(folder)
    return sysroot.include_dir(sysroot.ensure(HEADER_VERSION))


def ort_headers(folder: Path) -> tuple[Path, ...]:
    """The C API header and the headers of its folder it includes (ORT 1.23's includes onnxruntime_ep_c_api.h)."""
    header = folder / C_API_HEADER
    named = re.findall(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', header.read_text(errors="replace"), re.M)
    return (header, *(folder / n for n in sorted(set(named)) if (folder / n).is_file()))


def build_library(specs: list[KernelSpec], spec_file: str = "<spec>", *, flavour: str = "qemu",
                  ort_include: Path | str | None = None, attention: list | None = None) -> Path:
    """Build (cached by every input) the custom-op shared library; returns its path. `ort_include`: the folder
    of the ORT onnxruntime_c_api.h to build against (see ort_include_dir); the library then asks ORT for
    that header's API version, so it loads in that ORT and newer ones. `attention`: the spec's attention kernels
    (AttentionSpecs), which GroupQueryAttention nodes run on."""
    if flavour not in FLAVOURS:
        raise CustomOpError(f"unknown library flavour {flavour!r} (expected {' or '.join(FLAVOURS)})")
    plans = library_plans(specs)
    files = render_library(plans, Path(spec_file).name, attention)
    include = ort_include_dir(ort_include)
    emulate = flavour == "qemu" and any(p.target.needs_ime for p in plans)
    inputs = cache.Inputs(files=(*LIB_SOURCES, Path(__file__), *ort_headers(include),  # this file: the recipe
                                 *toolchain.runtime_files()),
                          strings=(repr(sorted(files.items())), flavour, repr(toolchain.COMMON_FLAGS)),
                          tools=(toolchain.compiler_tool("clang"),))
    name = f"libimegen_ort{'_qemu' if flavour == 'qemu' else ''}.so"

    def fill(d: Path) -> None:
        for fname, text in files.items():
            (d / fname).write_text(text)
        incs = [d, LIB_SOURCES[0].parent, include, toolchain.RUNTIME_DIR]
        pic = ["-fPIC"]
        objs = [toolchain.compile_c([d / f"{p.name}.c"], d / f"{p.name}.o", march=march_for(p), extra_flags=pic,
                                    include_dirs=incs) for p in plans]
        objs += [toolchain.compile_c([d / f"{a.name}.c"], d / f"{a.name}.o", march=targets.get(a.target).march,
                                     extra_flags=pic, include_dirs=incs) for a in (attention or ())]
        objs.append(toolchain.compile_c([d / "customop_kernels.c"], d / "customop_kernels.o", march="rv64gc",
                                        extra_flags=pic, include_dirs=incs))
        glue = pic + board_flags(plans, emulate) + [f'-DIMEGEN_DOMAIN="{DOMAIN}"']
        objs.append(toolchain.compile_c([LIB_SOURCES[0]], d / "customop_lib.o", march="rv64gc", extra_flags=glue,
                                        include_dirs=incs))
        # The decoder operators: vector-length-agnostic RVV, for any RVV 1.0 hart
        objs.append(toolchain.compile_c([LIB_SOURCES[2]], d / "decoder_ops.o", march="rv64gcv", extra_flags=pic,
                                        include_dirs=incs))
        if emulate:  # rv64gc: the emulator's own C code must not touch the V registers it emulates on
            stem = emulator(plans)
            objs.append(toolchain.compile_c([toolchain.RUNTIME_DIR / f"{stem}.c"], d / f"{stem}.o", march="rv64gc",
                                            extra_flags=pic, include_dirs=incs))
        # Export only the ORT entry point and the counters: kernel symbols must not clash with the host's.
        (d / "exports.map").write_text("{ global: RegisterCustomOps; imegen_ort_stats; local: *; };\n")
        toolchain.compile_c(objs, d / name, march="rv64gcv",
                            extra_flags=["-shared", "-Wl,-z,defs", f"-Wl,--version-script={d / 'exports.map'}"])

    return cache.entry(f"ort-customop-{flavour}", inputs.key(), fill) / name


def parse_stats(text: str) -> dict[str, int]:
    """imegen_ort_stats() text -> {kernel name: calls, ..., "vmadots": n (qemu flavour with IME),
    "slices_on_ime" / "slices_pinned" / "slices_fallback": IME slices by where they ran, "prepares_on_ime" /
    "prepares_pinned": A quantizations run on the IME harts (boards whose IME harts have a VLEN of their own),
    "packed_bytes": the B copies the live nodes packed}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "calls":
            out[parts[0]] = int(parts[2])
        elif len(parts) == 2 and parts[0] == "vmadots":
            out["vmadots"] = int(parts[1])
        elif len(parts) == 2 and parts[0] == "packed_bytes":
            out["packed_bytes"] = int(parts[1])
        elif len(parts) == 7 and parts[0] == "ime_slices":
            out.update({f"slices_{parts[i]}": int(parts[i + 1]) for i in (1, 3, 5)})
        elif len(parts) == 5 and parts[0] == "ime_prepares":
            out.update({f"prepares_{parts[i]}": int(parts[i + 1]) for i in (1, 3)})
    return out


def parse_decoder_stats(text: str) -> dict[str, tuple[int, int]]:
    """imegen_ort_stats() text -> {decoder operator: (live nodes, calls)}, for the operators some node used."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] == "decoder" and parts[2] == "nodes" and parts[4] == "calls":
            out[parts[1]] = (int(parts[3]), int(parts[5]))
    return out


def parse_routes(text: str) -> dict[str, str]:
    """imegen_ort_stats() text -> {node name: the kernels it runs, as serving.Serving.describe() words}."""
    out = {}
    for line in text.splitlines():
        if line.startswith("route "):
            node, _, route = line[len("route "):].partition(": ")
            out[node] = route
    return out


def ime_harts(text: str) -> str:
    """imegen_ort_stats() text -> its "ime_harts" line's value, e.g. "0-3 (from /proc/cpuinfo marchid)"."""
    return next((line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("ime_harts ")), "")
