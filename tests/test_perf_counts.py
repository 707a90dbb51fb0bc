"""Instruction counting: the QEMU plugin's classification of a known instruction mix, link-map
ranges, and the extrapolation of reduced runs to full shapes (imegen/perf/count/{insn_count.c,measure.py,extrapolate.py})."""

from __future__ import annotations

from pathlib import Path

import pytest

from imegen import toolchain
from imegen.ir import specs_from_text
from imegen.perf.count import extrapolate, image, measure, plugin
from imegen.perf.model import occupancy, x60
from imegen.plan import plan_kernel

C_DIR = Path(__file__).resolve().parent / "c"
NEEDS_TOOLS = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")


@pytest.fixture(scope="module")
def plugin_so():
    """The plugin must build wherever QEMU is installed (.ci/install fetches qemu-plugin.h)."""
    return plugin.ensure_plugin()


# ---------------------------------------------------------------------------------------------
# The plugin: a program with a known instruction mix


# perf_classify_kernel.c, one call (see the comments there).
EXPECTED = {
    "vset": 6, "vload": 3, "vstore": 1, "vlsx": 1, "valu": 4, "vfpu": 1, "vmadot": 1,
    "int": 3, "mem": 2, "fp": 1, "div": 1, "branch": 2,
}
EXPECTED_HIST = {"vieu.e0": 3, "vieu.e2": 1, "vfp.e2": 1}
EXPECTED_MEM = {"vload": (80, 68, 5), "vstore": (128, 32, 8), "vlsx": (16, 4, 1)}  # bytes, elements, beats


def _count_known_kernel(kernel_source: str, d: Path) -> plugin.PluginRun:
    """tests/c/KERNEL (tk_kernel) with perf_classify_main.c's driver, counted: one call between the markers."""
    kobj = toolchain.compile_c([C_DIR / kernel_source], d / "kernel.o")
    dobj = toolchain.compile_c([C_DIR / "perf_classify_main.c"], d / "driver.o", include_dirs=[toolchain.RUNTIME_DIR])
    eobj = toolchain.compile_ime_emu(d / "ime_emu.o")
    exe = toolchain.compile_c([kobj, dobj, eobj], d / "classify", extra_flags=["-static", f"-Wl,-Map={d / 'map'}"])
    ranges = image.code_ranges_from_map((d / "map").read_text(), {str(kobj): "kernel", str(dobj): "excluded",
                                                                    str(eobj): "excluded"})
    ranges += [(lo, hi, "image") for lo, hi in image.exec_segments(exe)]
    syms = image.symbols(exe)
    return plugin.run_counted(exe, [], ranges, begin=syms["imegen_bench_begin"][0], end=syms["imegen_bench_end"][0])


@pytest.fixture(scope="module")
def classify_run(plugin_so, tmp_path_factory):
    return _count_known_kernel("perf_classify_kernel.c", tmp_path_factory.mktemp("classify"))


@NEEDS_TOOLS
def test_plugin_classifies_a_known_instruction_mix(classify_run):
    (region,) = classify_run.regions
    for cls, n in EXPECTED.items():
        assert region[f"kernel.{cls}"] == n, cls
        assert classify_run.total[f"kernel.{cls}"] == 3 * n, cls  # three calls in all
    for key, n in EXPECTED_HIST.items():
        assert region[f"kernel.{key}"] == n, key
    assert sum(v for k, v in region.values.items() if k.startswith("kernel.vieu.") or k.startswith("kernel.vfp.")) == 5
    for cls, (nbytes, elems, beats) in EXPECTED_MEM.items():
        assert (region[f"kernel.{cls}.bytes"], region[f"kernel.{cls}.elems"], region[f"kernel.{cls}.beats"]) == (nbytes, elems, beats), cls
    assert region["vtype_unknown"] == 1


