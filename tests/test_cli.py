"""The command line: list, explain, generate, error reporting, and one QEMU-backed check."""

from __future__ import annotations

from pathlib import Path

import pytest

from imegen import toolchain
from imegen.check import vlens_for
from imegen.cli import main
from imegen.ir import load_specs, specs_from_text
from imegen.outputs import MANIFEST
from imegen.plan import plan_kernel

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "qwen_mlp.imegen"
KERNELS = ["q4_prefill_ime", "q4_decode_ime", "q4_prefill_rvv", "q4_decode_scalar"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list(capsys):
    code, out, err = run(capsys, "list", str(EXAMPLE))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == KERNELS
    for line, spec in zip(lines, load_specs(EXAMPLE)):
        assert line == f"{spec.name}: {spec.describe()}"


def test_explain_ime_shows_register_map_and_inner_loop(capsys):
    code, out, err = run(capsys, "explain", str(EXAMPLE), "-k", "q4_decode_ime")
    assert code == 0 and err == ""
    assert out.startswith("kernel q4_decode_ime\n")
    assert "registers   int32 accumulators 8, A tiles 2, B tiles 16, fold temporaries 0 = 26 of 32" in out
    assert "int32 accumulator pairs v0-v1, v2-v3, v4-v5, v6-v7" in out
    assert "  inner loop:\n" in out
    loop, fold = out.split("  inner loop:\n", 1)[1].split("  block fold (", 1)
    loop = loop.splitlines()
    assert "vfmacc.vv" in fold and "vrgather" not in fold  # one live row: scalar row values, no spreading
    assert any(line.strip().startswith("vle8.v v8, (%[a])") for line in loop)
    vmadots = [line for line in loop if ".word 0x" in line]
    assert len(vmadots) == 16
    for slide in ("vmadotsu", "vmadot1su", "vmadot2su", "vmadot3su"):
        assert any(f"# {slide} v" in line for line in vmadots), slide
    assert loop[-1].strip() == "addi %[a], %[a], 32"


def test_explain_all_kernels(capsys):
    code, out, _ = run(capsys, "explain", str(EXAMPLE))
    assert code == 0
    blocks = out.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == [f"kernel {k}" for k in KERNELS]
    by_name = dict(zip(KERNELS, blocks))
    assert "inner loop:" in by_name["q4_prefill_ime"] and "1x4 vmadot tiles" in by_name["q4_prefill_ime"]
    assert "rvv types   accumulators f32m4 (LMUL 4)" in by_name["q4_prefill_rvv"]
    assert "inner loop:" not in by_name["q4_prefill_rvv"]
    assert "registers" not in by_name["q4_decode_scalar"]  # no vector registers


def test_generate_writes_then_reports_unchanged(capsys, tmp_path):
    out_dir = tmp_path / "gen"
    code, out, err = run(capsys, "generate", str(EXAMPLE), "-o", str(out_dir))
    assert code == 0 and err == ""
    expected = sorted(f"{k}.{ext}" for k in KERNELS for ext in ("c", "h"))
    assert sorted(p.name for p in out_dir.iterdir()) == sorted([*expected, MANIFEST])
    assert sorted(out.splitlines()) == sorted(f"wrote {out_dir / name}" for name in expected)
    for name in expected:
        text = (out_dir / name).read_text()
        assert text.startswith("/*") and f"from {EXAMPLE.name}." in text.split("*/", 1)[0]
    mtimes = {p.name: p.stat().st_mtime_ns for p in out_dir.iterdir()}

    code, out, err = run(capsys, "generate", str(EXAMPLE), "-o", str(out_dir))
    assert code == 0 and err == ""
    assert sorted(out.splitlines()) == sorted(f"unchanged {out_dir / name}" for name in expected)
    assert {p.name: p.stat().st_mtime_ns for p in out_dir.iterdir()} == mtimes


def test_generate_one_kernel_and_rewrite_after_edit(capsys, tmp_path):
    code, out, _ = run(capsys, "generate", str(EXAMPLE), "-o", str(tmp_path), "-k", "q4_decode_scalar")
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "q4_decode_scalar.c", "q4_decode_scalar.h"]
    (tmp_path / "q4_decode_scalar.c").write_text("edited by hand\n")
    code, out, _ = run(capsys, "generate", str(EXAMPLE), "-o", str(tmp_path), "-k", "q4_decode_scalar")
    assert code == 0
    assert out.splitlines() == [f"unchanged {tmp_path / 'q4_decode_scalar.h'}", f"wrote {tmp_path / 'q4_decode_scalar.c'}"]
    assert (tmp_path / "q4_decode_scalar.c").read_text().startswith("/*")


