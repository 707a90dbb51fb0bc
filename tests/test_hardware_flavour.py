"""The `hardware` flavour of the custom-op library (what a K1 loads), and `ort-library --ort-include`.

The hardware .so is inspected with the cross binutils: it exports only RegisterCustomOps and
imegen_ort_stats, holds nothing of the IME emulator (no imegen_ime_emu_* symbol, no sigaction to
install a SIGILL handler), and needs no glibc symbol version newer than GLIBC_2.27 (the first glibc
for riscv64, so any riscv64 distribution loads it). The same checks flag the qemu flavour, so they can
fail. It then runs in Debian's real riscv64 ORT 1.23 under QEMU, against stock ORT 1.23: nodes that map
to RVV kernels compute what stock ORT computes; nodes that map to IME kernels, on QEMU's harts (no IME,
and no emulator in this flavour), run on the spec's fallback kernel or fail session creation naming the
IME harts, and never die by SIGILL.
"""

import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import imegen
from imegen import toolchain
from imegen.cli import main
from imegen.ort import customop, sysroot
from imegen.ort import ort_check as oc
from imegen.ort.customop import CustomOpError, build_library, parse_stats
from imegen.ort.riscv import OrtError, RiscvSession

BINUTILS = "riscv64-linux-gnu-"
pytestmark = pytest.mark.skipif(bool(toolchain.missing_tools()) or shutil.which(BINUTILS + "nm") is None,
                                reason="needs the cross toolchains, binutils and qemu-riscv64")

IME = "target = ime bits = 4 block = 32 zero_point = asymmetric compute = int8"
RVV_FP32 = "target = rvv vlen = 128 bits = 4 block = 64 zero_point = symmetric compute = fp32"
# IME kernels for int8 block-32 nodes, RVV kernels for fp32 block-64 ones
SPEC = (f"kernel ime_gemv {{ op = gemv tile = 1x16 {IME} }}\n"
        f"kernel ime_gemm {{ op = gemm tile = 4x16 {IME} }}\n"
        f"kernel rvv_gemv {{ op = gemv tile = 1x16 {RVV_FP32} }}\n"
        f"kernel rvv_gemm {{ op = gemm tile = 4x16 {RVV_FP32} }}\n")
# the IME kernels again, with an RVV kernel for the slices no IME hart can take
IME_FALLBACK = "target = rvv vlen = 128 bits = 4 block = 32 zero_point = asymmetric compute = int8 fallback = yes"
SPEC_WITH_FALLBACK = SPEC + f"kernel rvv_fallback {{ op = gemm tile = 2x16 {IME_FALLBACK} }}\n"
MAX_GLIBC = (2, 27)


@pytest.fixture(scope="module")
def specs():
    return imegen.load_spec(SPEC)


@pytest.fixture(scope="module")
def hardware_lib(specs):
    return build_library(specs, "hw.imegen", flavour="hardware")


def binutil(tool, *args):
    return subprocess.run([BINUTILS + tool, *args], capture_output=True, text=True, check=True).stdout


def dynamic_symbols(lib, which):
    """Names in the dynamic symbol table: "--defined-only" (exported) or "--undefined-only" (imported)."""
    return {line.split()[-1].split("@")[0] for line in binutil("nm", "-D", which, str(lib)).splitlines() if line.strip()}


