"""Instruction counts of llama.cpp's Q4_0 path on the K3 (IME2), measured with imegen's counting plugin.

What runs (ime2_count_driver.cpp): ime.cpp's choice for a Q4_0 weight on IME2 cores: for K a multiple of 256
`quantize_a_*row_i8_hp` + `gemm_kernel_i8i4_hp` (256-code super-blocks), else `quantize_a_*row_i8` +
`gemm_kernel_i8i4` (blocks of 32); rows in groups of 4 while 4 are left, else 1; one call per row group on
all N columns (the kernels loop over 32-column groups inside). ime2_kernels.cpp (translated, ime2.translate)
and rvv_kernels.cpp (the quantizers) are "kernel"; the driver and the IME2 emulator are excluded.

The plugin classifies instruction words; it knows IME1's vmadot words (funct7 0x71/0x73, which are also IME2's
int8 vmadot and vmadotN) but files IME2's int4 and `.hp` forms, vpack, vupack and vnpack4 (custom-1 words with
other funct7) under scalar "int". The emulator counts what it ran by kind (ime2_emu.h), so `reclassify`
moves them: the matrix forms to "vmadot", the layout forms to a class of their own per LLVM's A100 schedule
row (a100.py charges them), out of "int". Every IME2 word the kernels issue traps into the emulator, so the
counts agree exactly.

Full shapes are not run (every IME2 instruction traps): a call's count is linear in the 32-column groups (the
kernel's loop does the same work for each) and the same for every row group of the same size, and the
quantizer's the same for every row group of the same size. So two runs at M = 5 (one group of 4, one of 1)
with N = 32 and 64 and the full K give every full shape: total(M, N) = q (quant4 + gemm4(N)) + r (quant1 +
gemm1(N)), M = 4q + r, gemm(N) = gemm(32) + (N / 32 - 1) (gemm(64) - gemm(32)). tests/test_ime2_bench.py
checks this against a direct run.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .... import cache, toolchain
from ....toolchain import ToolchainError
from ...count.image import code_ranges_from_map, exec_segments, symbols
from ...count.plugin import SOURCE as PLUGIN_SOURCE
from ...count.plugin import run_counted
from . import ime2
from .counts import RunCache, add_counts
from .source import SDIST_SHA256, SPACEMIT, sources

HERE = Path(__file__).parent
DRIVER = HERE / "ime2_count_driver.cpp"
MARCH = "rv64gcv_zfh_zvfh_zba_zbb"  # rvv_kernels.cpp uses Zba (sh3add); the A100 is RVA23
VLEN = ime2.VLEN
BEAT_BYTES = 16  # the plugin's vector-memory beat; a100.py charges bytes, not beats
# ime2_emu.h's enum imegen_ime2_kind, in order.
KINDS = ("vmadot", "vmadot_hp", "vpack", "vupack_slow", "vupack", "vnpack4", "vmadot_sp", "vfwmadot")
MATRIX_KINDS = ("vmadot", "vmadot_hp", "vmadot_sp", "vfwmadot")
LAYOUT_KINDS = ("vpack", "vupack_slow", "vupack", "vnpack4")


def kernel_for(K: int) -> str:
    """ime.cpp's Q4_0 choice on IME2: the HP kernel (blocks of 256) when K is a multiple of 256."""
    return "i8i4hp" if K % 256 == 0 else "i8i4"


@dataclass(frozen=True)
class CountExe:
    exe: Path
    ranges: tuple[tuple[int, int, str], ...]
    begin: int
    end: int


def build(log=None) -> CountExe:
    ggml = sources(log)
    spacemit = ggml / SPACEMIT
    tr = ime2.translate((spacemit / "ime2_kernels.cpp").read_text())
    inputs = cache.Inputs(files=(DRIVER, *toolchain.runtime_files(), PLUGIN_SOURCE),
                          strings=(SDIST_SHA256, tr.text, MARCH), tools=(toolchain.CLANG,))
    names = ("ime2_kernels", "rvv_kernels", "driver", "ime2_emu")

    def fill(d: Path) -> None:
        if log:
            log("llama.cpp: building ime2_kernels.cpp, rvv_kernels.cpp and the IME2 counting driver (clang-19)")
        (d / "ime2_kernels.cpp").write_text(tr.text)
        o = {n: d / f"{n}.o" for n in names}
        cxx = [toolchain.CLANG.replace("clang", "clang++"), "--target=riscv64-linux-gnu", "--gcc-toolchain=/usr",
               f"-march={MARCH}", "-O2", "-std=c++20", "-DRISCV64_SPACEMIT_IME2",
               *[f"-isystem{p}" for p in (spacemit, ggml / "include", ggml / "src", ggml / "src/ggml-cpu")],
               f"-I{toolchain.RUNTIME_DIR}"]
        steps = [(d / "ime2_kernels.cpp", o["ime2_kernels"], []), (spacemit / "rvv_kernels.cpp", o["rvv_kernels"], []),
                 (DRIVER, o["driver"], ["-Wall", "-Wextra", "-Werror"])]
        for src, obj, flags in steps:
            _run([*cxx, *flags, "-c", str(src), "-o", str(obj)], f"compiling {src.name}")
        toolchain.compile_c([toolchain.RUNTIME_DIR / "ime2_emu.c"], o["ime2_emu"], march="rv64gc")
        _run([*cxx, "-static", f"-Wl,-Map={d / 'ime2_count.map'}", *map(str, o.values()), "-o",
              str(d / "ime2_count")], "linking")
        tags = {str(o["ime2_kernels"]): "kernel", str(o["rvv_kernels"]): "kernel", str(o["driver"]): "excluded",
                str(o["ime2_emu"]): "excluded"}
        (d / "ranges.json").write_text(json.dumps(code_ranges_from_map((d / "ime2_count.map").read_text(), tags)))

    exe = cache.entry("llama-ime2-count", inputs.key(), fill) / "ime2_count"
    ranges = [tuple(r) for r in json.loads((exe.parent / "ranges.json").read_text())]
    ranges += [(lo, hi, "image") for lo, hi in exec_segments(exe)]
    syms = symbols(exe)
    return CountExe(exe, tuple(ranges), syms["imegen_bench_begin"][0], syms["imegen_bench_end"][0])


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"llama.cpp IME2 counting build: {what} failed", cmd, proc.returncode, proc.stdout,
                             proc.stderr)