NEEDS_TOOLS = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")


@pytest.mark.parametrize("command", [["list"], ["explain"], ["generate", "-o", "{tmp}"],
                                     pytest.param(["check"], marks=NEEDS_TOOLS)])
def test_spec_error_exits_2_with_position(capsys, tmp_path, command):
    bad = tmp_path / "bad.imegen"
    bad.write_text("kernel k {\n  target = ime\n  compute = fp32\n}\n")
    argv = [a.replace("{tmp}", str(tmp_path / "out")) for a in command]
    code, out, err = run(capsys, argv[0], str(bad), *argv[1:])
    assert code == 2
    assert out == ""
    assert err.startswith(f"{bad}:3:3: error: kernel 'k': vmadot multiplies int8 operands")
    assert not (tmp_path / "out").exists()


def test_syntax_error_exits_2_with_position(capsys, tmp_path):
    bad = tmp_path / "syntax.imegen"
    bad.write_text("kernel k {\n  bits = 4 @\n}\n")
    code, out, err = run(capsys, "list", str(bad))
    assert code == 2 and out == ""
    assert err == f"{bad}:2:12: error: unexpected character '@'; expected ',' (another value), ';', '}}' or a setting name\n"


def test_empty_spec_exits_2_with_position(capsys, tmp_path):
    empty = tmp_path / "empty.imegen"
    empty.write_text("# nothing here\n")
    code, _, err = run(capsys, "list", str(empty))
    assert code == 2
    assert err == f"{empty}:1:1: error: the spec defines no kernel\n"


@pytest.mark.parametrize("command", ["generate", "explain", pytest.param("check", marks=NEEDS_TOOLS)])
def test_unknown_kernel_exits_2(capsys, tmp_path, command):
    extra = ["-o", str(tmp_path)] if command == "generate" else []
    code, out, err = run(capsys, command, str(EXAMPLE), "-k", "unknown", *extra)
    assert code == 2 and out == ""
    assert err.startswith("error: ")
    assert "defines no kernel named unknown" in err
    assert "it has " + ", ".join(KERNELS) in err
    assert list(tmp_path.iterdir()) == []


def test_missing_spec_file_exits_2(capsys, tmp_path):
    code, out, err = run(capsys, "list", str(tmp_path / "nope.imegen"))
    assert code == 2 and out == ""
    assert err == f"error: {tmp_path / 'nope.imegen'}: No such file or directory\n"


def test_output_folder_that_cannot_be_made_exits_2(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    code, out, err = run(capsys, "generate", str(EXAMPLE), "-o", str(tmp_path / "file" / "out"))
    assert code == 2 and out == ""
    assert err.startswith(f"error: {tmp_path / 'file'}") and "Errno" not in err


@NEEDS_TOOLS
def test_check_scalar_kernel_under_qemu(capsys):
    code, out, err = run(capsys, "check", str(EXAMPLE), "-k", "q4_decode_scalar")
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0].split() == ["kernel", "target", "compiler", "vlen", "cases", "max", "abs", "err", "max", "rel",
                                "err", "vmadot", "result"]
    rows = [line.split() for line in lines[2:] if line.startswith("q4_decode_scalar")]
    compilers = [" ".join(r[2:4]) if r[2] == "host" else r[2] for r in rows]
    assert compilers == ["clang", "gcc", "host cc"]
    assert all(r[-1] == "PASS" for r in rows)
    assert "3 of 3 builds passed" in out
    assert "[1/1] q4_decode_scalar: " in err


@pytest.mark.parametrize("vlen", [128, 256, 512, 1024])
def test_check_runs_rvv_kernels_at_some_vlen_they_accept(vlen):
    # A kernel with nothing to run at would be reported as "0 of 0 builds passed", exit 0.
    (spec,) = specs_from_text(f"kernel k {{\n  target = rvv\n  vlen = {vlen}\n}}\n", "v.imegen")
    vlens = vlens_for(plan_kernel(spec))
    assert vlens and all(v >= vlen for v in vlens)
    assert vlen in vlens