def glibc_versions(lib):
    """Every GLIBC_x.y a dynamic symbol (objdump -T) or the version needs (readelf -V) name."""
    text = binutil("objdump", "-T", str(lib)) + binutil("readelf", "-V", str(lib))
    return {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", text)}


def hardware_problems(lib):
    """How `lib` breaks the hardware flavour's contract (empty: it keeps it)."""
    problems = []
    exported = dynamic_symbols(lib, "--defined-only")
    if exported != {"RegisterCustomOps", "imegen_ort_stats"}:
        problems.append(f"exports {sorted(exported)}")
    emulator = sorted({s for s in binutil("nm", str(lib)).split() if s.startswith("imegen_ime_emu")})
    if emulator:
        problems.append(f"holds the IME emulator: {emulator}")
    handlers = dynamic_symbols(lib, "--undefined-only") & {"sigaction", "signal", "sigset", "sysv_signal"}
    if handlers:
        problems.append(f"installs signal handlers: {sorted(handlers)}")
    newer = sorted(v for v in glibc_versions(lib) if v > MAX_GLIBC)
    if newer:
        problems.append(f"needs glibc {newer}")
    return problems


# ------------------------------------------------------------------------------------------ the .so itself
def test_hardware_flavour_is_what_a_k1_loads(hardware_lib):
    assert hardware_problems(hardware_lib) == []
    # the newest glibc symbol version it needs is the first riscv64 glibc's: every riscv64 distribution has it
    assert max(glibc_versions(hardware_lib)) == MAX_GLIBC
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", binutil("readelf", "-d", str(hardware_lib)))
    assert set(needed) <= {"libc.so.6", "libm.so.6", "ld-linux-riscv64-lp64d.so.1"}, needed


def test_the_inspection_flags_the_qemu_flavour(specs):
    """The checks above can fail: the qemu flavour (IME emulator linked in) breaks two of them."""
    problems = hardware_problems(build_library(specs, "hw.imegen", flavour="qemu"))
    assert [p.split(":")[0] for p in problems] == ["holds the IME emulator", "installs signal handlers"], problems


# ------------------------------------------------------------------------------ in real ORT 1.23 under QEMU
def matmul_nbits(name, a, y, qw, level, inits):
    inits += [numpy_helper.from_array(qw.data, f"{name}_B"), numpy_helper.from_array(qw.scales, f"{name}_scales")]
    inputs = [a, f"{name}_B", f"{name}_scales"]
    if qw.zero_points is not None:
        inits.append(numpy_helper.from_array(qw.zero_points, f"{name}_zp"))
        inputs.append(f"{name}_zp")
    return helper.make_node("MatMulNBits", inputs, [y], name=name, domain="com.microsoft", K=qw.K, N=qw.N,
                            bits=qw.bits, block_size=qw.block_size, accuracy_level=level)


def chain_model(rng, dims, block, level, symmetric):
    """A -> MatMulNBits -> ... -> Y over weights K = dims[0] -> dims[1] -> ..., quantized by ORT's own quantizer."""
    inits, nodes = [], []
    for i, (K, N) in enumerate(zip(dims, dims[1:])):
        qw = oc.ort_quantized_weights(rng.normal(0, 0.25, (K, N)).astype(np.float32), 4, block, symmetric)
        nodes.append(matmul_nbits(f"mm{i}", "A" if i == 0 else f"h{i}", "Y" if i == len(dims) - 2 else f"h{i + 1}",
                                  qw, level, inits))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def stock_and_imegen(tmp_path, model, specs, lib, feeds, version="1.23", threads=4):
    """Y per feed from stock ORT and from ORT + `lib` on the rewritten model, and the library's stats."""
    onnx.save(model, tmp_path / "stock.onnx")
    moved = [d.moved for d in imegen.rewrite_model(model, specs)]
    assert moved and all(moved), moved
    onnx.save(model, tmp_path / "imegen.onnx")
    with RiscvSession(tmp_path / "stock.onnx", version) as s:
        stock = [s.run({"A": a})["Y"] for a in feeds]
    with RiscvSession(tmp_path / "imegen.onnx", version, custom_ops=lib, threads=threads) as s:
        mine = [s.run({"A": a})["Y"] for a in feeds]
        stats = s.stats()
    return stock, mine, stats


def assert_within_ort_tolerance(stock, mine, level):
    a_tol, r_tol = oc.TOLERANCE[level]
    for y0, y1 in zip(stock, mine):
        assert y1.shape == y0.shape
        err = np.abs(y1.astype(np.float64) - y0)
        assert (err <= a_tol + r_tol * np.abs(y0)).all(), (y0.shape, float(err.max()))


def feeds_for(rng, K):
    """M = 1 (gemv), M = 5 and a 2x3xK A (gemm)."""
    return [rng.normal(0, 0.25, shape).astype(np.float32) for shape in [(1, K), (5, K), (2, 3, K)]]


def test_rvv_nodes_run_in_real_ort_123(tmp_path, specs, hardware_lib):
    rng = np.random.default_rng(7)
    model = chain_model(rng, [96, 80, 40], 64, 0, True)
    stock, mine, stats = stock_and_imegen(tmp_path, model, specs, hardware_lib, feeds_for(rng, 96))
    assert_within_ort_tolerance(stock, mine, 0)
    calls = parse_stats(stats)
    # two nodes: each ran rvv_gemv at M = 1 and rvv_gemm at M = 5 and 2x3; IME kernels never
    assert (calls["rvv_gemv"], calls["rvv_gemm"], calls["ime_gemv"], calls["ime_gemm"]) == (2, 4, 0, 0), stats
    assert "vmadots" not in calls  # no emulator to count them


def ime_model(rng):
    return chain_model(rng, [64, 48], 32, 4, False)  # one int8 block-32 node: the IME kernels'


def test_ime_nodes_on_harts_without_ime_run_on_the_fallback(tmp_path):
    """QEMU's harts have no IME (its /proc/cpuinfo has no marchid) and this flavour has no emulator: the
    IME kernels' slices go to the spec's fallback kernel, never to a vmadot (which would be SIGILL)."""
    specs = imegen.load_spec(SPEC_WITH_FALLBACK)
    lib = build_library(specs, "hw.imegen", flavour="hardware")
    rng = np.random.default_rng(11)
    stock, mine, stats = stock_and_imegen(tmp_path, ime_model(rng), specs, lib, feeds_for(rng, 64))
    assert_within_ort_tolerance(stock, mine, 4)
    slices = re.search(r"^ime_slices on_ime (\d+) pinned (\d+) fallback (\d+)$", stats, re.M)
    assert slices, stats
    on_ime, _, rerouted = map(int, slices.groups())
    assert on_ime == 0 and rerouted > 0, stats
    assert re.search(r"^ime_harts none ", stats, re.M), stats
    assert parse_stats(stats)["rvv_fallback"] > 0, stats


def test_ime_nodes_without_a_fallback_fail_session_creation(tmp_path, specs, hardware_lib):
    model = ime_model(np.random.default_rng(12))
    imegen.rewrite_model(model, specs)
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(OrtError) as e:
        RiscvSession(tmp_path / "m.onnx", "1.23", custom_ops=hardware_lib)
    assert "SIGILL" not in str(e.value) and "process exited" not in str(e.value)
    assert re.search(r"node 'mm0': kernel ime_\w+ uses SpacemiT IME, and no hart has it here \(IME harts from .*: none\)",
                     str(e.value)), str(e.value)


# ---------------------------------------------------------------------------------------- --ort-include
def fake_header(folder, version_line):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "onnxruntime_c_api.h").write_text(f"#pragma once\n{version_line}\nstruct OrtApi;\n")
    return folder


