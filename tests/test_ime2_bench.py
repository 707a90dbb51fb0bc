"""The IME2 (K3 A100) bench: llama.cpp's IME2 Q4_0 path counted with imegen's plugin (baselines/llama_cpp/
ime2_counts.py), imegen's IME2 kernels counted the same way (report/ime2.py), the A100 cost model (model/a100.py)
and the rows. Small shapes only; docs/ime2-isa.md §11."""

import csv
import io
import subprocess
import sys

import numpy as np
import pytest

from imegen import toolchain
from imegen.api import load_spec
from imegen.perf.baselines.llama_cpp import ime2_counts
from imegen.perf.count import extrapolate as ex
from imegen.perf.count import plugin
from imegen.perf.model import a100, x60
from imegen.perf.report import ime2
from imegen.plan import plan_kernel

NEEDS_TOOLS = pytest.mark.skipif(bool(toolchain.missing_tools()) or not plugin.plugin_available(),
                                 reason="needs the cross toolchains, qemu-riscv64 and the counting plugin")


def _classes(c: dict) -> dict:
    return {**x60.class_totals(c), **a100.layout_counts(c)}


# ---------------------------------------------------------------- llama.cpp's Q4_0 path

def test_kernel_choice_follows_ime_cpp():
    assert ime2_counts.kernel_for(896) == "i8i4" and ime2_counts.kernel_for(4864) == "i8i4hp"
    assert ime2_counts.kernel_for(512) == "i8i4hp" and ime2_counts.kernel_for(224) == "i8i4"


def test_reclassify_moves_the_ime2_words_out_of_int():
    counts = {"kernel.int": 100, "kernel.vmadot": 3, "kernel.valu": 7}
    kinds = {"vmadot": 3, "vmadot_hp": 8, "vpack": 4, "vupack_slow": 1, "vupack": 2, "vnpack4": 5}
    out = ime2_counts.reclassify(counts, kinds)
    assert out["kernel.int"] == 100 - (8 + 4 + 1 + 2 + 5)
    assert out["kernel.vmadot"] == 11 and out["kernel.valu"] == 7
    assert [out[f"kernel.ime2.{k}"] for k in a100.LAYOUT_KINDS] == [4, 1, 2, 5]
    with pytest.raises(toolchain.ToolchainError):  # the plugin saw more int8 vmadot than the emulator ran
        ime2_counts.reclassify({"kernel.int": 100, "kernel.vmadot": 4}, kinds)
    with pytest.raises(toolchain.ToolchainError):  # fewer "int" than IME2 words to move: something is off
        ime2_counts.reclassify({"kernel.int": 5}, kinds)


@NEEDS_TOOLS
@pytest.mark.parametrize("M, N, K", [(5, 64, 896), (9, 96, 512), (1, 32, 256)])
def test_counting_driver_agrees_with_numpy(tmp_path, M, N, K):
    """The counting driver's own run (llama.cpp's quantizer on fp32 A, then the kernel ime.cpp picks) against the
    peer check's NumPy model of that kernel on the very bytes the quantizer wrote (within 1 unit of 1e-5 x the
    sum of the terms' magnitudes), and loosely against fp32 A times the dequantized B (the quantizer's error)."""
    chk = ime2_counts.check(ime2_counts.build(), M, N, K, tmp_path)
    assert chk.model_units <= 1.0
    assert chk.float_rel < 0.02


