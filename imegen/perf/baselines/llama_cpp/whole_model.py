"""llama.cpp itself, whole, as a measured baseline: the llama-cpp-python sdist's llama.cpp (libllama and
ggml with the SpacemiT CPU backend, IME1) built by clang-19 for riscv64, statically linked with
whole_driver.cpp and imegen's IME emulator, runs a random-weight model of Qwen2.5-0.5B's architecture
(Q4_0) under QEMU; the counting plugin counts each llama_decode call as one region, and again node by node
(the driver's --per-node: llama.cpp's graph-eval callback ends one region and begins the next at every ggml
node; whole_nodes.py accounts those nodes as the ORT engines' are accounted).

Build (cached): the sdist's whole llama.cpp tree (pristine copy cached once) is copied, and three things
clang-19 cannot take as they are are adjusted in the copy only: ime1_kernels.cpp's vmadot mnemonics
become .word encodings (source.translate); policy-less vsetvli/vsetivli in the generic
ggml-cpu/arch/riscv/quants.c get llama.cpp's implied `tu, mu`; and the SpacemiT CPU target is
compiled as C++20 (rvv_kernels.h has `auto` parameters; ggml forces C++17). FindSMTIME.cmake's test
that the compiler assembles vmadot is answered yes by a preset cache variable (clang-19 cannot; the
kernels' own vmadot are .word by then), its IME2 tests no. The SpacemiT objects are linked as objects, so the link map names each of
them: their code is the plugin's "kernel" tag ("SpacemiT code"), everything else in the executable
(llama.cpp, the rest of ggml, libc) "callee" ("the rest"); the driver and the emulator are excluded.

Models: whole_gguf.py (gguf-py's writer from the sdist). Counts: one thread, one region per llama_decode
call, from a run of a P-token prefill and two one-token calls: "prefill P" is its first call, "decode
at context P" its third (P + 1 cached), which reuses the previous call's graph as llama.cpp does for
every generated token but the first ("decode_first", the second call, P cached, rebuilds it). Each
run is made with 1 and 2 layers, and a layer's count is their difference, exactly (a layer's graph
does not depend on the layer count, except that llama.cpp runs the last layer's FFN and the lm_head on
the output row only, which both runs share): total(L) = C1 + (L - 1) (C2 - C1).

    python3 -m imegen.perf.baselines.llama_cpp.whole_model [--write bench/results/llama_whole_model.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .... import cache, toolchain
from ....toolchain import ToolchainError
from ...count.image import code_ranges_from_map, exec_segments, symbols
from ...count.measure import BEAT_BYTES, VLEN
from ...count.plugin import SOURCE as PLUGIN_SOURCE
from ...count.plugin import run_counted
from ...model import x60
from . import whole_gguf, whole_nodes
from .source import SDIST_SHA256, VERSION, LlamaUnavailable, sdist, translate

HERE = Path(__file__).parent
DRIVER = HERE / "whole_driver.cpp"
LLAMA = f"llama_cpp_python-{VERSION}/vendor/llama.cpp"
# What of the sdist's llama.cpp the build and the model writer read (not its models, docs, tools, tests).
TREE_PARTS = ("CMakeLists.txt", "LICENSE", "cmake", "ggml", "src", "include", "vendor", "licenses", "gguf-py")
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_STATIC=ON", "-DGGML_NATIVE=OFF",
    "-DGGML_OPENMP=OFF", "-DGGML_CCACHE=OFF", "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    # The SpacemiT backend with IME1, llama.cpp's RVV build for the K1 (ime.cpp needs Zba), no generic repack.
    "-DGGML_CPU_RISCV64_SPACEMIT=ON", "-DGGML_CPU_REPACK=OFF", "-DGGML_RVV=ON", "-DGGML_RV_ZFH=ON",
    "-DGGML_RV_ZVFH=ON", "-DGGML_RV_ZBA=ON",
    # FindSMTIME.cmake's assembler probes: IME1 yes (its vmadot is .word by then), the IME2 forms no.
    "-DSPACEMIT_RISCV_COMPILER_SUPPORT_IME1=ON",
    *(f"-DSPACEMIT_RISCV_COMPILER_SUPPORT_{p}=OFF" for p in (
        "VMADOT_S4", "VMADOT_S8", "VFWMADOT_FP16", "VFMADOT_S4", "VFMADOT_S8", "VMADOTN", "VPACK", "VNPACK")),
)
DRIVER_MARCH = "rv64gc"
IME1_ARCH = "0xA03C"  # SPACEMIT_CORE_ARCH of an A60 core: ime_env.cpp selects IME1
GENERIC_ARCH = "0x503C"  # an X60 core: the SpacemiT backend without IME
SPACEMIT_OBJECTS = "ggml/src/CMakeFiles/ggml-cpu.dir/ggml-cpu/spacemit"
LIBRARIES = ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a")
LAYERS = 24
CONTEXTS = (128, 512)
PHASES = ("prefill", "decode")


def tree(log=None) -> Path:
    """The sdist's llama.cpp (TREE_PARTS), extracted once into the cache and never modified."""
    def fill(d: Path) -> None:
        if log:
            log("llama.cpp: extracting the whole llama.cpp tree from the sdist")
        want = re.compile(re.escape(LLAMA) + "/(" + "|".join(map(re.escape, TREE_PARTS)) + ")(/|$)")
        with tarfile.open(sdist(log)) as tar:
            tar.extractall(d, members=[m for m in tar if (m.isfile() or m.isdir()) and want.match(m.name)],
                           filter="data")

    return cache.entry("llama-whole-tree", SDIST_SHA256[:16], fill) / LLAMA