@NEEDS_TOOLS
def test_plugin_histograms_llvm_kinds_as_the_static_walk_reads_them(classify_run):
    """The counting plugin's kind histogram (insn_count.c decodes instruction words) and the static
    walk over the same kernel's assembly text (occupancy.py reads mnemonics) must give the same unit
    cycles; and both the hand-computed ones of tests/c/perf_classify_kernel.c: VLS 3 + 3 + 3 (three
    LMUL-1 loads) + 8 (an LMUL-4 store) + 8 (a strided e32 load: VLMAX 8), VIEU 2 + 2 (vmv.v.i m1) +
    4 (vwadd at m2) + 1 (vadd m1), VFP 4 (vfmacc m4)."""
    import re


    (region,) = classify_run.regions
    measured = occupancy.measured_cycles(region.values, tags=("kernel",))
    source = (C_DIR / "perf_classify_kernel.c").read_text()
    texts = [t.strip() for t in re.findall(r'^\s*"([^"]*?)\\n"', source, re.M)]
    static = occupancy.walk(texts)["llvm"]
    assert measured == {"vls": 25, "vieu": 9, "vfp": 4}
    assert (static.vls, static.vieu, static.vfp, static.ime) == (25, 9, 4, 1)
    # x60's measured variant swaps exactly these three units.
    from dataclasses import asdict


    model, swapped = asdict(x60.core_cycles(region.values)), asdict(x60.core_cycles(region.values, measured=True))
    assert swapped == {**model, "vls": 25, "vieu": 9, "vfp": 4}


@NEEDS_TOOLS
def test_plugin_excludes_the_trap_emulator(classify_run):
    (region,) = classify_run.regions
    # The vmadot is counted once although it trapped; the emulator's work is excluded by address,
    # and the signal trampoline lies outside the executable.
    assert region["kernel.vmadot"] == 1
    assert region["excluded.vstore"] > 0 and region["excluded.int"] > 100  # vs1r.v spills, the handler's C code
    assert 0 < region["outside.int"] + region["outside.branch"] <= 4
    assert sum(v for k, v in region.values.items() if k.startswith("callee.") and "." not in k[7:]) == 0


def test_parse_output_rejects_mismatched_lines():
    good = "format a.b c.d vtype_unknown\nregion 0 1 2 3\ntotal 4 5 6\n"
    run = plugin.parse_output(good)
    assert run.regions[0]["c.d"] == 2 and run.total["vtype_unknown"] == 6
    with pytest.raises(ValueError):
        plugin.parse_output("format a b\ntotal 1\n")
    with pytest.raises(ValueError):
        plugin.parse_output("format a\nregion 0 1\n")  # no total: the program did not exit normally


def test_link_map_parsing_handles_both_line_forms():
    text = """
.text           0x0000000000010458    0x41e0a
 *(.text.unlikely .text.*_unlikely .text.unlikely.*)
 .text.unlikely
                0x0000000000010500       0x10 /tmp/x/kernel.o
 .text          0x000000000001066a       0x5a /tmp/x/kernel.o
                0x000000000001066a                k_matmul
 .text          0x00000000000106c4      0x774 /tmp/x/emu.o
 .text          0x0000000000010e38       0x20 /usr/lib/libc.a(memset.o)
.rodata         0x0000000000052a80      0x100
 .rodata        0x0000000000052a84      0x100 /tmp/x/emu.o
"""
    got = image.code_ranges_from_map(text, {"/tmp/x/kernel.o": "kernel", "/tmp/x/emu.o": "excluded"})
    assert got == [(0x10500, 0x10510, "kernel"), (0x1066A, 0x106C4, "kernel"), (0x106C4, 0x10E38, "excluded")]


# ---------------------------------------------------------------------------------------------
# Counts of real kernels: extrapolation by whole tiles


SPECS = """
defaults { bits = 4  block = 32  zero_point = asymmetric  compute = int8  target = ime }
kernel p_ime { op = gemm  tile = 4x16  k_unroll = 2  unpack = planar  panel = 16 }
kernel p_rvv { op = gemm  compute = fp32  target = rvv  vlen = 256  tile = 4x16 }
"""


