"""The command line: list, explain, generate, error reporting, and one QEMU-backed check."""

from __future__ import annotations

from pathlib import Path

import pytest

from imegen import toolchain
from imegen.check import vlens_for
from imegen.cli import main
from imegen.ir import load_specs, specs_from_text
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
    assert sorted(p.name for p in out_dir.iterdir()) == expected
    assert sorted(out.splitlines()) == sorted(f"wrote {out_dir / name}" for name in expected)
    for name in expected:
        text = (out_dir / name).read_text()
        assert text.startswith("/*") and str(EXAMPLE) in text.split("*/", 1)[0]
    mtimes = {p.name: p.stat().st_mtime_ns for p in out_dir.iterdir()}

    code, out, err = run(capsys, "generate", str(EXAMPLE), "-o", str(out_dir))
    assert code == 0 and err == ""
    assert sorted(out.splitlines()) == sorted(f"unchanged {out_dir / name}" for name in expected)
    assert {p.name: p.stat().st_mtime_ns for p in out_dir.iterdir()} == mtimes


def test_generate_one_kernel_and_rewrite_after_edit(capsys, tmp_path):
    code, out, _ = run(capsys, "generate", str(EXAMPLE), "-o", str(tmp_path), "-k", "q4_decode_scalar")
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q4_decode_scalar.c", "q4_decode_scalar.h"]
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
    assert err == f"{bad}:2:12: error: unexpected character '@'; expected ';', '}}' or a setting name\n"


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
    assert err.startswith("error: ") and "nope.imegen" in err


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