# ---------------------------------------------------------------------------------------------
# Build


_POLICYLESS = re.compile(r"(?<![\w.])(vseti?vli\s+[\w%\[\]]+,\s*[\w%\[\]]+,\s*e\d+,\s*m?f?\d+)(\s*\\n)")
_SPACEMIT_DEFS = ("target_compile_definitions(${GGML_CPU_NAME} PRIVATE GGML_USE_CPU_RISCV64_SPACEMIT "
                  "${RISCV64_SPACEMIT_IME_SPEC})\n")
_CXX20 = "            set_target_properties(${GGML_CPU_NAME} PROPERTIES CXX_STANDARD 20)\n"
# file -> (edit: text -> (text, places), what it does, places expected): a changed sdist fails here
# instead of building something else.
ADJUSTMENTS = {
    "ggml/src/ggml-cpu/spacemit/ime1_kernels.cpp": (lambda t: translate(t)[:2], "vmadot mnemonics", 16),
    # The assembler's default for an omitted policy was undisturbed (tu, mu); clang-19 wants it spelled.
    "ggml/src/ggml-cpu/arch/riscv/quants.c": (lambda t: _POLICYLESS.subn(r"\1, tu, mu\2", t),
                                              "policy-less vsetvli/vsetivli", 19),
    "ggml/src/ggml-cpu/CMakeLists.txt": (lambda t: (t.replace(_SPACEMIT_DEFS, _SPACEMIT_DEFS + _CXX20),
                                                    t.count(_SPACEMIT_DEFS)), "the SpacemiT target's definitions", 1),
}


def adjusted_sources(root: Path) -> dict[str, str]:
    """The build's three adjustments (module docstring) of the pristine tree at `root`: path -> new text."""
    out = {}
    for rel, (edit, what, expected) in ADJUSTMENTS.items():
        text, n = edit((root / rel).read_text())
        if n != expected:
            raise ToolchainError(f"llama.cpp build: {what} in {rel}: {n} places, expected {expected}", [])
        out[rel] = text
    return out


@dataclass(frozen=True)
class WholeExe:
    exe: Path
    ranges: tuple[tuple[int, int, str], ...]
    begin: int
    end: int


def _cxx() -> list[str]:
    return [toolchain.CLANG.replace("clang", "clang++"), "--target=riscv64-linux-gnu", "--gcc-toolchain=/usr"]