@NEEDS_TOOLS
@pytest.mark.parametrize("name", ["p_ime", "p_rvv"])
def test_extrapolated_counts_equal_a_direct_run(plugin_so, name):
    (spec,) = [s for s in specs_from_text(SPECS) if s.name == name]
    plan = plan_kernel(spec)
    M, N, K = 11, 45, 67  # 3 x 3 tiles with partial last tiles, a padded last block
    (sc,) = measure.measure_shapes(plan, [(M, N, K)], use_cache=False)
    assert sc.samples == ((3, 13, K), (3, 29, K), (7, 13, K), (7, 29, K))
    (direct,) = measure.run_cases(measure.build_bench(plan), [(M, N, K)])
    got = sc.matmul(1)
    for key, value in direct.matmul.items():
        if key.startswith("kernel."):  # the kernel's own code: exact
            assert got[key] == value, key
    callee = sum(v for k, v in direct.matmul.items() if k.startswith("callee.") and k.count(".") == 1)
    got_callee = sum(v for k, v in got.items() if k.startswith("callee.") and k.count(".") == 1)
    # memset/roundf lengths and values vary a little (a memset's path depends on its length: tens of
    # instructions when the only callee left is A preparation's one memset per call)
    assert got_callee == pytest.approx(callee, rel=0.05, abs=40)
    if spec.target == "ime":
        assert direct.emulated_vmadots == got["kernel.vmadot"] == 3 * 3 * 3 * 16


@NEEDS_TOOLS
def test_extrapolation_counts_every_m_block(plugin_so):
    """The reduced runs lie in one M block; what each further block costs besides its tiles (its N loop
    and, with stage_b = m_block, the staging of every N tile) is added once per block. Here the A budget
    holds two M tiles of rows, so M = 40 runs three blocks (K unsplit: a split would give each M block
    more rows, see the next test); the extrapolation must match a direct run up to the call's own entry
    code (counted once per block: about 130 instructions)."""
    import dataclasses


    spec = specs_from_text("kernel st { target = ime  compute = int8  bits = 4  block = 32  zero_point = asymmetric "
                           "op = gemm  tile = 8x8  k_unroll = 2  panel = 16  stage_b = m_block }")[0]
    plan = plan_kernel(spec)
    M, N, K = 40, 21, 13 * 32 + 7
    row_bytes = x60.workspace_bytes(plan, 8, K) // 8
    plan = dataclasses.replace(plan, a_block_bytes=x60.staged_bytes(plan, K) + 2 * 8 * row_bytes, forced_k_chunks=1)
    (sc,) = measure.measure_shapes(plan, [(M, N, K)], use_cache=False)
    assert sc.m_blocks == 3
    (direct,) = measure.run_cases(measure.build_bench(plan), [(M, N, K)])
    got, one_block = sc.matmul(1), dataclasses.replace(sc, m_blocks=1).matmul(1)
    kernel = lambda c: sum(v for k, v in c.items() if k.startswith("kernel.") and k.count(".") == 1)  # noqa: E731
    assert abs(kernel(got) - kernel(direct.matmul)) <= 2 * 200
    assert kernel(direct.matmul) - kernel(one_block) > 4 * 2 * 200  # the per-block part is real: without it, far off
    assert direct.emulated_vmadots == got["kernel.vmadot"]


@NEEDS_TOOLS
@pytest.mark.parametrize("stage", ["", "stage_b = m_block"])
def test_extrapolation_counts_k_chunks(plugin_so, stage):
    """A call that splits K (x60.k_chunks, mirroring the kernel's choice) is sampled by a build forced
    to the same chunks, since its small samples would not split: with the A budget cut to one M tile
    over the whole K, M = 40 splits K in two over several M blocks, and the extrapolation must match
    a direct run up to the per-block entry code, while the same call unsplit costs visibly less."""
    import dataclasses


    spec = specs_from_text("kernel kc { target = ime  compute = int8  bits = 4  block = 32  zero_point = asymmetric "
                           f"op = gemm  tile = 8x8  k_unroll = 2  panel = 16  {stage} }}")[0]
    plan = plan_kernel(spec)
    M, N, K = 40, 21, 13 * 32 + 7
    plan = dataclasses.replace(plan, a_block_bytes=x60.staged_bytes(plan, K) + x60.workspace_bytes(plan, 8, K))
    assert x60.k_chunks(plan, M, N, K) == 2
    (sc,) = measure.measure_shapes(plan, [(M, N, K)], use_cache=False)
    assert sc.m_blocks > 1
    (direct,) = measure.run_cases(measure.build_bench(plan), [(M, N, K)])
    (unsplit,) = measure.run_cases(measure.build_bench(dataclasses.replace(plan, forced_k_chunks=1)), [(M, N, K)])
    kernel = lambda c: sum(v for k, v in c.items() if k.startswith("kernel.") and k.count(".") == 1)  # noqa: E731
    assert abs(kernel(sc.matmul(1)) - kernel(direct.matmul)) <= 2 * 200
    assert direct.emulated_vmadots == sc.matmul(1)["kernel.vmadot"] == unsplit.emulated_vmadots
    if not stage:  # the later chunk's tiles add to C through memory: a cost the samples must contain
        assert kernel(direct.matmul) - kernel(unsplit.matmul) > 4 * 2 * 200