# --- hostile input and interrupted runs (no traceback: exit 2 with file:line:col, or 130) ---------

SPEC_COMMANDS = [["list"], ["explain"], ["outputs"], ["cmake-snippet"], ["generate", "-o", "{tmp}"],
                 pytest.param(["check"], marks=NEEDS_TOOLS), pytest.param(["bench", "--mlas"], marks=NEEDS_TOOLS),
                 pytest.param(["ort-check"], marks=NEEDS_TOOLS)]


def _spec_command(command: list[str], spec: Path, tmp_path: Path) -> list[str]:
    argv = [a.replace("{tmp}", str(tmp_path / "out")) for a in command]
    return [*argv, str(spec)] if argv[0] == "bench" else [argv[0], str(spec), *argv[1:]]


@pytest.mark.parametrize("data, where", [(b"\xff\xfe\x00k", "1:1"), ("kernel k {}".encode("utf-16"), "1:1"),
                                         (b"kernel k {\n  bits = 4\xff\n}\n", "2:11"), (bytes(range(256)), "2:118")],
                         ids=["stray-ff", "utf-16", "after-valid-text", "all-bytes"])
@pytest.mark.parametrize("command", SPEC_COMMANDS)
def test_non_utf8_spec_exits_2_in_every_command(capsys, tmp_path, command, data, where):
    if command[0] == "ort-check":
        from imegen.ort import ort_check
        if not ort_check.ort_available():
            pytest.skip("onnxruntime not installed")
    bad = tmp_path / "bin.imegen"
    bad.write_bytes(data)
    code, out, err = run(capsys, *_spec_command(command, bad, tmp_path))
    assert code == 2 and out == ""
    assert err.startswith(f"{bad}:{where}: error: byte 0x") and "is not UTF-8" in err, err
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", SPEC_COMMANDS)
def test_huge_integer_exits_2_in_every_command(capsys, tmp_path, command):
    if command[0] == "ort-check":
        from imegen.ort import ort_check
        if not ort_check.ort_available():
            pytest.skip("onnxruntime not installed")
    bad = tmp_path / "big.imegen"
    bad.write_text("kernel k {\n  panel = " + "7" * 4301 + "\n}\n")
    code, out, err = run(capsys, *_spec_command(command, bad, tmp_path))
    assert code == 2 and out == ""
    assert err == f"{bad}:2:11: error: integer literal with 4301 digits; no setting takes more than 30\n"


def test_cmake_snippet_refuses_a_missing_or_bad_spec(capsys, tmp_path):
    code, out, err = run(capsys, "cmake-snippet", str(tmp_path / "missing.imegen"))
    assert code == 2 and out == "" and err.startswith("error: ") and "missing.imegen" in err
    code, out, err = run(capsys, "cmake-snippet", str(EXAMPLE))
    assert code == 0 and "imegen_generate(onnxruntime_mlas SPEC" in out


def test_generate_refuses_empty_output_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["generate", str(EXAMPLE), "-o", ""])
    assert info.value.code == 2
    assert "error: argument -o/--output: is empty; name the folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_comment_edit_rewrites_nothing(capsys, tmp_path):
    spec = tmp_path / "s.imegen"
    spec.write_text(EXAMPLE.read_text())
    run(capsys, "generate", str(spec), "-o", str(tmp_path / "out"))
    spec.write_text("# a new comment\n# moves every kernel down two lines\n" + EXAMPLE.read_text())
    code, out, _ = run(capsys, "generate", str(spec), "-o", str(tmp_path / "out"))
    assert code == 0 and out.splitlines() and all(line.startswith("unchanged ") for line in out.splitlines()), out
    # ... while a setting change rewrites exactly that kernel's files
    edited = EXAMPLE.read_text().replace("tile    = 1x8", "tile    = 1x16")
    assert edited != EXAMPLE.read_text()
    spec.write_text(edited)
    code, out, _ = run(capsys, "generate", str(spec), "-o", str(tmp_path / "out"))
    assert sorted(line for line in out.splitlines() if line.startswith("wrote")) == [
        f"wrote {tmp_path / 'out' / 'q4_decode_scalar.c'}", f"wrote {tmp_path / 'out' / 'q4_decode_scalar.h'}"]