def _cmake_toolchain() -> list[str]:
    cc, cxx = toolchain.CLANG, toolchain.CLANG.replace("clang", "clang++")
    return ["-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=riscv64", f"-DCMAKE_C_COMPILER={cc}",
            f"-DCMAKE_CXX_COMPILER={cxx}", "-DCMAKE_C_COMPILER_TARGET=riscv64-linux-gnu",
            "-DCMAKE_CXX_COMPILER_TARGET=riscv64-linux-gnu", "-DCMAKE_C_FLAGS=--gcc-toolchain=/usr",
            "-DCMAKE_CXX_FLAGS=--gcc-toolchain=/usr"]


def build_inputs(log=None) -> tuple[cache.Inputs, dict[str, str]]:
    """The cache key's inputs (sdist, adjusted sources, options, driver, runtime, tools) and the adjusted sources."""
    adjusted = adjusted_sources(tree(log))
    inputs = cache.Inputs(files=(DRIVER, *toolchain.runtime_files(), PLUGIN_SOURCE),
                          strings=(SDIST_SHA256, *adjusted.values(), *CMAKE_OPTIONS, *_cmake_toolchain(), DRIVER_MARCH),
                          tools=(toolchain.CLANG, "cmake", "make"))
    return inputs, adjusted


def build(log=None) -> WholeExe:
    """whole_driver linked with llama.cpp (cached; about 2 minutes on 2 cores when not)."""
    inputs, adjusted = build_inputs(log)

    def fill(d: Path) -> None:
        started = time.monotonic()
        if log:
            log("llama.cpp: building libllama and ggml (clang-19, riscv64; a few minutes)")
        src, bld = d / "llama.cpp", d / "build"
        shutil.copytree(tree(log), src, ignore=shutil.ignore_patterns("gguf-py"))
        for rel, text in adjusted.items():  # the copy only: the cached tree stays pristine
            (src / rel).write_text(text)
        _run(["cmake", "-S", str(src), "-B", str(bld), "-G", "Unix Makefiles", *_cmake_toolchain(), *CMAKE_OPTIONS],
             "cmake configure")
        _run(["make", "-C", str(bld), f"-j{os.cpu_count() or 2}", "llama"], "make llama")
        driver, emu = d / "whole_driver.o", d / "ime_emu.o"
        _run([*_cxx(), f"-march={DRIVER_MARCH}", "-O2", "-std=c++17", "-Wall", "-Wextra", "-Werror",
              f"-I{src / 'include'}", f"-I{src / 'ggml/include'}", f"-I{toolchain.RUNTIME_DIR}",
              "-c", str(DRIVER), "-o", str(driver)], "compiling whole_driver.cpp")
        toolchain.compile_ime_emu(emu)
        # The SpacemiT objects go in as objects (the archive then contributes none of them): the map names each.
        spacemit = sorted((bld / SPACEMIT_OBJECTS).glob("*.o"))
        if not spacemit:
            raise ToolchainError(f"llama.cpp build: no SpacemiT objects in {bld / SPACEMIT_OBJECTS}", [])
        link_map = d / "whole_driver.map"
        _run([*_cxx(), "-static", f"-Wl,-Map={link_map}", str(driver), str(emu), *map(str, spacemit),
              *(str(bld / lib) for lib in LIBRARIES), "-lpthread", "-lm", "-o", str(d / "whole_driver")], "linking")
        tags = {str(driver): "excluded", str(emu): "excluded", **{str(o): "kernel" for o in spacemit}}
        ranges = code_ranges_from_map(link_map.read_text(), tags)
        if not any(tag == "kernel" for *_, tag in ranges):
            raise ToolchainError("llama.cpp build: the link map names no SpacemiT code", [])
        (d / "ranges.json").write_text(json.dumps(ranges))
        (d / "build_seconds").write_text(f"{time.monotonic() - started:.0f}\n")
        for p in (src, bld, link_map):  # hundreds of MB; the executable and its ranges are what is kept
            shutil.rmtree(p) if p.is_dir() else p.unlink()

    exe = cache.entry("llama-whole", inputs.key(), fill) / "whole_driver"
    ranges = [tuple(r) for r in json.loads((exe.parent / "ranges.json").read_text())]
    ranges += [(lo, hi, "image") for lo, hi in exec_segments(exe)]
    syms = symbols(exe)
    return WholeExe(exe, tuple(ranges), syms["imegen_bench_begin"][0], syms["imegen_bench_end"][0])


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"llama.cpp build: {what} failed", cmd, proc.returncode, proc.stdout[-20000:],
                             proc.stderr[-20000:])