def reclassify(counts: dict[str, int], kinds: dict[str, int]) -> dict[str, int]:
    """The plugin's counts of one region with the IME2 words it filed as "int" moved to "vmadot" (matrix forms)
    and to "ime2.<kind>" (layout forms), per the emulator's kinds. Every IME2 word lies in the kernel's code;
    the int8 vmadot forms the plugin already counts as vmadot."""
    out = dict(counts)
    plugin_vmadot = out.get("kernel.vmadot", 0) + out.get("callee.vmadot", 0)
    misfiled = sum(kinds.values()) - plugin_vmadot
    if misfiled < 0 or plugin_vmadot > kinds["vmadot"] or out.get("kernel.int", 0) < misfiled:
        raise ToolchainError(f"IME2 counts disagree: plugin vmadot {plugin_vmadot}, emulator {kinds}", [])
    out["kernel.int"] -= misfiled
    out["kernel.vmadot"] = out.get("kernel.vmadot", 0) + sum(kinds.get(k, 0) for k in MATRIX_KINDS) - plugin_vmadot
    for k in LAYOUT_KINDS:
        out[f"kernel.ime2.{k}"] = kinds[k]
    return out


@dataclass(frozen=True)
class Run:
    quant: list[dict[str, int]]  # per row group
    gemm: list[dict[str, int]]   # per row group
    checksum: float


def run(b: CountExe, kernel: str, M: int, N: int, K: int, out_dir: Path | None = None) -> Run:
    args = [kernel, str(M), str(N), str(K), *([str(out_dir)] if out_dir else [])]
    r = run_counted(b.exe, args, list(b.ranges), begin=b.begin, end=b.end, vlen=VLEN, beat_bytes=BEAT_BYTES,
                    timeout=3600)
    lines = r.stdout.split("\n")
    kinds = [dict(zip(KINDS, map(int, x.split()[2:]))) for x in lines if x.startswith("emulated ")]
    checksum = float(next(x for x in lines if x.startswith("checksum ")).split()[1])
    groups = len(ime2.row_groups(M))
    if len(r.regions) != 2 * groups or len(kinds) != 2 * groups:
        raise ToolchainError(f"llama.cpp IME2 {args}: {len(r.regions)} regions for {groups} row groups", [])
    regions = [reclassify(dict(c.values), k) for c, k in zip(r.regions, kinds)]
    return Run(regions[:groups], regions[groups:], checksum)