def test_ort_include_is_checked(tmp_path):
    with pytest.raises(CustomOpError, match="ORT include folder .*/nowhere: no such folder"):
        customop.checked_ort_include(tmp_path / "nowhere")
    with pytest.raises(CustomOpError, match=r"no onnxruntime_c_api.h in it \(give the folder holding"):
        customop.checked_ort_include(tmp_path)
    old = fake_header(tmp_path / "old", "#define ORT_API_VERSION 20")
    with pytest.raises(CustomOpError, match="ORT_API_VERSION 20, but the library uses ORT C API 21 calls"):
        customop.checked_ort_include(old)
    with pytest.raises(CustomOpError, match="no ORT_API_VERSION define"):
        customop.checked_ort_include(fake_header(tmp_path / "other", "#define OTHER 21"))
    for version, api in (("1.21", 21), ("1.23", 23)):
        folder = sysroot.include_dir(sysroot.ensure(version))
        assert customop.checked_ort_include(folder) == folder
        assert customop.ort_api_version(folder / "onnxruntime_c_api.h") == api


def test_ort_library_command_refuses_a_bad_include(tmp_path, capsys):
    spec = tmp_path / "k.imegen"
    spec.write_text(SPEC)
    fake_header(tmp_path / "old", "#  define ORT_API_VERSION 17")
    for folder, said in ((tmp_path / "nowhere", "no such folder"), (tmp_path / "old", "ORT_API_VERSION 17")):
        assert main(["ort-library", str(spec), "--ort-include", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and said in err and len(err.strip().splitlines()) == 1, err


def test_a_riscv64_host_builds_against_its_own_ort_headers(tmp_path, monkeypatch):
    """Simulated riscv64 host: the system's header first, Debian's cached 1.21 only when there is none."""
    system = tmp_path / "usr/include/onnxruntime"
    shutil.copytree(sysroot.include_dir(sysroot.ensure("1.23")), system)
    monkeypatch.setattr(toolchain, "current_host", lambda: toolchain.Host("riscv64", 256, (0, 1, 2, 3), True))
    monkeypatch.setattr(customop, "SYSTEM_ORT_INCLUDES", (system, tmp_path / "usr/include"))
    fetched = []
    monkeypatch.setattr(sysroot, "ensure", lambda version: fetched.append(version) or tmp_path / "debian")
    assert customop.ort_include_dir() == system and fetched == []
    assert customop.ort_include_dir(tmp_path / "usr/include/onnxruntime") == system  # given: used as given
    (system / "onnxruntime_c_api.h").unlink()
    assert customop.ort_include_dir() == sysroot.include_dir(tmp_path / "debian") and fetched == ["1.21"]
    monkeypatch.setattr(toolchain, "current_host", lambda: toolchain.Host("x86_64"))
    fake_header(system, "#define ORT_API_VERSION 23")
    assert customop.ort_include_dir() == sysroot.include_dir(tmp_path / "debian")  # x86: never the host's headers


def test_library_built_against_ort_123_headers_needs_ort_123(tmp_path, specs):
    """--ort-include is what the library is built against: built on ORT 1.23's header it asks ORT for API 23,
    so it runs in ORT 1.23, and ORT 1.21 (API 21) does not give it that API: the session fails."""
    include = sysroot.include_dir(sysroot.ensure("1.23"))
    lib = build_library(specs, "hw.imegen", flavour="hardware", ort_include=include)
    assert lib != build_library(specs, "hw.imegen", flavour="hardware")  # another cache entry
    assert hardware_problems(lib) == []
    rng = np.random.default_rng(5)
    model = chain_model(rng, [64, 24], 64, 0, True)
    stock, mine, stats = stock_and_imegen(tmp_path, model, specs, lib, feeds_for(rng, 64)[:2], threads=1)
    assert_within_ort_tolerance(stock, mine, 0)
    assert parse_stats(stats)["rvv_gemv"] == 1
    with pytest.raises(OrtError, match=r"API version 23|ai\.imegen"):  # the library says so, or ORT misses the op
        RiscvSession(tmp_path / "imegen.onnx", "1.21", custom_ops=lib)