# ---------------------------------------------------------------------------------------------
# Runs


@dataclass(frozen=True)
class Call:
    """One llama_decode: its tokens, first position, vmadot emulated, and the argmax of each output."""

    tokens: int
    start: int
    emulated: int
    argmax: tuple[int, ...]


def parse_calls(stdout: str) -> list[Call]:
    calls, outputs = [], []
    for line in stdout.splitlines():
        kind, *vals = line.split()
        if kind == "argmax":
            outputs.append(int(vals[0]))
        elif kind == "call":
            if calls:
                calls[-1] = Call(calls[-1].tokens, calls[-1].start, calls[-1].emulated, tuple(outputs))
            calls.append(Call(*map(int, vals), ()))
            outputs = []
    if calls:
        calls[-1] = Call(calls[-1].tokens, calls[-1].start, calls[-1].emulated, tuple(outputs))
    return calls


def run(b: WholeExe, gguf: Path, prefill: int, decode: int, *, logits: Path | None = None,
        arch: str = IME1_ARCH, threads: int = 1, timeout: float = 600, per_node: bool = False) -> list[Call]:
    """Run the driver uncounted (see toolchain.launch); with `logits`, every position's logits are written there;
    `per_node`: with the driver's --per-node (each node computed as a graph of its own)."""
    args = (["--per-node"] if per_node else []) + [str(gguf), str(threads), str(prefill), str(decode)]
    args += [str(logits)] if logits else []
    cmd = toolchain.launch(str(b.exe.resolve()), vlen=VLEN, ime=True) + args
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "SPACEMIT_CORE_ARCH": arch})
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"timed out after {timeout} s", cmd) from None
    if proc.returncode != 0:
        raise ToolchainError("llama.cpp whole_driver failed", cmd, proc.returncode, proc.stdout, proc.stderr)
    return parse_calls(proc.stdout)


def run_regions(b: WholeExe, gguf: Path, prefill: int, decode: int, *, arch: str = IME1_ARCH,
                threads: int = 1, per_node: bool = False) -> tuple[list[dict[str, int]], list[Call], list[str]]:
    """Counted run: one plugin region per llama_decode, or with `per_node` one per ggml node and per gap
    between nodes (the driver's --per-node); checks the plugin saw every vmadot the emulator ran, call by
    call. Returns the regions, the calls and each region's label: the driver's "gap", "node ..." or
    "call ..." line (a call's last region is its tail, labelled by its "call" line)."""
    args = (["--per-node"] if per_node else []) + [str(gguf), str(threads), str(prefill), str(decode)]
    r = run_counted(b.exe, args, list(b.ranges), begin=b.begin, end=b.end, vlen=VLEN, beat_bytes=BEAT_BYTES,
                    timeout=7200, guest_env={"SPACEMIT_CORE_ARCH": arch})
    calls = parse_calls(r.stdout)
    labels = [line for line in r.stdout.splitlines() if line.split(" ", 1)[0] in ("gap", "node", "call")]
    regions = [dict(x.values) for x in r.regions]
    if len(regions) != len(labels) or len(calls) != decode + 1:
        raise ToolchainError(f"llama.cpp whole_driver: {len(regions)} counted regions, {len(labels)} labels, "
                             f"{len(calls)} calls", [])
    for call, group in zip(calls, call_groups(regions, labels)):
        vmadot = sum(region.get("kernel.vmadot", 0) + region.get("callee.vmadot", 0) for region in group)
        if vmadot != call.emulated:
            raise ToolchainError(f"llama.cpp whole_driver: plugin counted {vmadot} vmadot, emulator {call.emulated}", [])
    return regions, calls, labels


def call_groups(regions: list, labels: list[str]) -> list[list]:
    """`regions` cut after each "call" label: one list per llama_decode call."""
    groups, current = [], []
    for region, label in zip(regions, labels):
        current.append(region)
        if label.startswith("call"):
            groups.append(current)
            current = []
    return groups


# ---------------------------------------------------------------------------------------------
# Counts


