"""`imegen bench --spec` and `imegen tune --spec`: a user's own kernels in the bench's tables next to the
baselines, and ranked per shape; the perf commands' arguments checked up front, one line each."""

from __future__ import annotations

import argparse
import csv
import re

import pytest

from imegen import toolchain
from imegen.cli import main
from imegen.ir import specs_from_text
from imegen.perf import bench
from imegen.perf.cli import COMMANDS, add_perf_commands
from imegen.perf.search import evaluate, tune

NEEDS_TOOLS = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")

# mine_4x16 is the llama-4x16 baseline's configuration (baselines/dsl.py) under the user's name: the bench
# must count and model it exactly as the baseline. The scalar and MLAS-ABI kernels are not the bench's.
SPEC = """
kernel mine_4x16 {
  op = gemm  bits = 4  block = 32  zero_point = asymmetric  compute = int8  target = ime
  tile = 4x16  k_unroll = 2  unpack = planar  panel = 16  scales = inline
}
kernel mine_gemv {
  op = gemv  bits = 4  block = 32  zero_point = asymmetric  compute = int8  target = ime
  tile = 1x16  k_unroll = 4  unpack = planar  panel = 16  scales = inline  scale_type = fp16
}
kernel mine_scalar { op = gemv  bits = 4  block = 32  target = scalar  tile = 1x4 }
kernel mine_mlas { abi = mlas  op = gemm  compute = int8  block = 32  target = ime  tile = 4x16  panel = 16 }
"""
NUMBERS = ("vmadot", "valu", "vfpu", "vload", "vstore", "int", "mem", "branch", "vec_bytes", "ms_1core", "ms_4cores",
           "dram_bytes", "ms_4cores_llvm_occ")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main([*argv])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "mine.imegen"
    path.write_text(SPEC)
    return path


@pytest.fixture
def nothing_runs(monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("ran before refusing its arguments")

    for module, name in ((bench, "run"), (bench, "run_spec"), (tune, "search"), (tune, "rank"), (evaluate, "evaluate")):
        monkeypatch.setattr(module, name, must_not_run)


# ---------------------------------------------------------------------------------------------
# Arguments: one check per value, the same in bench and tune


@pytest.mark.parametrize("command", ["bench", "tune"])
@pytest.mark.parametrize("argv, message", [
    (["-j", "0"], "argument -j/--jobs: must be >= 1, got 0"),
    (["--jobs", "x"], "argument -j/--jobs: expected an integer, got 'x'"),
    (["--blocks", "32,48"], "argument --blocks: blocks must be among 32, 64, 128, got 48"),
    (["--blocks", "32,32"], "argument --blocks: 32 given more than once"),
    (["--spec", "s.imegen", "--shape", "896"], "argument --shape: expected NxK (e.g. 896x4864), got '896'"),
    (["--spec", "s.imegen", "--shape", "0x896"], "argument --shape: must be >= 1, got 0"),
    (["--spec", "s.imegen", "--m", "1,x"], "argument --m: expected an integer, got 'x'"),
])
def test_perf_arguments_are_refused_by_argparse(capsys, nothing_runs, command, argv, message):
    code, out, err = run(capsys, command, *argv)
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == f"imegen {command}: error: {message}"


def test_every_perf_argument_has_help():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_perf_commands(sub)
    assert set(sub.choices) == set(COMMANDS)
    for command, p in sub.choices.items():
        for action in p._actions:
            assert action.help and len(action.help) > 12, (command, action.option_strings or action.dest)


@pytest.mark.parametrize("command", ["bench", "tune"])
@pytest.mark.parametrize("argv, message", [
    (["--shape", "896x896"], "error: --shape and --m choose the cases of --spec's kernels: give --spec SPEC"),
    (["--m", "1"], "error: --shape and --m choose the cases of --spec's kernels: give --spec SPEC"),
    (["--spec", "{spec}", "--blocks", "32"], "error: --blocks does not apply with --spec: each kernel runs at its own block"),
    (["--spec", "{missing}"], "error: cannot read {missing}: No such file or directory"),
])
def test_spec_misuse_is_one_line_before_anything_runs(capsys, nothing_runs, spec, tmp_path, command, argv, message):
    names = {"spec": spec, "missing": tmp_path / "missing.imegen"}
    code, out, err = run(capsys, command, *(a.format(**names) for a in argv))
    assert code == 2 and out == ""
    assert err == message.format(**names) + "\n"


def test_bench_spec_and_mlas_are_different_runs(capsys, nothing_runs, spec):
    code, out, err = run(capsys, "bench", "--spec", str(spec), "--mlas", str(spec))
    assert (code, out, err) == (2, "", "error: --mlas and --spec are different runs: give one\n")


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_spec_without_a_kernel_the_bench_runs_is_refused(capsys, nothing_runs, tmp_path, command):
    path = tmp_path / "none.imegen"
    path.write_text("kernel s { op = gemv  tile = 1x4  target = scalar }\n"
                    "kernel wide { op = gemv  tile = 1x16  target = rvv  vlen = 512 }\n"
                    "kernel m { abi = mlas  op = gemm  compute = int8  target = ime  tile = 4x16  panel = 16 }\n")
    code, out, err = run(capsys, command, "--spec", str(path))
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"error: {path}: no kernel the bench can run (s: target scalar: ")
    assert "wide: it needs VLEN >= 512; the bench runs at the K1's VLEN 256" in err and "m: abi = mlas: " in err