class Counter:
    """Per-call counts at full shapes from the two sample runs (module docstring); cached on disk."""

    def __init__(self, log=None):
        self.b = build(log)
        self.cache = RunCache(self.b.exe)

    def _sample(self, kernel: str, N: int, K: int) -> dict:
        def sample() -> dict:
            r = run(self.b, kernel, 5, N, K)
            return {"quant4": r.quant[0], "quant1": r.quant[1], "gemm4": r.gemm[0], "gemm1": r.gemm[1]}

        return self.cache.get(f"{kernel} {N} {K}", sample)

    def counts(self, M: int, N: int, K: int, cores: int = 1) -> dict[str, float]:
        """One core's counts of the call (A quantization and every row group), extrapolated. cores > 1: the
        columns split evenly across cores (N / cores a multiple of 32) and the quantization shared."""
        if N % (32 * cores):
            raise ValueError(f"N = {N} does not split into {cores} x 32-column groups")
        kernel, n = kernel_for(K), N // cores
        s32, s64 = self._sample(kernel, 32, K), self._sample(kernel, 64, K)
        q, r = divmod(M, 4)
        total: dict[str, float] = {}
        for size, mult in ((4, q), (1, r)):
            if mult:
                gemm = add_counts(s32[f"gemm{size}"], add_counts(s64[f"gemm{size}"], s32[f"gemm{size}"], -1), n // 32 - 1)
                total = add_counts(total, add_counts(s32[f"quant{size}"], gemm, cores), mult / cores)
        return total


def direct(b: CountExe, M: int, N: int, K: int) -> dict[str, float]:
    """The same total from one direct run (for the extrapolation's check)."""
    r = run(b, kernel_for(K), M, N, K)
    total: dict[str, float] = {}
    for c in r.quant + r.gemm:
        total = add_counts(total, c)
    return total


# ---------------------------------------------------------------- the NumPy check of a counting run

def case_from_files(kernel: str, M: int, N: int, K: int, d: Path) -> ime2.Q40Case | ime2.Q40HPCase:
    """The driver's a.bin / b.bin read back into the peer check's case (its model is the reference)."""
    a = np.fromfile(d / "a.bin", np.uint8)
    b = np.fromfile(d / "b.bin", np.uint8).reshape(N // 32, K // 32, 576)
    b_d = b[:, :, :64].copy().view(np.float16).reshape(N // 32, K // 32, 32).transpose(0, 2, 1).reshape(N, K // 32)
    qs = b[:, :, 64:].reshape(N // 32, K // 32, 32, 16).transpose(0, 2, 1, 3).reshape(N, K // 32, 16)
    codes = np.stack([qs & 15, qs >> 4], axis=3).reshape(N, K // 32, 32).astype(np.int64)
    if kernel == "i8i4":
        return _q40_a(a, M, K, codes, b_d)
    return _q40hp_a(a, M, K, codes, b_d)


def _q40_a(a: np.ndarray, M: int, K: int, codes, b_d) -> ime2.Q40Case:
    kb = K // 32
    codes_a, scales, sums, off = np.zeros((M, kb, 32), np.int8), np.zeros((M, kb), np.float32), \
        np.zeros((M, kb), np.int16), 0
    m = 0
    for g in ime2.row_groups(M):
        for k in range(kb):
            scales[m:m + g, k] = a[off:off + 4 * g].view(np.float32)
            sums[m:m + g, k] = a[off + 4 * g:off + 6 * g].view(np.int16)
            codes_a[m:m + g, k] = a[off + 6 * g:off + 38 * g].view(np.int8).reshape(g, 32)
            off += 38 * g
        m += g
    return ime2.Q40Case(codes_a, scales, sums, codes, b_d)


def _q40hp_a(a: np.ndarray, M: int, K: int, codes, b_d) -> ime2.Q40HPCase:
    kb, N = K // 256, codes.shape[0]
    codes_a = np.zeros((M, kb, 256), np.int8)
    sub, sums, avg = np.zeros((M, kb, 8), np.float16), np.zeros((M, kb, 8), np.float16), np.zeros((M, kb), np.float16)
    off, m = 0, 0
    for g in ime2.row_groups(M):
        for k in range(kb):
            for s in range(8):
                sub[m:m + g, k, s] = a[off:off + 2 * g].view(np.float16)
                codes_a[m:m + g, k, 32 * s:32 * s + 32] = a[off + 2 * g:off + 34 * g].view(np.int8).reshape(g, 32)
                off += 34 * g
            sums[m:m + g, k] = a[off:off + 16 * g].view(np.float16).reshape(g, 8)
            avg[m:m + g, k] = a[off + 16 * g:off + 18 * g].view(np.float16)
            off += 18 * g
        m += g
    return ime2.Q40HPCase(codes_a, sub, sums, avg, codes.reshape(N, kb, 256), b_d.reshape(N, kb, 8))


@dataclass(frozen=True)
class Check:
    model_units: float   # max |C - the kernel's NumPy model| in units of 1e-5 x sum |terms|
    float_rel: float     # max |C - A_fp32 @ B_dequantized| / max |A_fp32 @ B_dequantized| (quantization error)


def check(b: CountExe, M: int, N: int, K: int, work: Path) -> Check:
    """Run the counting driver at a small shape with its data written out, and compare its C with the peer
    check's NumPy model of the kernel (from the quantized A it read) and, loosely, with A in fp32 times the
    dequantized B (the quantizer's error included)."""
    work.mkdir(parents=True, exist_ok=True)
    kernel = kernel_for(K)
    run(b, kernel, M, N, K, work)
    C = np.fromfile(work / "c.bin", np.float32).reshape(M, N)
    case = case_from_files(kernel, M, N, K, work)
    units = ime2.error_units(ime2.PeerRun(C, (), 0), case.reference())
    af = np.fromfile(work / "af.bin", np.float32).reshape(M, K).astype(np.float64)
    B = np.repeat(case.b_d.astype(np.float64).reshape(N, -1), 32, axis=1) * (case.b_codes.reshape(N, K) - 8)
    want = af @ B.T
    return Check(units, float(np.abs(C - want).max() / np.abs(want).max()))