def test_removed_kernel_files_are_removed_foreign_files_kept(capsys, tmp_path):
    spec, out_dir = tmp_path / "s.imegen", tmp_path / "out"
    spec.write_text("kernel a {}\nkernel b {}\nkernel c {}\n")
    run(capsys, "generate", str(spec), "-o", str(out_dir))
    (out_dir / "mine.c").write_text("int mine;\n")  # a file imegen did not write
    (out_dir / "c.c").write_text("/* taken over by hand */\n")  # imegen wrote it, but it is no longer imegen's
    spec.write_text("kernel a {}\n")
    code, out, err = run(capsys, "generate", str(spec), "-o", str(out_dir))
    assert code == 0
    assert f"removed {out_dir / 'b.c'} (no longer generated from s.imegen)" in out.splitlines()
    assert f"removed {out_dir / 'b.h'} (no longer generated from s.imegen)" in out.splitlines()
    assert f"warning: {out_dir / 'c.c'} is no longer generated from s.imegen, but has been edited: left in place" in err
    assert sorted(p.name for p in out_dir.glob("*.[ch]")) == ["a.c", "a.h", "c.c", "mine.c"]
    # -k generates a subset: the spec's other kernels are not stale
    spec.write_text("kernel a {}\nkernel d {}\n")
    run(capsys, "generate", str(spec), "-o", str(out_dir))
    code, out, _ = run(capsys, "generate", str(spec), "-o", str(out_dir), "-k", "a")
    assert code == 0 and not any(line.startswith("removed") for line in out.splitlines()) and (out_dir / "d.c").exists()


def test_a_file_taken_over_by_another_spec_is_reported(capsys, tmp_path):
    a, b, out_dir = tmp_path / "a.imegen", tmp_path / "b.imegen", tmp_path / "out"
    a.write_text("kernel k {}\nkernel only_a {}\n")
    b.write_text("kernel k { bits = 8 }\n")
    run(capsys, "generate", str(a), "-o", str(out_dir))
    code, out, err = run(capsys, "generate", str(b), "-o", str(out_dir))
    assert code == 0
    assert f"warning: {out_dir / 'k.c'} was generated from a.imegen; it now comes from b.imegen" in err
    a.write_text("kernel only_a {}\n")  # a no longer owns k.*: regenerating it must not delete b's files
    code, out, err = run(capsys, "generate", str(a), "-o", str(out_dir))
    assert code == 0 and (out_dir / "k.c").exists() and "bits=8" in (out_dir / "k.c").read_text()


