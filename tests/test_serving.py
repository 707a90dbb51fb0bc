"""Which kernel runs a MatMulNBits node, and on which harts: the custom-op library in Debian's real
riscv64 onnxruntime 1.23 under QEMU against imegen/ort/serving.py's rule, and against stock ORT's output.

- Routing: a node runs the kernels chosen for its weight shape (`shapes`) and, per Run, for its rows of A
  (`min_rows`); the library's own report (imegen_ort_stats() "route" lines, call counts) must say
  exactly what serving.serve() says.
- IME harts: the library runs a vmadot only on a thread confined to the harts IMEGEN_IME_HARTS names
  (under QEMU the emulator kills a vmadot elsewhere, as a K1's cores 4-7 would); with none named, every
  slice runs on the fallback kernel and no vmadot is issued; outputs stay within ORT's tolerance.
- The hart-list and /proc/cpuinfo parsers (runtime/harts.h) on a K1's and QEMU's texts.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import imegen
from imegen import toolchain
from imegen.ort import ort_check as oc
from imegen.ort.customop import ime_harts, parse_routes, parse_stats
from imegen.ort.model_check import compare_outputs
from imegen.ort.riscv import OrtError, RiscvSession
from imegen.ort.serving import NodeNeeds, serve

import ort_two_nodes

K = 128
SPEC = """
defaults { bits = 4 block = 32 zero_point = symmetric compute = int8 }
kernel a_gemv      { op = gemv target = ime tile = 1x16 shapes = 64x128, 96x256 }
kernel any_gemv    { op = gemv target = ime tile = 1x16 k_unroll = 4 }
kernel a_gemm      { op = gemm target = ime tile = 4x16 shapes = 64x128 }
kernel a_gemm_long { op = gemm target = ime tile = 8x8 panel = 16 shapes = 64x128 min_rows = 8 }
kernel any_gemm    { op = gemm target = ime tile = 4x8 panel = 16 }
kernel fb          { op = gemm target = rvv vlen = 256 tile = 2x16 fallback = yes }
"""
NODES = {"n_a": 64, "n_any": 48}  # name -> N; both K = 128


def two_node_model(rng):
    return ort_two_nodes.two_node_model(rng, NODES, K, symmetric=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serving")
    specs = imegen.load_spec(SPEC)
    model = two_node_model(np.random.default_rng(7))
    onnx.save(model, tmp / "stock.onnx")
    decisions = imegen.rewrite_model(model, specs)
    assert all(d.moved for d in decisions), decisions
    onnx.save(model, tmp / "imegen.onnx")
    rng = np.random.default_rng(8)
    feeds = [{"A": rng.normal(0, 0.5, (M, K)).astype(np.float32)} for M in (1, 5, 9)]
    with RiscvSession(tmp / "stock.onnx", "1.23") as s:
        stock = [s.run(f) for f in feeds]
    return specs, tmp / "imegen.onnx", imegen.build_ort_library(specs), feeds, stock


def run_imegen(setup, monkeypatch, harts: str | None, *, cpus: set[int] | None = None):
    """Every feed through ORT + imegen on the harts named (ort_two_nodes.run_with_harts): (stats text, outputs)."""
    _, model, lib, feeds, _ = setup
    return ort_two_nodes.run_with_harts(model, lib, feeds, monkeypatch, harts, cpus=cpus)


def assert_within_ort_tolerance(setup, outs):
    *_, stock = setup
    for y0, y1 in zip(stock, outs):
        assert all(o.ok for o in compare_outputs(y0, y1, 4)), compare_outputs(y0, y1, 4)


def test_each_node_runs_the_kernels_chosen_for_its_shape_and_rows(setup, monkeypatch):
    specs = setup[0]
    text, outs = run_imegen(setup, monkeypatch, None)
    assert_within_ort_tolerance(setup, outs)
    routes = parse_routes(text)
    for name, N in NODES.items():
        expect = serve(specs, NodeNeeds(bits=4, block=32, accuracy_level=4, asymmetric=False, bias=False, N=N, K=K))
        assert routes[name] == expect.describe(), (name, routes[name])
    # n_a: M = 1, 5, 9 on its own kernels (9 >= min_rows 8); n_any on the generic ones; no fallback
    assert serve(specs, NodeNeeds(4, 32, 4, False, False, N=64, K=K)).kernel_for(9) == "a_gemm_long"
    calls = parse_stats(text)
    assert {k: calls[k] for k in ("a_gemv", "a_gemm", "a_gemm_long", "any_gemv", "any_gemm", "fb")} == \
        {"a_gemv": 1, "a_gemm": 1, "a_gemm_long": 1, "any_gemv": 1, "any_gemm": 2, "fb": 0}
    assert calls["slices_fallback"] == 0 and calls["vmadots"] > 0
    assert ime_harts(text).startswith("0-") and "IME emulator" in ime_harts(text)
    # symmetric 4-bit: gemv and gemm kernels share a packed layout (customop.layouts), so each node holds one
    # copy of B: 2 nodes x (N x 4 blocks) x (16 code bytes + a 4-byte scale), N padded to the 16-column panel
    assert calls["packed_bytes"] == sum((N + 15) // 16 * 16 * (K // 32) * (16 + 4) for N in NODES.values())


def test_no_ime_hart_runs_every_slice_on_the_fallback(setup, monkeypatch):
    text, outs = run_imegen(setup, monkeypatch, "")
    assert_within_ort_tolerance(setup, outs)
    stats = parse_stats(text)
    assert stats["vmadots"] == 0 and stats["fb"] == 6 and stats["slices_fallback"] > 0
    assert stats["slices_on_ime"] == stats["slices_pinned"] == 0
    assert ime_harts(text) == "none (from IMEGEN_IME_HARTS)"


def test_threads_on_a_hart_without_ime_are_pinned_to_one_with_it(setup, monkeypatch):
    """The QEMU process starts on host CPU 1; only hart 0 has IME. Every IME slice must move to hart 0:
    the emulator kills the process on a vmadot issued on hart 1 (IMEGEN_IME_HARTS is the K1's rule)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs two CPUs (CI has two): one with IME, one without")
    text, outs = run_imegen(setup, monkeypatch, "0", cpus={1})
    assert_within_ort_tolerance(setup, outs)
    stats = parse_stats(text)
    assert stats["vmadots"] > 0 and stats["slices_fallback"] == 0 and stats["slices_pinned"] > 0
    assert stats["slices_on_ime"] == 0  # every thread started on hart 1


def test_a_vmadot_on_a_hart_without_ime_dies(monkeypatch):
    """The counter-test of the one above: the emulator does kill a vmadot on a hart IMEGEN_IME_HARTS
    excludes, so that test could fail. An IME kernel's test driver (not the library: nothing pins it),
    started on host CPU 1 with only hart 0 named."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs two CPUs (CI has two): one with IME, one without")
    kernel = imegen.build_kernel(imegen.load_spec(SPEC), "any_gemv")
    qw = oc.ort_quantized_weights(np.random.default_rng(0).normal(0, 0.25, (K, 16)).astype(np.float32), 4, 32, True)
    A = np.ones((1, K), np.float32)
    # imegen runs such a driver pinned to the named harts (toolchain.launch); here it must not be
    monkeypatch.setattr(toolchain, "_on_named_ime_harts", lambda ime: [])
    with ort_two_nodes.on_cpus({1}):
        monkeypatch.setenv("IMEGEN_IME_HARTS", "1")
        assert kernel.run(A, qw.data, qw.scales, K=K).shape == (1, 16)  # hart 1 named: it runs
        monkeypatch.setenv("IMEGEN_IME_HARTS", "0")
        with pytest.raises(toolchain.ToolchainError, match="vmadot on hart 1, which IMEGEN_IME_HARTS does not name"):
            kernel.run(A, qw.data, qw.scales, K=K)


def test_a_malformed_hart_list_fails_the_session(setup, monkeypatch):
    _, model, lib, _, _ = setup
    monkeypatch.setenv("IMEGEN_IME_HARTS", "0-")
    with pytest.raises(OrtError, match='IMEGEN_IME_HARTS="0-" is not a hart list'):
        RiscvSession(model, "1.23", custom_ops=lib)


def test_ime_kernels_without_fallback_and_without_ime_harts_are_refused(tmp_path, monkeypatch):
    specs = imegen.load_spec("\n".join(line for line in SPEC.splitlines() if "fallback" not in line))
    model = two_node_model(np.random.default_rng(7))
    imegen.rewrite_model(model, specs)
    onnx.save(model, tmp_path / "m.onnx")
    monkeypatch.setenv("IMEGEN_IME_HARTS", "none")
    with pytest.raises(OrtError, match=r"node 'n_a': kernel a_gemv uses SpacemiT IME, and no hart has it here .*"
                                       r"no fallback kernel"):
        RiscvSession(tmp_path / "m.onnx", "1.23", custom_ops=imegen.build_ort_library(specs))


# ------------------------------------------------------------------------------------ runtime/harts.h
HARTS_DRIVER = r"""
#define _GNU_SOURCE
#include "harts.h"
int main(int argc, char **argv) {
    cpu_set_t set;
    if (argc > 1 && strncmp(argv[1], "0x", 2)) { /* a hart list */
        if (imegen_parse_harts(argv[1], &set)) { puts("bad"); return 0; }
    } else { /* a cpuinfo text on stdin; argv[1]: the IME harts' marchid (default the K1's A60) */
        const unsigned long long marchid = argc > 1 ? strtoull(argv[1], NULL, 16) : IMEGEN_MARCHID_A60;
        printf("reported %d: ", imegen_harts_from_cpuinfo(stdin, &set, marchid));
    }
    for (int h = 0; h < 16; h++) if (CPU_ISSET(h, &set)) printf("%d ", h);
    puts(CPU_COUNT(&set) ? "" : "none");
    return 0;
}
"""


@pytest.fixture(scope="module")
def harts_exe(tmp_path_factory):
    d = tmp_path_factory.mktemp("harts")
    (d / "t.c").write_text(HARTS_DRIVER)
    return toolchain.compile_c([d / "t.c"], d / "t", host=True, include_dirs=[toolchain.RUNTIME_DIR])


@pytest.mark.parametrize("text, expect", [
    ("0-3", "0 1 2 3 "), ("0,2", "0 2 "), ("1-2,5", "1 2 5 "), ("", "none"), ("none", "none"), ("7", "7 "),
    ("3-1", "bad"), ("a", "bad"), ("0-", "bad"), ("-1", "bad"), ("1,,2", "bad"), ("0,", "bad"), ("99999", "bad"),
    (" none", "bad"), ("0 ,1", "bad"), ("2000", "bad"), ("+1", "bad"), ("0-+3", "bad"),
])
def test_hart_lists(harts_exe, text, expect):
    """runtime/harts.h, and toolchain.parse_harts (imegen's own runs) reading the list the same way."""
    assert subprocess.run([harts_exe, text], capture_output=True, text=True).stdout.strip() == expect.strip()
    try:
        mine = " ".join(map(str, toolchain.parse_harts(text))) or "none"
    except toolchain.HostError:
        mine = "bad"
    assert mine == expect.strip()


def cpuinfo(marchids):
    return "".join(f"processor\t: {i}\nhart\t\t: {i}\nisa\t\t: rv64imafdcv\n"
                   + (f"marchid\t\t: {m:#x}\n" if m is not None else "") + "\n" for i, m in enumerate(marchids))


X60, A60, X100, A100 = 0x8000000058000001, 0x8000000041000001, 0x8000000058000002, 0x8000000041000002


@pytest.mark.parametrize("marchids, expect", [
    ([X60] * 8, "reported 8: 0 1 2 3"),  # a K1: eight X60, IME on cores 0-3 (llama.cpp's rule)
    ([None] * 4, "reported 0: none"),  # QEMU: no marchid at all
    ([X60] * 4, "reported 4: none"),  # four X60 are not a K1
    ([A60] * 2 + [X60] * 2, "reported 4: 0 1"),  # harts that say A60 themselves
    ([X100] * 8, "reported 8: none"),  # a K3's X100 cores: no IME1
])
def test_cpuinfo_marchids(harts_exe, marchids, expect):
    """runtime/harts.h, and toolchain.ime_harts (imegen's own runs on a riscv64 host) reading the same text alike."""
    got = subprocess.run([harts_exe], input=cpuinfo(marchids), capture_output=True, text=True).stdout.strip()
    assert got == expect
    assert (" ".join(map(str, toolchain.ime_harts(cpuinfo(marchids)))) or "none") == expect.split(": ")[1].strip()


@pytest.mark.parametrize("marchids, expect", [
    ([X100] * 8 + [A100] * 8, "reported 16: 8 9 10 11 12 13 14 15"),  # a K3: IME2 on its A100 cores only
    ([X60] * 8, "reported 8: none"),  # a K1 has no IME2, and the K1's cores-0-3 rule is not the K3's
    ([A60] * 4, "reported 4: none"),
    ([None] * 4, "reported 0: none"),  # QEMU
])
def test_cpuinfo_marchids_of_a_k3(harts_exe, marchids, expect):
    """The IME2 harts a K3 library finds (marchid A100, llama.cpp's ime_env.cpp), and imegen's own reading alike."""
    got = subprocess.run([harts_exe, hex(A100)], input=cpuinfo(marchids), capture_output=True, text=True).stdout.strip()
    assert got == expect
    mine = toolchain.ime_harts(cpuinfo(marchids), marchid=A100)
    assert (" ".join(map(str, mine)) or "none") == expect.split(": ")[1].strip()


# --------------------------------------------------------------------------- one packed copy per layout
PACKING_SPEC = """
defaults { bits = 4 block = 32 zero_point = asymmetric compute = int8 }
kernel p_gemv    { op = gemv target = ime tile = 1x16 }
kernel p_gemm    { op = gemm target = ime tile = 4x16 }
kernel p_gemm8   { op = gemm target = ime tile = 8x8 panel = 16 }
kernel p_rvv     { op = gemm target = rvv vlen = 256 tile = 2x16 }
kernel p_p32     { op = gemm target = ime tile = 4x16 panel = 32 }
kernel p_sep     { op = gemm target = ime tile = 4x16 scales = separate }
kernel p_fp16    { op = gemm target = ime tile = 4x16 scale_type = fp16 }
kernel p_il      { op = gemm target = ime tile = 4x16 unpack = interleaved }
kernel p_staged  { op = gemm target = ime tile = 8x8 panel = 16 stage_b = m_block }
"""
PACK_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
{includes}
/* Packs one B with every kernel; prints each kernel's packed bytes as a hash line. */
int main(void) {{
    enum {{ N = 40, K = 96, KB = K / 32 }};
    static uint8_t b[N * KB * 16], zp[N * ((KB + 1) / 2)];
    static float scales[N * KB];
    for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)(i * 131 + 7);
    for (size_t i = 0; i < sizeof zp; i++) zp[i] = (uint8_t)(i * 71 + 3);
    for (size_t i = 0; i < N * KB; i++) scales[i] = 0.01f * (float)(i % 97 + 1);
{calls}
    return 0;
}}
"""
PACK_CALL = """    {{
        size_t size = {k}_packed_b_size(N, K);
        unsigned char *p = malloc(size + 8);
        {k}_pack_b(N, K, b, scales, zp, p);
        unsigned long long h = 1469598103934665603ull;
        for (size_t i = 0; i < size; i++) h = (h ^ p[i]) * 1099511628211ull;
        printf("{k} %zu %llx\\n", size, h);
        free(p);
    }}
"""


def test_kernels_of_one_layout_pack_identical_bytes(tmp_path):
    """The library packs B once per layout id (customop.layouts) and lets every kernel of that id read it:
    kernels with one id must pack byte-identical B; kernels with different ids here all differ (so the id
    is not coarser than the bytes)."""
    from imegen.ort.customop import layouts
    from imegen.render import render_kernel

    from imegen.plan import plan_kernel

    plans = [plan_kernel(s) for s in imegen.load_spec(PACKING_SPEC)]
    for plan in plans:
        for name, text in render_kernel(plan, "packing.imegen").items():
            (tmp_path / name).write_text(text)
    (tmp_path / "main.c").write_text(PACK_DRIVER.format(
        includes="\n".join(f'#include "{p.name}.h"' for p in plans),
        calls="".join(PACK_CALL.format(k=p.name) for p in plans)))
    exe = toolchain.compile_c([tmp_path / "main.c", *(tmp_path / f"{p.name}.c" for p in plans)], tmp_path / "pack",
                              include_dirs=[tmp_path])
    got = dict(line.split(" ", 1) for line in toolchain.run(exe).stdout.decode().splitlines())
    ids = layouts(plans)
    for a in plans:
        for b in plans:
            same = ids[a.name] == ids[b.name]
            assert (got[a.name] == got[b.name]) == same, (a.name, b.name, same, got[a.name], got[b.name])
    assert len(set(ids.values())) < len(plans)  # some kernels do share a layout here


def test_an_initializer_a_graph_input_may_override_is_not_constant(tmp_path, setup):
    """ORT gives a custom op no constant for an initializer that is also a graph input (the caller may
    feed it), so the library cannot pack it: rewrite keeps such a node, with the reason, and a node moved
    anyway fails session creation in the real ORT naming it."""
    specs, lib = setup[0], setup[2]
    model = two_node_model(np.random.default_rng(7))
    b = next(t for t in model.graph.initializer if t.name == "n_a_B")
    model.graph.input.append(helper.make_tensor_value_info("n_a_B", TensorProto.UINT8, list(b.dims)))
    decisions = {d.node: d for d in imegen.rewrite_model(model, specs)}
    assert not decisions["n_a"].moved and "B (n_a_B) is not a constant initializer" in decisions["n_a"].detail
    assert decisions["n_any"].moved
    for node in model.graph.node:
        node.domain = "ai.imegen"
    onnx.save(model, tmp_path / "forced.onnx")
    with pytest.raises(OrtError, match="node 'n_a': B is not a constant initializer"):
        RiscvSession(tmp_path / "forced.onnx", "1.23", custom_ops=lib)


def test_a_second_registration_leaves_earlier_sessions_as_they_were(tmp_path):
    """The library reads IMEGEN_IME_HARTS once per process: a session created later with another value neither
    changes nor crashes an earlier one (which re-read the harts used to: a Run then found no packed B and
    crashed). Both orders; the Run's output against stock ORT's."""
    from imegen.ort import sysroot
    from imegen.ort.riscv import RiscvSession as Stock

    specs = imegen.load_spec(SPEC)
    lib = imegen.build_ort_library(specs)
    model = two_node_model(np.random.default_rng(7))
    keep = [n for n in model.graph.node if n.name == "n_a"]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    model.graph.node[0].output[0] = "Y"
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("Y", TensorProto.FLOAT, None))
    onnx.save(model, tmp_path / "stock.onnx")
    imegen.rewrite_model(model, specs)
    onnx.save(model, tmp_path / "imegen.onnx")
    root = sysroot.ensure("1.23")
    exe = toolchain.compile_c([Path(__file__).parent / "c" / "two_sessions.c"], tmp_path / "two_sessions",
                              march="rv64gc", include_dirs=[sysroot.include_dir(root)], extra_flags=["-std=gnu11", "-ldl"])
    A = ((np.arange(K) * 37) % 17 / 17.0 - 0.5).astype(np.float32)[None]
    with Stock(tmp_path / "stock.onnx", "1.23") as s:
        stock = s.run({"A": A})
    for first, second in (("none", "0-1"), ("0-1", "none")):
        run = subprocess.run([toolchain.QEMU, "-L", str(root), "-cpu", toolchain.qemu_cpu(256), str(exe),
                              str(sysroot.library(root)), str(tmp_path / "imegen.onnx"), str(lib), first, second,
                              str(K), str(NODES["n_a"])], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, (first, second, run.returncode, run.stderr[-2000:])
        Y = np.array([float(v) for v in run.stdout.split()], np.float32)[None]
        assert all(o.ok for o in compare_outputs({"Y": stock["Y"]}, {"Y": Y}, 4)), (first, second)


def test_more_gemm_kernels_than_the_library_holds_are_refused_by_both(tmp_path):
    """serve() and the library agree on the limit of gemm kernels (different min_rows) per node: both refuse,
    neither silently drops one (the library used to keep the spec's first six, so an M = 2 Run ran another
    kernel than the report said)."""
    from imegen.ort.serving import MAX_GEMM

    text = "defaults { bits = 4 block = 32 zero_point = symmetric compute = fp32 target = scalar tile = 2x8 panel = 16 }\n"
    text += "".join(f"kernel r{rows} {{ min_rows = {rows} }}\n" for rows in range(MAX_GEMM + 2, 1, -1))
    specs = imegen.load_spec(text)
    need = NodeNeeds(bits=4, block=32, accuracy_level=0, asymmetric=False, bias=False, N=64, K=K)
    assert len(serve(specs[1:], need).gemm) == MAX_GEMM  # at the limit: served
    s = serve(specs, need)
    assert not s.ok and f"{MAX_GEMM + 1} gemm kernels of different min_rows" in s.reason
    model = two_node_model(np.random.default_rng(7))
    for node in model.graph.node:
        node.domain = "ai.imegen"
        next(a for a in node.attribute if a.name == "accuracy_level").i = 0
    model.opset_import.add(domain="ai.imegen", version=1)
    onnx.save(model, tmp_path / "forced.onnx")
    with pytest.raises(OrtError, match=f"more than {MAX_GEMM} gemm kernels"):
        RiscvSession(tmp_path / "forced.onnx", "1.23", custom_ops=imegen.build_ort_library(specs))


def test_imegen_runs_its_ime_programs_on_the_named_harts(monkeypatch):
    """With IMEGEN_IME_HARTS set, imegen's own IME programs (check's drivers) run pinned to those harts under
    QEMU, as on a K1: exported for the library, the variable does not make `imegen check` die at random."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs two CPUs (CI has two): one with IME, one without")
    kernel = imegen.build_kernel(imegen.load_spec(SPEC), "any_gemv")
    qw = oc.ort_quantized_weights(np.random.default_rng(0).normal(0, 0.25, (K, 16)).astype(np.float32), 4, 32, True)
    saved = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {1})
        monkeypatch.setenv("IMEGEN_IME_HARTS", "0")
        assert kernel.compare(np.ones((3, K), np.float32), qw.data, qw.scales, K=K).ok
        monkeypatch.setenv("IMEGEN_IME_HARTS", "none")
        with pytest.raises(toolchain.HostError, match="names no hart with IME"):
            kernel.run(np.ones((1, K), np.float32), qw.data, qw.scales, K=K)
    finally:
        os.sched_setaffinity(0, saved)