@functools.lru_cache(maxsize=None)
def model_digest(cfg: whole_gguf.QwenConfig) -> str:
    """sha256 of the GGUF file write_gguf makes for `cfg` (written to a temporary file, then removed):
    what a counted run's cache key names the model by."""
    path = cache.tmp_name(cache.root() / "llama-whole-model.gguf")
    cache.track(path)
    try:
        whole_gguf.write_gguf(cfg, path, tree() / "gguf-py")
        return cache.file_digest(path).hex()
    finally:
        cache.untrack(path)


def layer_run(cfg: whole_gguf.QwenConfig, prefill: int, decode: int, log=None,
              per_node: bool = False) -> tuple[list[dict[str, int]], list[str]]:
    """The regions of one counted run, prefill then `decode` single-token calls, and their labels
    (run_regions; cached by executable, model file and run)."""
    b = build(log)
    key = cache.key(files=(b.exe,), strings=(model_digest(cfg), str(prefill), f"decode {decode}", "threads 1",
                                             IME1_ARCH, str(VLEN), str(BEAT_BYTES), f"per-node {per_node}"))

    def fill(d: Path) -> None:
        if log:
            log(f"llama.cpp whole model: counting {cfg.n_layer} layer(s), prefill {prefill} + {decode} decode "
                f"step(s){', node by node' if per_node else ''}")
        gguf = d / "model.gguf"
        whole_gguf.write_gguf(cfg, gguf, tree(log) / "gguf-py")
        regions, _, labels = run_regions(b, gguf, prefill, decode, per_node=per_node)
        gguf.unlink()
        (d / "regions.json").write_text(json.dumps(regions, sort_keys=True))
        (d / "labels.json").write_text(json.dumps(labels))

    d = cache.entry("llama-whole-run", key, fill)
    return json.loads((d / "regions.json").read_text()), json.loads((d / "labels.json").read_text())


def phase_region(cfg: whole_gguf.QwenConfig, phase: str, context: int, log=None) -> dict[str, int]:
    """One llama_decode call's counts, from a run of a `context`-token prefill and two one-token calls.
    prefill: the first call. decode_first: the second, one token with `context` positions cached; it
    rebuilds llama.cpp's graph (the previous call's had `context` tokens). decode: the third, one token
    with context + 1 cached, the previous call's graph reused, as for every generated token but the first
    and those where the attended KV cells grow by llama.cpp's padding of 256 (at 512 cached it does)."""
    regions, _ = layer_run(cfg, context, 2, log)
    return regions[("prefill", "decode_first", "decode").index(phase)]


def extrapolate(one: dict[str, int], two: dict[str, int], layers: int) -> dict[str, int]:
    """total(L) = C1 + (L - 1)(C2 - C1), counter by counter (every plugin counter is additive)."""
    return {k: one.get(k, 0) + (layers - 1) * (two.get(k, 0) - one.get(k, 0)) for k in sorted(set(one) | set(two))}


def split(counts: dict[str, int]) -> dict[str, int]:
    """SpacemiT code (plugin tag kernel) vs the rest of the program (tag callee), all classes."""
    return {"spacemit": int(x60.total_instructions(counts, ("kernel",))),
            "rest": int(x60.total_instructions(counts, ("callee",)))}


def whole_model_counts(phase: str, context: int, log=None, cfg: whole_gguf.QwenConfig = whole_gguf.QWEN25_05B) -> dict:
    """llama.cpp's counts for Qwen2.5-0.5B at `cfg.n_layer` layers, one thread: phase 'prefill' (one
    llama_decode of `context` tokens, logits of the last position only), 'decode' (one token with
    `context` positions cached, the graph reused) or 'decode_first' (the same token as the first call
    after the prefill; phase_region). `counts` are the plugin's counters (x60.core_seconds takes them),
    `classes` their instruction classes, `split` SpacemiT code vs the rest; `per_layer` one layer's."""
    if phase not in PHASES + ("decode_first",):
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    if context < 1:
        raise ValueError("context must be >= 1")
    one, two = (phase_region(cfg.with_layers(n), phase, context, log) for n in (1, 2))
    total = extrapolate(one, two, cfg.n_layer)
    layer = {k: two.get(k, 0) - one.get(k, 0) for k in sorted(set(one) | set(two))}
    return {"phase": phase, "context": context, "tokens": context if phase == "prefill" else 1,
            "cached": {"prefill": 0, "decode_first": context, "decode": context + 1}[phase],
            "layers": cfg.n_layer, "threads": 1, "counts": total,
            "classes": {k: int(v) for k, v in x60.class_totals(total).items()},
            "instructions": int(x60.total_instructions(total)), "split": split(total),
            "per_layer": {"instructions": int(x60.total_instructions(layer)), "split": split(layer)},
            "layer1": split(one), "layer2": split(two)}