def test_per_core_split():
    sc = extrapolate.ShapeCounts(M=8, N=64, K=32, mt=2, nt=8, p0={"kernel.int": 10}, dp={"kernel.int": 10},
                             f00={"kernel.int": 100}, dm={"kernel.int": 100}, dn={"kernel.int": 100},
                             dmn={"kernel.int": 100}, samples=())
    assert sc.prep()["kernel.int"] == 20
    assert sc.tiles()["kernel.int"] == 100 * 2 * 8  # 16 tiles of 100
    assert sc.matmul(1)["kernel.int"] == 20 + 1600
    assert sc.matmul(4)["kernel.int"] == 20 / 4 + 100 * 2 * 2  # 2 of the 8 N tiles per core


# ---------------------------------------------------------------------------------------------
# The MLAS path next to imegen's own ABI


@NEEDS_TOOLS
def test_mlas_path_counts_next_to_imegen_abi(plugin_so):
    from imegen.abi.mlas import plan_dispatch
    from imegen.perf.count import mlas_counts

    text = """defaults { abi = mlas  compute = int8  block = 32  target = ime  panel = 16 }
kernel c4 { bits = 4  op = gemm  tile = 4x16  k_unroll = 2 }
kernel c8 { bits = 8  op = gemm  tile = 4x16  k_unroll = 2 }"""
    d = plan_dispatch([plan_kernel(s) for s in specs_from_text(text, "counts.imegen")], "counts.imegen")
    for g in d.groups:
        [row] = mlas_counts.count_group(d, g, "counts.imegen", shapes=((6, 40, 96),))
        assert row.vmadots == 2 * 3 * 3 * 16  # row x column tiles x blocks x (4 k-steps x 4 B tiles); the plugin agrees
        assert row.mlas_gemm > row.vmadots and row.own_tiles > row.vmadots and row.mlas_quant > 0
        assert row.mlas_scalar < row.mlas_gemm
    assert "METHOD" in mlas_counts.report([row])


def test_plugin_header_is_fetched_for_the_installed_qemu():
    """With several deb-src suites (.ci/install adds trixie's) a bare `apt-get source qemu` picks the
    newest qemu, whose qemu-plugin.h needs glib and whose API the installed QEMU would refuse."""
    import re
    import shutil
    import subprocess

    if shutil.which("dpkg-query") is None or shutil.which(toolchain.QEMU) is None:
        pytest.skip("no dpkg or no qemu-riscv64")
    package = plugin.qemu_source_package()
    assert package.startswith("qemu="), package
    running = re.search(r"version (\d+\.\d+)", subprocess.run([toolchain.QEMU, "--version"], capture_output=True,
                                                             text=True).stdout).group(1)
    assert re.match(rf"qemu=(\d+:)?{re.escape(running)}[.+~]", package), (package, running)


@NEEDS_TOOLS
def test_plugin_and_static_walk_sort_every_kind_alike(plugin_so, tmp_path):
    """tests/c/perf_kinds_kernel.c holds instructions of every LLVM X60 scheduling kind: the plugin's
    histogram (decoded from the instruction words) and occupancy.kinds (read from the assembly text)
    must agree key for key, two decoders written apart."""
    import re


    (region,) = _count_known_kernel("perf_kinds_kernel.c", tmp_path).regions
    measured = {k[len("kernel."):]: v for k, v in region.values.items() if k.startswith("kernel.occ.") and v}
    texts = [t.strip() for t in re.findall(r'^\s*"([^"]*?)\\n"', (C_DIR / "perf_kinds_kernel.c").read_text(), re.M)]
    assert measured == occupancy.kinds(texts)
    assert {k.split(".")[1] for k in measured} == set(occupancy.KINDS)  # every kind exercised