@NEEDS_TOOLS
@pytest.mark.parametrize("M, N, K", [(9, 128, 224), (6, 128, 512), (1, 64, 256)])
def test_llama_extrapolation_matches_a_direct_run(M, N, K):
    """The counts from the two M = 5 samples (linear in 32-column groups, per row group) equal, class by class,
    a direct run at the shape; also for the per-core counts of two cores (N split in two)."""
    counter = ime2_counts.Counter()
    got = _classes(counter.counts(M, N, K))
    want = _classes(ime2_counts.direct(counter.b, M, N, K))
    assert got == pytest.approx(want, abs=0.5)
    half = _classes(counter.counts(M, N, K, cores=2))
    r = ime2_counts.run(counter.b, ime2_counts.kernel_for(K), M, N // 2, K)
    quant, gemm = {}, {}
    for c in r.quant:
        quant = ime2_counts.add_counts(quant, c)
    for c in r.gemm:
        gemm = ime2_counts.add_counts(gemm, c)
    want_half = {k: _classes(quant)[k] / 2 + _classes(gemm)[k] for k in half}
    assert half == pytest.approx(want_half, abs=0.5)


@NEEDS_TOOLS
def test_llama_counts_see_every_ime2_word():
    """i8i4 at 32 columns: per 32-code block the m4 call runs 8 .hp, 7 vpack, 1 vupack, 1 vnpack4; the m1 call
    8 .hp, 3 vpack, 2 vnpack4 (the peer check's counts), all out of "int"."""
    r = ime2_counts.run(ime2_counts.build(), "i8i4", 5, 32, 896)
    m4, m1 = r.gemm
    assert (m4["kernel.vmadot"], m4["kernel.ime2.vpack"], m4["kernel.ime2.vupack"], m4["kernel.ime2.vnpack4"]) == \
        (28 * 8, 28 * 7, 28, 28)
    assert (m1["kernel.vmadot"], m1["kernel.ime2.vpack"], m1["kernel.ime2.vnpack4"]) == (28 * 8, 28 * 3, 28 * 2)
    assert all(q.get("kernel.vmadot", 0) == 0 for q in r.quant)
    assert sum(v for k, v in m4.items() if k.startswith("callee.") and "." not in k[7:]) == 0  # no libc per trap


# ---------------------------------------------------------------- imegen's IME2 kernels

@NEEDS_TOOLS
@pytest.mark.parametrize("name, M, N, K", [(ime2.DECODE_KERNEL, 1, 96, 256), (ime2.PREFILL_KERNEL, 35, 96, 256),
                                         (ime2.HP_DECODE_KERNEL, 1, 96, 288)])
def test_imegen_extrapolation_matches_a_direct_run(name, M, N, K):
    spec = next(s for s in load_spec(ime2.EXAMPLE) if s.name == name)
    plan = plan_kernel(spec)
    got = ime2.imegen_counts(plan, [(M, N, K)])[(M, N, K)].matmul(1)
    direct = ime2.run_samples(ime2.build_bench(plan), [(M, N, K)])[(M, N, K)].matmul
    assert x60.class_totals(got) == pytest.approx(x60.class_totals(direct), abs=0.5)


def test_decode_rows_compare_q40_with_q40():
    """The goal's decode comparison runs imegen in llama.cpp's own format (Q4_0: 4-bit, block 32, symmetric, fp16
    scales); the ORT-format decode kernel's rows carry a kind of their own."""
    specs = {s.name: s for s in load_spec(ime2.EXAMPLE)}
    q40, asym = specs[ime2.DECODE_KERNEL], specs[ime2.ASYM_DECODE_KERNEL]
    assert (q40.op, q40.bits, q40.block, q40.zero_point, q40.scale_type) == ("gemv", 4, 32, "symmetric", "fp16")
    assert (asym.op, asym.zero_point) == ("gemv", "asymmetric") and ime2.IMEGEN_ASYM_KIND != ime2.IMEGEN_KIND
    res = ime2.Ime2Result([_row(ime2.IMEGEN_ASYM_KIND, 3), _row("imegen", 2), _row(ime2.LLAMA_KIND, 1)])
    assert res.pair("q/o", 1)[0].kind == "imegen"
    text = ime2.report_text(res)
    assert "ORT's asymmetric format" in text and "decode  q/o      instructions 1.9" in text


@NEEDS_TOOLS
def test_imegen_kernels_agree_with_the_reference_before_counting():
    for spec in load_spec(ime2.EXAMPLE):
        if spec.name in (ime2.DECODE_KERNEL, ime2.PREFILL_KERNEL, ime2.ASYM_DECODE_KERNEL):
            assert ime2.check_imegen(spec, 19, 64, 256) is None


# ---------------------------------------------------------------- the A100 model

def _synthetic(**classes) -> dict:
    return {f"kernel.{k}": v for k, v in classes.items()}


def test_a100_ime_bound_is_throughput_or_accumulator_latency():
    c = _synthetic(vmadot=1000)
    assert a100.core_cycles(c, accumulators=12, hp=False).ime == 1000      # 1 per cycle
    assert a100.core_cycles(c, accumulators=4, hp=False).ime == 2000       # latency 8 over 4 chains
    assert a100.core_cycles(c, accumulators=4, hp=True).ime == 2500        # .hp latency 10
    assert a100.core_cycles(c, accumulators=12, hp=False, share=0.5).ime == 2000  # the pair's shared unit


def test_a100_charges_layout_and_vsetvli_as_measured():
    c = {"kernel.vset": 10, "kernel.ime2.vpack": 3, "kernel.ime2.vupack_slow": 1, "kernel.ime2.vupack": 2,
         "kernel.ime2.vnpack4": 5}
    cyc = a100.core_cycles(c, accumulators=4, hp=True)
    assert cyc.vset == 30
    assert cyc.vieu == 3 * 4 + 13 + 2 * 4 + 5 * 2
    assert cyc.vector_issue == 11


def test_a100_sensitivity_changes_only_its_figure():
    sens = a100.sensitivity_params()
    assert set(sens) == {f.name for f in a100.FIGURES if f.params}
    assert sens["clock"].clock_hz == 2.4e9 and sens["clock"].dram_effective == a100.A100.dram_effective
    assert all(f.source.startswith("ASSUMPTION") for f in a100.FIGURES if f.params)


def test_llama_dram_passes():
    # M = 1: one task, B once. q/o at 128 rows: tasks of 16 rows, B (451 KB) fits the L2 budget: 8 passes.
    # lm_head at 128 rows: one task of all rows (N // M > 64), B does not fit: one pass per 4-row call.
    b = lambda N, K: N * K * 18 // 32  # noqa: E731
    assert a100.llama_q40_dram(1, 896, 896) == b(896, 896) + 4 * 896 + 4 * 896
    assert a100.llama_q40_dram(128, 896, 896) == 8 * b(896, 896) + 4 * 128 * 896 * 2
    assert a100.llama_q40_dram(128, 151936, 896) == 32 * b(151936, 896) + 4 * 128 * 896 + 4 * 128 * 151936


# ---------------------------------------------------------------- rows and report

def _row(kind, instructions_scale, M=1):
    c = _synthetic(int=1000 * instructions_scale, vmadot=100, vset=10)
    return ime2.Row("q/o", M, 896, 896, 32, kind, "target=ime2 x" if kind == "imegen" else "llama", c, c,
                    1e3, 4, kind != "imegen")


def test_goals_text_reports_unmet_goals():
    res = ime2.Ime2Result([_row("imegen", 2), _row(ime2.LLAMA_KIND, 1), _row("imegen", 1, 128),
                           _row(ime2.LLAMA_KIND, 4, 128)])
    text = ime2.goals_text(res)
    assert "decode  q/o      instructions 1.9" in text and "NOT met" in text.splitlines()[1]
    res_met = ime2.Ime2Result([_row("imegen", 0.1), _row(ime2.LLAMA_KIND, 1)])
    assert ime2.goals_text(res_met).splitlines()[1].endswith(" met  (int8 path)")


def test_bench_csv_rows_fit_bench_csv():
    res = ime2.Ime2Result([_row("imegen", 1), _row(ime2.LLAMA_KIND, 1)])
    rows = ime2.bench_csv_rows(res)
    width = 7 + len(x60.CLASSES) + 1 + 10  # bench.csv: shape..config, classes, vec_bytes, the 10 time columns
    assert all(len(r) == width for r in rows)
    assert rows[0][5] == "imegen" and "target=ime2" in rows[0][6] and rows[1][5] == "llama.cpp-ime2"
    assert len(ime2.sensitivity_text(res).splitlines()) == 2 + sum(1 for f in a100.FIGURES if f.params)
    table = list(csv.DictReader(io.StringIO(ime2.ime2_csv(res))))
    assert float(table[0]["ms_1core_clock_2.4GHz"]) < float(table[0]["ms_1core"])


def test_cli_error_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = subprocess.run([sys.executable, "-m", "imegen.perf.report.ime2", "--out", str(blocker / "x"), "--quick"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in proc.stderr


@NEEDS_TOOLS
def test_hp_rows_count_the_hp_vmadots_as_vmadots():
    """The plugin files vmadot.hp words as scalar int; the bench moves the emulator's count of them to vmadot (else a
    .hp kernel would be credited with 0 vmadots and 4 int instructions a block it did not execute)."""
    spec = next(s for s in load_spec(ime2.EXAMPLE) if s.name == ime2.HP_DECODE_KERNEL)
    plan = plan_kernel(spec)
    [c] = ime2.run_samples(ime2.build_bench(plan), [(1, 64, 256)]).values()
    assert c.matmul["kernel.vmadot"] == 2 * 8 * 4 == c.emulated_vmadots
