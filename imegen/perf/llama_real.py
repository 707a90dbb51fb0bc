"""llama.cpp's real SpacemiT IME1 Q4_0 kernels, counted like imegen's own (the `llama.cpp real` bench rows).

Source: the llama-cpp-python 0.3.36 sdist from PyPI (`pip download --no-deps --no-binary :all:`),
checked against SDIST_SHA256 and cached under ~/.cache/imegen; nothing of it enters the repository.
From `vendor/llama.cpp/ggml/` the build uses `src/ggml-cpu/spacemit/ime1_kernels.cpp` (the Q4_0 M4 and
M1 kernels, Q8 A quantization), `repack.cpp` (the 16x32 weight repack, not counted) and the ggml
headers. ime1_kernels.cpp is transformed at build time: vendor `vmadot vd, vs1, vs2` mnemonics become
`.word` encodings (imegen.ime_encoding; signed x signed), and `vsetvli` lines without a policy get an
explicit `tu, mu` (clang-19 requires it). clang-19 builds it for rv64gcv_zfh_zvfh with the loop of
llama_loop.cpp (ime.cpp's forward_mul_mat, IME1 branch, without TCM) and llama_driver.cpp.

What it computes (Q4_0): symmetric int4 weights (q - 8), block 32, one fp16 scale per block; A is
quantized per 32 to Q8 (fp32 scale amax/127, round to nearest even), integer dots by vmadot, folded in fp32.

Counting: the kernel and loop objects are "kernel", the driver and IME emulator excluded (measure.py's
method). Threads run one after another in one process (phase 1 for every thread, then phase 2); a
thread count's per-core figure is max over threads of phase 1 plus max of phase 2 (ggml_barrier sits
between them). Full shapes are not run (every vmadot traps): phase 1 is run at the full shape, and
phase 2 is the sum over the thread's tasks of the task cost, which is bilinear in 4-row groups and
16-column blocks (M4 path) or linear in 16-column blocks (M = 1), measured at 2 x 2 (2) small tasks
with the full K. tests/test_llama_real.py checks this against direct runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import cache, toolchain
from ..ime_encoding import encode_vmadot
from ..toolchain import ToolchainError
from . import x60
from .measure import BEAT_BYTES, VLEN, code_ranges_from_map, exec_segments, symbols
from .plugin import SOURCE as PLUGIN_SOURCE
from .plugin import run_counted

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
GGML = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/ggml"
SPACEMIT = "src/ggml-cpu/spacemit"
HERE = Path(__file__).parent
OWN = [HERE / "llama_driver.cpp", HERE / "llama_loop.cpp", HERE / "llama_loop.h"]
MARCH = "rv64gcv_zfh_zvfh"
DESCRIBES = "Q4_0: symmetric int4 (q-8), block 32, fp16 scale; A quantized to Q8 per 32 (fp32 scale)"


class LlamaUnavailable(RuntimeError):
    pass


def sdist(log=None) -> Path:
    """The cached sdist, downloaded with pip on first use and checked against SDIST_SHA256."""
    d = cache.root() / "sdist"
    path = d / SDIST
    if not path.exists():
        d.mkdir(parents=True, exist_ok=True)
        if log:
            log(f"llama.cpp: pip download llama-cpp-python=={VERSION} (sdist, 76 MB)")
        cmd = ["python3", "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={VERSION}", "-d", str(d)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not path.exists():
            raise LlamaUnavailable(f"pip download of llama-cpp-python {VERSION} failed:\n{proc.stderr.strip()}")
    digest = cache.file_digest(path).hex()
    if digest != SDIST_SHA256:
        raise LlamaUnavailable(f"{path}: sha256 {digest}, expected {SDIST_SHA256} (delete it to re-download)")
    return path


def sources(log=None) -> Path:
    """The ggml headers and spacemit sources extracted from the sdist (cached by version + hash)."""
    root = cache.root() / f"llama-cpp-python-{VERSION}-{SDIST_SHA256[:16]}"
    if not (root / "done").exists():
        tar_path = sdist(log)
        root.mkdir(parents=True, exist_ok=True)
        want = re.compile(re.escape(GGML) + r"/(include/[^/]+\.h|src/[^/]+\.h|src/ggml-cpu/[^/]+\.h|"
                          + re.escape(SPACEMIT) + r"/[^/]+)$")
        with tarfile.open(tar_path) as tar:
            tar.extractall(root, members=[m for m in tar if m.isfile() and want.match(m.name)], filter="data")
        (root / "done").write_text("")
    return root / GGML


def translate(text: str) -> tuple[str, int, int]:
    """vmadot mnemonics -> .word, policy-less vsetvli -> `, tu, mu`; returns (text, #vmadot, #vsetvli)."""
    def word(m: re.Match) -> str:
        return f".word 0x{encode_vmadot(int(m[1]), int(m[2]), int(m[3]), signedness='ss'):08x}"

    text, n_vmadot = re.subn(r"\bvmadot\s+v(\d+),\s*v(\d+),\s*v(\d+)", word, text)
    if re.search(r"\bvmadot\w", text):
        raise ToolchainError("ime1_kernels.cpp uses a vmadot variant the translation does not handle", [])
    text, n_vset = re.subn(r"(vsetvli\s+[\w%\[\]]+,\s*[\w%\[\]]+,\s*e\d+,\s*m?f?\d+)(\s*\\n)", r"\1, tu, mu\2", text)
    return text, n_vmadot, n_vset


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


# ---------------------------------------------------------------------------------------------
# NumPy check


def reference(w_blocks: bytes, A: np.ndarray, N: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(Q4_0 x Q8 result, bound): Q4_0 dequantized exactly, A quantized per 32 as ime1 does
    (scale = amax * (1/127) in fp32, codes = round-half-even(a * (1/scale)))."""
    kb = K // 32
    raw = np.frombuffer(w_blocks, dtype=np.uint8).reshape(N, kb, 18)
    d = raw[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float64)
    qs = raw[:, :, 2:]
    q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.int64) - 8  # (N, kb, 32): j and j + 16
    Ab = A.astype(np.float32).reshape(A.shape[0], kb, 32)
    sa = (np.abs(Ab).max(axis=2) * np.float32(1.0 / 127)).astype(np.float32)
    inv = np.divide(np.float32(1), sa, out=np.zeros_like(sa), where=sa != 0).astype(np.float32)
    qa = np.clip(np.rint((Ab * inv[:, :, None]).astype(np.float32)), -128, 127).astype(np.int64)
    dots = np.einsum("mbk,nbk->mnb", qa, q)  # exact integer per-block dots
    terms = dots * sa.astype(np.float64)[:, None, :] * d[None, :, :]
    return terms.sum(axis=2), np.abs(terms).sum(axis=2)


def validate(b: LlamaExe, M: int, N: int, K: int, nth: int, work: Path) -> float:
    """Run the full loop with `nth` threads and compare C with the NumPy model; returns max err / bound."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = [toolchain.QEMU, "-L", str(toolchain.SYSROOT), "-cpu", toolchain.qemu_cpu(VLEN),
           str(b.exe), "full", str(M), str(N), str(K), str(nth), str(work)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise ToolchainError("llama.cpp driver failed", cmd, proc.returncode, proc.stdout, proc.stderr)
    A = np.fromfile(work / "a.bin", dtype=np.float32).reshape(M, K)
    C = np.fromfile(work / "c.bin", dtype=np.float32).reshape(M, N)
    want, bound = reference((work / "w.bin").read_bytes(), A, N, K)
    ratio = float((np.abs(C - want) / (1e-6 * bound + 1e-30)).max())
    if not np.isfinite(C).all() or ratio > 1.0:
        raise ToolchainError(f"llama.cpp real {M}x{K}x{N} ({nth} threads) differs from NumPy: max err "
                             f"{ratio:.3g} x (1e-6 x sum|terms|)", cmd)
    return ratio


# ---------------------------------------------------------------------------------------------
# Counts


def split(nth: int, M: int, N: int) -> tuple[int, int, int, int]:
    """ime.cpp's task split (llama_loop.cpp llama_split): (m_stride, n_stride, tasks_m, tasks)."""
    m_stride = M if N // M > 64 else 16
    m_blocked = -(-M // m_stride)
    max_n = -(-(N * m_blocked) // nth)
    n_stride = min(N, -(-max_n // 16) * 16) if max_n < N else N
    tasks_m = -(-M // m_stride)
    return m_stride, n_stride, tasks_m, tasks_m * -(-N // n_stride)


def thread_tasks(nth: int, ith: int, M: int, N: int) -> list[tuple[int, int]]:
    """(m_count, n_count) of each task thread `ith` runs in phase 2."""
    ms, ns, tm, tasks = split(nth, M, N)
    per = -(-tasks // nth)
    out = []
    for t in range(ith * per, min((ith + 1) * per, tasks)):
        m0, n0 = (t % tm) * ms, (t // tm) * ns
        out.append((min(M - m0, ms), min(N - n0, ns)))
    return out


def _add(a: dict, b: dict, s: float = 1.0) -> dict:
    return {k: a.get(k, 0) + s * b.get(k, 0) for k in set(a) | set(b)}


class Counter:
    """Per-thread counts of llama.cpp's loop at full shapes (see the module docstring); cached on disk."""

    def __init__(self, log=None):
        self.b = build(log)
        self.cache_file = self.b.exe.parent / "counts.json"
        try:
            self.cache = json.loads(self.cache_file.read_text())
        except (OSError, ValueError):
            self.cache = {}
        self.log = log

    def _regions(self, args: list[str]) -> list[dict]:
        key = " ".join(args)
        if key not in self.cache:
            self.cache[key] = run_driver(self.b, args)[0]
            tmp = self.cache_file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.cache, sort_keys=True))
            tmp.replace(self.cache_file)
        return self.cache[key]

    def task(self, K: int, mc: int, nc: int) -> dict:
        """Cost of one task of mc rows x nc columns: measured at 1-2 row groups x 1-2 column blocks."""
        def at(m: int, n: int) -> dict:
            return self._regions(["task", str(m), str(n), str(K), str(m), str(n)])[0]

        if mc == 1:
            c1, c2 = at(1, 16), at(1, 32)
            return _add(c1, _add(c2, c1, -1), nc // 16 - 1)
        g, nb = mc // 4, nc // 16
        if mc % 4:
            raise ValueError("llama.cpp counts: M > 1 must be a multiple of 4 here")
        f00, f10, f01, f11 = at(4, 16), at(8, 16), at(4, 32), at(8, 32)
        dm, dn = _add(f10, f00, -1), _add(f01, f00, -1)
        dmn = _add(_add(f11, f10, -1), dn, -1)
        return _add(_add(_add(f00, dm, g - 1), dn, nb - 1), dmn, (g - 1) * (nb - 1))

    def per_thread(self, M: int, N: int, K: int, nth: int) -> tuple[list[dict], list[dict]]:
        quant = self._regions(["quant", str(M), str(N), str(K), str(nth)])
        gemm = []
        for ith in range(nth):
            c: dict = {}
            for mc, nc in thread_tasks(nth, ith, M, N):
                c = _add(c, self.task(K, mc, nc))
            gemm.append(c)
        return quant, gemm

    def direct(self, M: int, N: int, K: int, nth: int) -> tuple[list[dict], list[dict]]:
        regions = self._regions(["full", str(M), str(N), str(K), str(nth)])
        return regions[:nth], regions[nth:]

    def per_core(self, M: int, N: int, K: int, nth: int) -> dict:
        """The busiest thread's counts: max over threads of phase 1 + max of phase 2 (by total instructions)."""
        quant, gemm = self.per_thread(M, N, K, nth)
        return _add(max(quant, key=x60.total_instructions), max(gemm, key=x60.total_instructions))


# ---------------------------------------------------------------------------------------------
# Bench rows: modeled time, the like-for-like imegen config, calibration

PUBLISHED_TG128_TPS = 10.03  # llama.cpp Q4_0 on K1, 4 threads (ggml-org/llama.cpp/docs/build-riscv64-spacemit.md), as pp512 in workload
LOAD_USE_EXTRA = 2  # ASSUMPTION (no public X60 figure found): a vector load's result arrives 3 cycles later
VMADOT_LATENCY = 4  # ASSUMPTION (SpacemiT publishes throughput, not latency): cycles before a dependent vmadot


def dram_bytes(M: int, N: int, K: int, p=None) -> float:
    """Q4_0 weights (18 bytes per 32) once per M task when they exceed half the L2, A fp32, the Q8
    workspace written once (ime.cpp quantizes all of A before its barrier, then the tasks read it: back
    from DRAM once more when it outgrows the L2), C fp32."""
    from . import x60
    p = p or x60.X60
    w = N * K // 32 * 18
    passes = split(1, M, N)[2] if w > p.l2_bytes // 2 else 1
    return w * passes + 4 * M * K + x60.prepared_whole_dram(M * (K // 32) * 36, p.l2_bytes) + 4 * M * N


def modeled_s(counts: dict, M: int, N: int, K: int, p=None) -> tuple[float, float]:
    """(MODELED time, the same with the latency sensitivity): max(core, DRAM) as x60.model does."""
    from . import x60
    p = p or x60.X60
    core = x60.core_seconds(counts, p)
    cls = x60.class_totals(counts)
    stall = cls["vload"] * LOAD_USE_EXTRA + cls["vmadot"] / 8 * (VMADOT_LATENCY - 1)  # 8 vmadot per chain step
    dram = dram_bytes(M, N, K, p) / p.dram_effective
    return max(core, dram), max(core + stall / p.clock_hz, dram)


def measured_s(counts: dict, M: int, N: int, K: int, p=None) -> float:
    """MODELED time with the vector units' cycles from LLVM's measured X60 occupancies (x60.core_cycles)."""
    from . import x60
    p = p or x60.X60
    return max(x60.core_seconds(counts, p, measured=True), dram_bytes(M, N, K, p) / p.dram_effective)


@dataclass(frozen=True)
class LlamaRow:
    case: object  # tune.Case
    one: dict  # one thread, whole call
    four: dict  # busiest of 4 threads
    imegen_sym: object  # tune.Evaluation of the symmetric fp16-scale twin of imegen's tuned config, or None

    def times(self) -> dict[str, tuple[float, float]]:
        c = self.case
        return {"1": modeled_s(self.one, c.M, c.N, c.K), "4": modeled_s(self.four, c.M, c.N, c.K)}

    def measured_times(self) -> dict[str, float]:
        c = self.case
        return {"1": measured_s(self.one, c.M, c.N, c.K), "4": measured_s(self.four, c.M, c.N, c.K)}


def rows(cases, tuned, log=None) -> list[LlamaRow]:
    """llama.cpp-real rows for the block-32 cases (Q4_0 has block 32 only)."""
    from .tune import evaluate, settings_of
    from .tune import validate as validate_spec
    counter = Counter(log)
    out = []
    ok = [c for c in cases if c.block == 32]
    if ok:
        validate_ratio = validate(counter.b, 8, 64, 896, 4, counter.b.exe.parent / "validate")
        if log:
            log(f"llama.cpp real: outputs match NumPy (max err {validate_ratio:.3f} of 1e-6 x sum|terms|)")
    for c in ok:
        if log:
            log(f"llama.cpp real: {c.label}")
        s = {**settings_of(tuned.best[c].spec), "zero_point": "symmetric", "scale_type": "fp16"}
        spec = validate_spec(s)
        twin = evaluate([spec], [c])[(spec.name, c)] if hasattr(spec, "name") else None
        out.append(LlamaRow(c, counter.per_core(c.M, c.N, c.K, 1), counter.per_core(c.M, c.N, c.K, 4), twin))
    return out


def table(rs: list[LlamaRow]) -> str:
    from .bench import format_table, short_config
    head = ["shape", "M", "llama 1t M", "imegen sym-fp16 1c M", "ratio", "llama 4t M/core", "llama 1c ms", "+lat",
            "llama 4c ms", "+lat", "imegen sym 1c ms", "imegen sym 4c ms", "1c core ms: llama", "imegen sym",
            "imegen config"]
    body = []
    for r in rs:
        t = r.times()
        i = r.imegen_sym
        li, ii = x60.total_instructions(r.one), (x60.total_instructions(i.counts) if i else float("nan"))
        body.append([r.case.shape, str(r.case.M), f"{li / 1e6:.3f}", f"{ii / 1e6:.3f}", f"{ii / li:.2f}",
                     f"{x60.total_instructions(r.four) / 1e6:.3f}", f"{t['1'][0] * 1e3:.4f}", f"{t['1'][1] * 1e3:.4f}",
                     f"{t['4'][0] * 1e3:.4f}", f"{t['4'][1] * 1e3:.4f}",
                     f"{i.one_core.time_s * 1e3:.4f}" if i else "-", f"{i.four_cores.time_s * 1e3:.4f}" if i else "-",
                     f"{x60.core_seconds(r.one) * 1e3:.4f}", f"{i.one_core.core_s * 1e3:.4f}" if i else "-",
                     short_config(i.spec) if i else "refused"])
    return format_table(head, body, right=set(range(1, 14)))


def per_token_s(rs: list[LlamaRow], M: int) -> tuple[float, float, float | None] | None:
    """MODELED seconds per M-token step of Qwen's MatMulNBits on llama.cpp's real kernels, 4 threads:
    (base, with latency sensitivity, with LLVM's measured occupancies or None for older counts); None
    without every shape at M (and the LM head at M = 1)."""
    from . import occupancy
    from .workload import shapes
    by = {(r.case.shape, r.case.M): r for r in rs}
    base = lat = occ = 0.0
    for s in shapes():
        r = by.get((s.name, 1 if s.name == "lm_head" else M))  # llama.cpp computes logits of the last token only
        if r is None:
            return None
        t = r.times()["4"]
        base, lat = base + s.per_token * t[0], lat + s.per_token * t[1]
        occ = None if occ is None or occupancy.measured_cycles(r.four) is None else occ + s.per_token * r.measured_times()["4"]
    return base, lat, occ


def _calibration_points(rs: list[LlamaRow]):
    """(label, M, published tok/s, modeled seconds per M tokens as per_token_s gives them), or None."""
    from .workload import PREFILL_M, PUBLISHED_PP512_TPS
    points = []
    for label, M, published in (("decode tg128", 1, PUBLISHED_TG128_TPS), (f"prefill pp{PREFILL_M[-1]}", PREFILL_M[-1], PUBLISHED_PP512_TPS)):
        t = per_token_s(rs, M)
        if t is None:
            return None
        points.append((label, M, published, t))
    return points


def optimism_factors(rs: list[LlamaRow]) -> str:
    """The calibration's optimism factors in one line, for figures printed away from it."""
    points = _calibration_points(rs)
    if points is None:
        return ""
    return ", ".join(f"{label.split()[0]} {M / t[0] / published:.2f}x" for label, M, published, t in points)


def calibration(rs: list[LlamaRow]) -> str:
    """Whole-model MODELED estimate from llama.cpp's real counts vs its published K1 figures."""
    from .workload import PREFILL_M
    points = _calibration_points(rs)
    if points is None:
        return f"(calibration needs every Qwen shape at M = 1 and {PREFILL_M[-1]}: run without --quick)"
    lines = []
    for label, M, published, t in points:
        tps, tps_lat = M / t[0], M / t[1]
        occ = (f"; with LLVM's measured occupancies {M / t[2]:.1f} tok/s, optimism factor {M / t[2] / published:.2f}x"
               if t[2] is not None else "")
        lines.append(f"  {label}: MODELED {tps:.1f} tok/s (with latency sensitivity {tps_lat:.1f}); published "
                     f"{published} tok/s; optimism factor {tps / published:.2f}x ({tps_lat / published:.2f}x){occ}")
    return "\n".join(lines)