def test_spec_that_does_not_parse_is_one_line(capsys, nothing_runs, tmp_path):
    path = tmp_path / "bad.imegen"
    path.write_text("kernel a { op = gemv  tile = 1x4  target = bogus }\n")
    code, out, err = run(capsys, "bench", "--spec", str(path))
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "'target' must be one of" in err


# ---------------------------------------------------------------------------------------------
# bench --spec, tune --spec


def _rows(path) -> list[dict]:
    return list(csv.DictReader(path.open()))


@NEEDS_TOOLS
def test_bench_spec_puts_the_users_kernels_next_to_the_baselines(capsys, spec, tmp_path):
    code, out, err = run(capsys, "bench", "--spec", str(spec), "--quick", "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "skipping kernel mine_scalar: target scalar" in err and "skipping kernel mine_mlas: abi = mlas" in err
    rows = _rows(tmp_path / "out" / "bench.csv")
    kinds = ["mine_4x16", "mine_gemv", "llama-4x16", "rvv-fp32"]
    assert [(r["shape"], r["M"], r["kernel"]) for r in rows] == [("q/o", M, k) for M in ("1", "128") for k in kinds]
    by = {(r["M"], r["kernel"]): r for r in rows}
    for M in ("1", "128"):  # the baseline's configuration under the user's name: the same counts and times
        assert [by[(M, "mine_4x16")][k] for k in NUMBERS] == [by[(M, "llama-4x16")][k] for k in NUMBERS]
        assert by[(M, "mine_4x16")]["config"] == by[(M, "llama-4x16")]["config"]
        assert int(by[(M, "mine_gemv")]["vmadot"]) > 0 and by[(M, "mine_gemv")]["config"].startswith("op=gemv")
    speedups = out.split("Each kernel as a speedup over each baseline")[1].split("\n\n")[0]
    versus_llama = [re.split(r"\s{2,}", line.strip())[5] for line in speedups.splitlines() if " mine_4x16 " in line]
    assert len(versus_llama) == 2 and set(versus_llama) <= {"1.00x | 1.00x", "1.00x (DRAM tie) | 1.00x"}
    assert "Not benched: mine_scalar (target scalar" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bench.csv", "bench.txt"]  # no tuner files


@NEEDS_TOOLS
def test_bench_spec_runs_the_shapes_and_rows_asked_for(capsys, spec, tmp_path):
    code, out, err = run(capsys, "bench", "--spec", str(spec), "--shape", "256x512", "--shape", "64x128",
                         "--m", "1,8", "-o", str(tmp_path))
    assert code == 0, err
    rows = _rows(tmp_path / "bench.csv")
    assert sorted({(r["shape"], r["N"], r["K"], r["M"]) for r in rows}) == sorted(
        (f"{n}x{k}", str(n), str(k), m) for n, k in ((256, 512), (64, 128)) for m in ("1", "8"))
    by = {(r["shape"], r["M"], r["kernel"]): r for r in rows}
    for shape in ("256x512", "64x128"):
        for M in ("1", "8"):
            assert [by[(shape, M, "mine_4x16")][k] for k in NUMBERS] == [by[(shape, M, "llama-4x16")][k] for k in NUMBERS]
    assert "(per-token figures need every Qwen2.5-0.5B shape" in out


@NEEDS_TOOLS
def test_tune_spec_ranks_the_users_kernels(capsys, spec, tmp_path):
    """The winner per case is the kernel the bench's own rows make fastest (4 cores; within tune.TIE the
    1-core time decides); a kernel of another block gets cases of its own."""
    spec.write_text(SPEC + "kernel mine_b64 { op = gemm  bits = 4  block = 64  zero_point = asymmetric  compute = int8\n"
                    "  target = ime  tile = 4x16  k_unroll = 2 }\n")
    code, out, err = run(capsys, "bench", "--spec", str(spec), "--shape", "896x896", "--m", "1,128", "-o", str(tmp_path / "b"))
    assert code == 0, err
    rows = _rows(tmp_path / "b" / "bench.csv")
    code, out, err = run(capsys, "tune", "--spec", str(spec), "--shape", "896x896", "--m", "1,128", "--occupancy", "model",
                         "-o", str(tmp_path / "t"))
    assert code == 0, err
    assert out == (tmp_path / "t" / "tuned.imegen").read_text() + "\n"  # print() adds the newline
    tuned = {s.name: s for s in specs_from_text(out)}
    assert sorted(tuned) == sorted(f"shape_896x896_m{M}_b{b}" for M in (1, 128) for b in (32, 64))
    mine = {s.name: s for s in specs_from_text(spec.read_text())}
    for M in ("1", "128"):
        for block in ("32", "64"):
            cands = [r for r in rows if r["M"] == M and r["block"] == block and r["kernel"] in mine]
            fastest = min(float(r["ms_4cores"]) for r in cands)
            tied = [r for r in cands if float(r["ms_4cores"]) <= fastest * (1 + tune.TIE)]
            want = min(tied, key=lambda r: float(r["ms_1core"]))["kernel"]
            assert f"block={block}: N=896 K=896; " in out and f"(kernel {want})\n" in out.split(f"M={M} block={block}:")[1]
            got = tuned[f"shape_896x896_m{M}_b{block}"]
            assert got.describe() == mine[want].describe()
    assert "mine_b64" not in out.split("M=1 block=32:")[1].split("kernel shape_")[0]  # block 64 stays in its own cases
    assert out.startswith(f"# imegen tune --spec {spec} --occupancy model: the best of its kernels")