class _ClosedPipe:
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def test_generate_into_a_closed_pipe_still_writes_every_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdout", _ClosedPipe())  # `imegen generate ... | head -0`
    assert main(["generate", str(EXAMPLE), "-o", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.[ch]")) == sorted(f"{k}.{e}" for k in KERNELS for e in "ch")
    assert not list(tmp_path.glob(".*.tmp"))


def test_list_into_a_closed_pipe_is_quiet(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdout", _ClosedPipe())
    assert main(["list", str(EXAMPLE)]) == 0
    assert capsys.readouterr().err == ""


def test_interrupted_write_leaves_no_partial_file(tmp_path, monkeypatch):
    from imegen import outputs

    (tmp_path / "k.c").write_text("old\n")

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs.os, "replace", interrupted)  # Ctrl-C between writing and renaming
    with pytest.raises(KeyboardInterrupt):
        outputs.write_if_changed(tmp_path / "k.c", "new\n")
    assert (tmp_path / "k.c").read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["k.c"]


def test_ctrl_c_is_one_line_exit_130(capsys, monkeypatch):
    import imegen.cli as cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "missing_tools", lambda: [])
    monkeypatch.setattr(cli, "check_kernel", interrupted)
    code, out, err = run(capsys, "check", str(EXAMPLE))
    assert code == 130 and out == ""
    assert err.splitlines()[-1] == "interrupted" and "Traceback" not in err


@NEEDS_TOOLS
def test_sigint_during_check_exits_130_without_traceback(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    spec = tmp_path / "slow.imegen"  # fresh kernels, so their builds are not cached and take a while
    spec.write_text("".join(f"kernel k{time.time_ns()}_{i} {{ target = rvv }}\n" for i in range(3)))
    root = Path(__file__).resolve().parent.parent
    def as_from_a_terminal():  # SIGINT at its default and deliverable: a shell's background job starts with it
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # ignored, and a CI runner may hand it down blocked
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    p = subprocess.Popen([sys.executable, "-m", "imegen", "check", str(spec)], cwd=root, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal)
    first = p.stderr.readline()  # the progress line: the run is under way
    assert first.startswith("[1/3]"), first
    # Python can lose a signal that lands in a finalizer ("Exception ignored"): press again, often, until it
    # exits (once the first press is honoured, imegen ignores the later ones while it winds down).
    for _ in range(40):
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            continue
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (out, err)
    assert "Traceback" not in err and err.rstrip().splitlines()[-1] == "interrupted", err


@NEEDS_TOOLS
def test_bench_mlas_error_has_one_prefix(capsys):
    code, out, err = run(capsys, "bench", "--mlas", str(EXAMPLE))
    assert code == 2
    assert err == f"error: {EXAMPLE} has no abi = mlas kernels\n"


def test_ort_check_with_a_broken_onnxruntime(capsys, monkeypatch):
    from imegen.ort import ort_check

    def broken():
        raise RuntimeError("onnxruntime_pybind11_state: undefined symbol")

    monkeypatch.setattr(ort_check, "_ort", broken)
    code, out, err = run(capsys, "ort-check")
    assert code == 2 and out == ""
    assert err == ("error: importing onnxruntime/onnx failed (RuntimeError: onnxruntime_pybind11_state: undefined "
                   "symbol); reinstall them: python3 -m pip install -e '.[test]'\n")


@pytest.mark.parametrize("argv", [["check", str(EXAMPLE), "--seed", "-1"], ["ort-check", "-j", "0"]])
def test_bad_numeric_options_are_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "must be >= " in capsys.readouterr().err


@NEEDS_TOOLS
@pytest.mark.parametrize("stem", ["2layer", "my-spec"])
def test_spec_file_name_that_is_not_a_c_identifier(capsys, tmp_path, stem):
    spec = tmp_path / f"{stem}.imegen"
    spec.write_text("kernel q4_gemv { abi = mlas  compute = int8  op = gemv  target = scalar  tile = 1x16 }\n"
                    "kernel q4_gemm { abi = mlas  compute = int8  op = gemm  target = scalar  tile = 4x16 }\n")
    code, out, _ = run(capsys, "generate", str(spec), "-o", str(tmp_path / "out"))
    assert code == 0
    prefix = {"2layer": "imegen_2layer_", "my-spec": "my_spec_"}[stem]
    sources = sorted((tmp_path / "out").glob("*.c"))
    assert tmp_path / "out" / f"{prefix}dispatch.c" in sources
    for compiler in ("clang", "gcc"):
        for src in sources:
            toolchain.compile_c([src], tmp_path / f"{src.stem}.{compiler}.o", compiler=compiler, march="rv64gc",
                                include_dirs=[tmp_path / "out"])


def test_explain_shows_the_block_start_and_the_registers_in_use(capsys, tmp_path):
    spec = tmp_path / "t.imegen"
    spec.write_text("kernel t { op = gemm compute = int8 target = ime tile = 8x8 k_unroll = 2 zero_point = asymmetric }\n")
    code, out, _ = run(capsys, "explain", str(spec))
    assert code == 0
    assert "= 28 of 32 (the validator's lower bound; the allocation uses v0-v31)" in out
    start = out.split("  block start (", 1)[1].split("  inner loop:", 1)[0]
    assert "vlse64.v v16, (%[zp]), zero" in start and "vmv" not in start  # zero points read twice, no copy


@NEEDS_TOOLS
@pytest.mark.parametrize("command", ["bench", "tune"])
def test_unwritable_results_folder_is_refused_before_the_run(capsys, monkeypatch, tmp_path, command):
    """A full bench takes half an hour: an output folder it cannot write is an error up front, not at the end."""
    from imegen.perf import bench
    from imegen.perf.search import tune

    def must_not_run(*args, **kwargs):
        raise AssertionError("ran before checking its output folder")

    monkeypatch.setattr(bench, "run", must_not_run)
    monkeypatch.setattr(tune, "search", must_not_run)
    (tmp_path / "file").write_text("")
    code, out, err = run(capsys, command, "--quick", "-o", str(tmp_path / "file" / "results"))
    assert code == 2 and out == ""
    assert err == f"error: cannot write the results to {tmp_path / 'file' / 'results'}: Not a directory\n"