def node_call(cfg: whole_gguf.QwenConfig, phase: str, context: int, log=None) -> tuple[whole_nodes.CallRegions, dict]:
    """One call (phase_region's) counted node by node, the observation's cost taken off (whole_nodes.
    without_observation, against the same call counted as one region by the same executable), and that cost
    per node."""
    index = ("prefill", "decode_first", "decode").index(phase)
    regions, labels = layer_run(cfg, context, 2, log, per_node=True)
    whole, _ = layer_run(cfg, context, 2, log)
    call = whole_nodes.call_regions(call_groups(regions, labels)[index], call_groups(labels, labels)[index])
    return whole_nodes.without_observation(call, whole[index])


def per_node_figures(phase: str, context: int, log=None, cfg: whole_gguf.QwenConfig = whole_gguf.QWEN25_05B) -> dict:
    """llama.cpp's call at `cfg.n_layer` layers accounted node by node (whole_nodes): MODELED ms and core ms, DRAM
    bytes, instructions, the table by op, and what observing the nodes cost (instructions per node, taken off)."""
    (one, cost1), (two, cost2) = (node_call(cfg.with_layers(n), phase, context, log) for n in (1, 2))
    nodes, call = whole_nodes.extrapolate(one, two, cfg.n_layer)
    ops = whole_nodes.account(nodes, call)
    return {"ms_modeled": round(sum(f.seconds for f in ops) * 1e3, 4),
            "core_ms_modeled": round(sum(f.core_seconds for f in ops) * 1e3, 4),
            "dram_bytes": round(sum(f.dram_bytes for f in ops)),
            "instructions": round(sum(f.instructions for f in ops)),
            "nodes": round(sum(f.nodes for f in ops[:-1])),
            "by_op": [{"op": f.category, "nodes": round(f.nodes), "instructions": round(f.instructions),
                       "dram_bytes": round(f.dram_bytes), "ms": round(f.seconds * 1e3, 4),
                       "core_ms": round(f.core_seconds * 1e3, 4)} for f in ops],
            "observation_per_node": {"layers 1": round(x60.total_instructions(cost1)),
                                     "layers 2": round(x60.total_instructions(cost2))}}


