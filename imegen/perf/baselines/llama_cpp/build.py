"""llama.cpp's ime1_kernels.cpp (translated, source.py) and repack.cpp, built by clang-19 for
rv64gcv_zfh_zvfh with the loop of llama_loop.cpp (ime.cpp's forward_mul_mat, IME1 branch, without TCM)
and llama_driver.cpp, statically with a link map; run under the counting plugin: the kernel and loop
objects are "kernel", the driver, the repack and the IME emulator excluded (count/measure.py's method)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .... import cache, toolchain
from ....toolchain import ToolchainError
from ...count.image import code_ranges_from_map, exec_segments, symbols
from ...count.measure import BEAT_BYTES, VLEN
from ...count.plugin import SOURCE as PLUGIN_SOURCE
from ...count.plugin import run_counted
from .source import SDIST_SHA256, SPACEMIT, sources, translate

HERE = Path(__file__).parent
OWN = [HERE / "llama_driver.cpp", HERE / "llama_loop.cpp", HERE / "llama_loop.h"]
MARCH = "rv64gcv_zfh_zvfh"


@dataclass(frozen=True)
class LlamaExe:
    exe: Path
    ranges: tuple[tuple[int, int, str], ...]
    begin: int
    end: int


def build(log=None) -> LlamaExe:
    ggml = sources(log)
    spacemit = ggml / SPACEMIT
    kernels, n_vmadot, _ = translate((spacemit / "ime1_kernels.cpp").read_text())
    if n_vmadot != 16:
        raise ToolchainError(f"expected 16 vmadot in ime1_kernels.cpp, found {n_vmadot}", [])
    inputs = cache.Inputs(files=(*OWN, *toolchain.runtime_files(), PLUGIN_SOURCE),
                          strings=(SDIST_SHA256, kernels, MARCH), tools=(toolchain.CLANG,))
    names = ("ime1_kernels", "loop", "repack", "driver", "ime_emu")

    def fill(d: Path) -> None:
        if log:
            log("llama.cpp: building ime1_kernels.cpp, repack.cpp and the driver (clang-19)")
        (d / "ime1_kernels.cpp").write_text(kernels)
        o = {n: d / f"{n}.o" for n in names}
        cxx = [toolchain.CLANG.replace("clang", "clang++"), "--target=riscv64-linux-gnu", "--gcc-toolchain=/usr",
               f"-march={MARCH}", "-O2", "-std=c++20", "-DRISCV64_SPACEMIT_IME1",
               *[f"-isystem{p}" for p in (spacemit, ggml / "include", ggml / "src", ggml / "src/ggml-cpu")],
               f"-I{toolchain.RUNTIME_DIR}", f"-I{HERE}"]
        own = ["-Wall", "-Wextra", "-Werror"]
        steps = [(d / "ime1_kernels.cpp", o["ime1_kernels"], []), (spacemit / "repack.cpp", o["repack"], []),
                 (HERE / "llama_loop.cpp", o["loop"], own), (HERE / "llama_driver.cpp", o["driver"], own)]
        for src, obj, flags in steps:
            _run([*cxx, *flags, "-c", str(src), "-o", str(obj)], f"compiling {src.name}")
        toolchain.compile_ime_emu(o["ime_emu"])
        _run([*cxx, "-static", f"-Wl,-Map={d / 'llama_bench.map'}", *map(str, o.values()), "-o",
              str(d / "llama_bench")], "linking")
        # The map names the objects by this temporary directory: resolve the code ranges before publishing.
        tags = {str(o["ime1_kernels"]): "kernel", str(o["loop"]): "kernel", str(o["driver"]): "excluded",
                str(o["repack"]): "excluded", str(o["ime_emu"]): "excluded"}
        (d / "ranges.json").write_text(json.dumps(code_ranges_from_map((d / "llama_bench.map").read_text(), tags)))

    exe = cache.entry("llama-real", inputs.key(), fill) / "llama_bench"
    ranges = [tuple(r) for r in json.loads((exe.parent / "ranges.json").read_text())]
    ranges += [(lo, hi, "image") for lo, hi in exec_segments(exe)]
    syms = symbols(exe)
    return LlamaExe(exe, tuple(ranges), syms["imegen_bench_begin"][0], syms["imegen_bench_end"][0])


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"llama.cpp build: {what} failed", cmd, proc.returncode, proc.stdout, proc.stderr)


def run_driver(b: LlamaExe, args: list[str]) -> tuple[list[dict[str, int]], list[int], float]:
    """(region counts, emulated vmadots per region, checksum); checks the plugin saw every vmadot."""
    run = run_counted(b.exe, args, list(b.ranges), begin=b.begin, end=b.end, vlen=VLEN, beat_bytes=BEAT_BYTES)
    lines = run.stdout.split("\n")
    emulated = [int(x.split()[1]) for x in lines if x.startswith("emulated ")]
    checksum = float(next(x for x in lines if x.startswith("checksum ")).split()[1])
    regions = [dict(r.values) for r in run.regions]
    for r, e in zip(regions, emulated):
        if r.get("kernel.vmadot", 0) + r.get("callee.vmadot", 0) != e:
            raise ToolchainError(f"llama.cpp {args}: plugin counted {r.get('kernel.vmadot')} vmadot, emulator {e}", [])
    return regions, emulated, checksum