METHOD = (
    "llama.cpp (llama-cpp-python {version} sdist) built whole by clang-19 for riscv64 with the SpacemiT CPU "
    "backend (GGML_CPU_RISCV64_SPACEMIT, IME1, RVV, Zfh/Zvfh, generic repack off; static, Release), run "
    "under qemu-riscv64 (VLEN 256) with SPACEMIT_CORE_ARCH=0xA03C (an A60 core: IME1) and imegen's SIGILL "
    "vmadot emulator linked in; llama.cpp's TCM path runs only on a K1 (/dev/tcm_sync_mem), so under QEMU "
    "it takes its non-TCM loop. Model: Qwen2.5-0.5B's architecture (hidden 896, 14 heads, 2 KV heads, "
    "head dim 64, FFN 4864, vocab 151936, tied embeddings) with random weights, every matrix Q4_0 "
    "(token embedding / lm_head too), F32 norms and q/k/v biases, F16 KV cache, llama.cpp's default "
    "context parameters (flash attention auto), one thread. Each llama_decode call (to llama_synchronize) "
    "is one counted region of imegen's instruction-count plugin: prefill P = one call of P tokens, "
    "logits of the last position only (llama.cpp's default; the last layer's FFN and the lm_head then "
    "run on that row only); decode at context P = the third call of a run of a P-token prefill and two "
    "one-token calls: one token at position P + 1 (P + 1 cached), llama.cpp reusing the previous call's "
    "graph as for every generated token but the first ('first_after_prefill': the second call, P cached, "
    "which rebuilds the graph; at 512 the attended KV cells also grow from 512 to 768, llama.cpp padding "
    "them to 256). Runs with 1 and 2 layers; total(24) = C1 + 23 (C2 - C1), exact since a layer's work does not depend on the layer count. "
    "'spacemit' counts instructions in the objects of ggml-cpu/spacemit (IME1 matmul kernels and their "
    "A quantization, RVV norms, binary ops, copies), 'rest' everything else the call executes (ggml's "
    "generic ops incl. attention, llama.cpp's graph building and scheduling, libc); the IME emulator's own "
    "instructions are excluded, each vmadot counts once. Code shared through inline and template functions "
    "(COMDAT) is counted where the linker kept it, the SpacemiT objects coming first. Instruction counts "
    "are measured; times are MODELED (imegen/perf/model/x60.py). 'whole_call_modeled_x60_ms' (the whole call as "
    "one region): 'core' is x60.core_seconds of the counts (one core, DRAM ignored), 'weights_dram' the Q4_0 "
    "matrices ('matrix_bytes') read once at the model's effective DRAM bandwidth (KV cache and activations not "
    "counted), 'max' the larger. 'per_node': the same call counted again with a region per ggml node (the "
    "driver's --per-node, through llama.cpp's graph-eval callback; logits bit-identical), the cost of observing "
    "(a graph launch per node, 'observation_per_node' instructions, measured against the whole-call count of the "
    "same executable) taken off evenly, so its instructions are the whole call's; each node modeled as "
    "max(core / its cores, its DRAM bytes / bandwidth) and summed (whole_nodes.py: cores min(4, ggml's split of "
    "the op), DRAM its tensors in and out as stored, the embedding's gathered rows, the K/V rows written and the "
    "K/V cells attended), the call's own work ('llama.cpp call': graph, inputs, scheduling, logits) on one "
    "core; 'by_op' groups the nodes by ggml op, multiplicities included."
)


def results(log=None) -> dict:
    """Every phase x context, for bench/results/llama_whole_model.json; a row's `counts` are the plugin's
    non-zero counters at 24 layers (x60.core_cycles takes them: the file can be modeled without QEMU)."""
    rows = []
    weights_s = whole_gguf.matrix_bytes(whole_gguf.QWEN25_05B) / x60.X60.dram_effective
    for context in CONTEXTS:
        for phase in PHASES:
            c = whole_model_counts(phase, context, log)
            core_s = x60.core_seconds(c["counts"])
            row = {k: c[k] for k in ("phase", "context", "tokens", "cached", "layers", "threads", "instructions",
                                     "split", "classes", "per_layer")}
            row["counts"] = {k: v for k, v in c["counts"].items() if v}
            row["whole_call_modeled_x60_ms"] = {"core": round(core_s * 1e3, 3), "weights_dram": round(weights_s * 1e3, 3),
                                                "max": round(max(core_s, weights_s) * 1e3, 3)}
            row["per_node"] = per_node_figures(phase, context, log)
            if phase == "decode":
                first = whole_model_counts("decode_first", context, log)
                row["first_after_prefill"] = {k: first[k] for k in ("cached", "instructions", "split")}
            rows.append(row)
    return {"method": METHOD.format(version=VERSION), "model": asdict(whole_gguf.QWEN25_05B),
            "matrix_bytes": whole_gguf.matrix_bytes(whole_gguf.QWEN25_05B), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m imegen.perf.baselines.llama_cpp.whole_model",
                                     description="Count llama.cpp's whole Qwen2.5-0.5B (Q4_0) under QEMU.")
    parser.add_argument("--write", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    try:
        res = results(log=lambda m: print(m, file=sys.stderr, flush=True))
    except (ToolchainError, LlamaUnavailable, cache.CacheError, OSError) as e:
        print(f"error: {str(e).splitlines()[0] if str(e) else e}", file=sys.stderr)
        return 1
    text = json.dumps(res, indent=1) + "\n"
    if args.write:
        args.write.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
