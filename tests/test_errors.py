"""Errors a user meets outside the spec: Ctrl-C at any moment, a missing optional Python package, a
package registry that cannot be reached, and verifying commands that ran nothing. Each ends in one
line on stderr and a documented exit status (130, 2, 2, 1), never a traceback or a PASS."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import replace
from pathlib import Path

import pytest

from imegen import toolchain
from imegen.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "qwen_mlp.imegen"
NEEDS_TOOLS = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- Ctrl-C from the first moment ------------------------------------------------------------------

SCRIPT = Path(sysconfig.get_path("scripts")) / "imegen"  # the console script pip wrote (not a pyenv shim)


def _as_from_a_terminal():  # SIGINT at its default and deliverable (a CI runner may hand it down ignored)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _interrupt_after(cmd: list[str], delay: float) -> tuple[int, str]:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_as_from_a_terminal)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    return p.returncode, err


@pytest.mark.parametrize("how", ["script", "python -m imegen"])
def test_ctrl_c_while_imegen_is_still_importing(tmp_path, how):
    """SIGINT at delays from inside the imports of lark/NumPy/Jinja2 to well into the command: always
    exit 130 and one line. Before, a Ctrl-C during the imports ended in a KeyboardInterrupt traceback."""
    if how == "script" and not SCRIPT.exists():
        pytest.skip(f"no console script at {SCRIPT} (pip install -e .)")
    during_imports = 0
    for delay in (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0):
        spec = tmp_path / "slow.imegen"  # fresh kernels: uncached builds keep the command running past the delay
        spec.write_text("".join(f"kernel k{time.time_ns()}_{i} {{ target = rvv }}\n" for i in range(8)))
        cmd = ([str(SCRIPT)] if how == "script" else [sys.executable, "-m", "imegen"]) + ["check", str(spec)]
        code, err = _interrupt_after(cmd, delay)
        if "Fatal Python error: init_import_site" in err:  # the interpreter's own startup, before any imegen code
            continue
        if "Traceback" in err and not re.search(r'File "[^"]*/imegen/[^"]*\.py"', err):
            continue  # the press landed in the launcher's own imports (pip's script, `-m`), before imegen's code ran
        # 130, or death by SIGINT after the line (a shell reports both as 130): under load about one run in six at
        # 0.5 s ends by the signal after printing "interrupted" (seen with Python 3.11; cause not yet found)
        assert code in (130, -signal.SIGINT), (delay, err)
        assert "Traceback" not in err and err.splitlines()[-1] == "interrupted", (delay, err)
        # before "interrupted" only check's progress lines ("[1/3] k...", "  k...: clang, vlen 128: ...")
        assert all(line.startswith(("[", "  ")) for line in err.splitlines()[:-1]), (delay, err)
        during_imports += err == "interrupted\n"
    assert during_imports >= 1, "no SIGINT landed before the command started: the import window went untested"


# --- a missing optional Python package -------------------------------------------------------------

def _without(module: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The command line in a fresh interpreter where `module` cannot be imported (as if not installed)."""
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            f"from imegen.entry import main\nsys.exit(main({argv!r}))")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600)


def _tiny_model(path: Path) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "tiny", [x], [y])
    onnx.save(helper.make_model(graph), str(path))
    return path


@pytest.mark.parametrize("module, pip, command", [
    ("onnx", "onnx", ["ort-rewrite", str(EXAMPLE), "{model}", "-o", "{out}"]),
    ("onnx", "onnx", ["ort-model-check", str(EXAMPLE), "{model}"]),
    ("onnx", "onnx", ["qwen-model", "{out}", "--layers", "1", "--vocab", "64"]),
    ("onnxruntime", "onnxruntime", ["qwen-model", "{out}", "--form", "plain", "--layers", "1", "--vocab", "64"]),
    ("onnx_ir", "onnx-ir", ["qwen-model", "{out}", "--form", "plain", "--layers", "1", "--vocab", "64"]),
])
def test_missing_optional_package_is_one_line(tmp_path, module, pip, command):
    model = _tiny_model(tmp_path / "in.onnx")
    out = tmp_path / "out.onnx"
    argv = [a.format(model=model, out=out) for a in command]
    r = _without(module, argv, tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == f"error: imegen {argv[0]} needs the Python package {pip} (pip install {pip})"
    assert "Traceback" not in r.stderr and not out.exists()


def test_ort_check_without_onnx_is_one_line(tmp_path):
    r = _without("onnx", ["ort-check"], tmp_path)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert len(r.stderr.splitlines()) == 1 and "needs onnxruntime and onnx" in r.stderr


def test_a_package_too_old_for_a_module_is_told_apart():
    from imegen.cli import missing_module

    pytest.importorskip("onnxruntime")
    e = ModuleNotFoundError("No module named 'onnxruntime.quantization.x'", name="onnxruntime.quantization.x")
    assert missing_module("qwen-model", e) == (
        "error: imegen qwen-model needs the Python package onnxruntime with its module onnxruntime.quantization.x, "
        "which the installed one lacks (pip install --upgrade onnxruntime)")


# --- the package registry cannot be reached --------------------------------------------------------

UNREACHABLE = "http://127.0.0.1:9/debian"  # the discard port: nothing listens, the connection is refused


@pytest.fixture
def no_registry(monkeypatch, tmp_path):
    """An empty imegen cache (no sysroot to fall back on) and a Debian mirror apt cannot connect to."""
    import shutil

    from imegen.ort import sysroot

    if not shutil.which("apt-get") or not Path(sysroot.KEYRING).exists():
        pytest.skip("needs apt-get and Debian's archive keyring")
    monkeypatch.setenv("IMEGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(sysroot, "MIRROR", UNREACHABLE)
    return tmp_path


@NEEDS_TOOLS
@pytest.mark.parametrize("command", ["ort-library", "ort-model-check"])
def test_unreachable_registry_is_one_line(capsys, no_registry, command):
    """Real apt against a mirror that refuses connections. Before: a SysrootError traceback, and a
    misleading one (apt-get update exits 0 when it cannot fetch, so the message said Debian "no longer
    serves" onnxruntime)."""
    argv = [command, str(EXAMPLE)] + ([str(_tiny_model(no_registry / "m.onnx"))] if command == "ort-model-check" else [])
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: apt-get update for Debian trixie riscv64 failed")
    assert f"Failed to fetch {UNREACHABLE}/dists/trixie/InRelease" in err and "Connection refused" in err


def test_apt_failure_is_one_line_with_its_reason(monkeypatch, tmp_path):
    """Whatever apt prints, the error is one line: the failed fetch, else apt's first "E:" line."""
    from imegen.ort import sysroot

    monkeypatch.setenv("IMEGEN_CACHE_DIR", str(tmp_path))
    fake = tmp_path / "apt-cache"
    fake.write_text("#!/bin/sh\necho 'Reading package lists...' >&2\necho 'E: The list of sources could not be read.' >&2\n"
                    "echo 'E: second error' >&2\nexit 100\n")
    fake.chmod(0o755)
    with pytest.raises(sysroot.SysrootError) as info:
        sysroot._apt(str(fake), "trixie", "policy", "libonnxruntime1.21")
    assert str(info.value) == (f"{fake} policy libonnxruntime1.21 for Debian trixie riscv64 failed (exit 100): "
                               "The list of sources could not be read.")
    with pytest.raises(sysroot.SysrootError, match="^imegen fetches Debian's riscv64 onnxruntime with no-such-apt, "):
        sysroot._apt("no-such-apt", "trixie", "update")


# --- an MLAS dispatch no hart would install -------------------------------------------------------

def mixed_dispatch(vlen: int, rvv_abi: str = "mlas") -> str:
    """IME's int8 kernel and an RVV fp32 pair (whose gemv needs VLEN >= vlen), as examples/ort/ort121_ime.imegen."""
    return ("defaults { abi = mlas  bits = 4  block = 32  unpack = planar  panel = 16 }\n"
            "kernel i_gemm { compute = int8  op = gemm  target = ime  tile = 4x16 }\n"
            f"kernel r_m1 {{ abi = {rvv_abi}  compute = fp32  op = gemv  target = rvv  vlen = {vlen}  tile = 1x16 }}\n"
            f"kernel r_deq {{ abi = {rvv_abi}  compute = fp32  op = gemm  target = rvv }}\n")


@pytest.mark.parametrize("vlen", [512, 1024])
def test_ime_dispatch_refuses_an_rvv_kernel_needing_more_than_256(vlen):
    """Before: accepted, generated, and `imegen check` failed at run time ("dispatch not supported")."""
    from imegen.errors import SpecError
    from imegen.ir import specs_from_text

    with pytest.raises(SpecError) as info:
        specs_from_text(mixed_dispatch(vlen), "t.imegen")
    assert str(info.value) == (
        f"t.imegen:3:1: error: kernel 'r_m1': needs VLEN >= {vlen}, but it shares the MLAS dispatch (all abi = mlas "
        "kernels of a spec) with IME kernel 'i_gemm', which runs only at VLEN = 256: the dispatch's supported() would "
        "be false on every hart; use vlen <= 256, or abi = imegen")


@pytest.mark.parametrize("text", [
    mixed_dispatch(256),  # IME and RVV both run at 256
    mixed_dispatch(1024, rvv_abi="imegen"),  # the RVV kernels are not in the dispatch
    "defaults { abi = mlas  compute = fp32 }\nkernel m1 { op = gemv  target = rvv  vlen = 512  tile = 1x16 }\n"
    "kernel dq { op = gemm  target = rvv  vlen = 1024 }\n",  # RVV only: supported from VLEN 1024 on
])
def test_dispatches_some_hart_can_run_are_accepted(text):
    from imegen.ir import specs_from_text

    assert len(specs_from_text(text, "t.imegen")) >= 2


@NEEDS_TOOLS
def test_ime_with_a_wide_rvv_kernel_has_no_vlen_where_the_dispatch_is_supported(tmp_path):
    """The ground truth behind ir._check_dispatch_vlens: built anyway (the RVV kernel widened past the
    validator), the dispatch's generated supported() is false at every VLEN QEMU offers, so MLAS would
    never install it. At vlen 256 (what the validator allows) it is true at 256."""
    from imegen.ir import specs_from_text
    from imegen.abi import mlas_check
    from imegen.abi.mlas import plan_dispatch
    from imegen.plan import plan_kernel

    spec_file = str(tmp_path / "mix.imegen")
    specs = specs_from_text(mixed_dispatch(256), spec_file)
    for vlen, supported_at in ((256, [256]), (512, [])):
        plans = [plan_kernel(replace(s, vlen=vlen) if s.name == "r_m1" else s) for s in specs]
        exe = mlas_check.build(plan_dispatch(plans, spec_file), spec_file)
        assert [v for v in (128, 256, 512, 1024) if mlas_check.supported(exe, vlen=v)] == supported_at


# --- verifying commands that ran nothing fail --------------------------------------------------------

RVV_1024_DISPATCH = "kernel r_gemv { target = rvv  vlen = 1024  abi = mlas  compute = int8  op = gemv  tile = 1x16 }\n"


def _table(out: str) -> list[list[str]]:
    return [line.split() for line in out.split("\n\n")[0].splitlines()[2:]]


@NEEDS_TOOLS
def test_check_runs_an_rvv_dispatch_above_512_at_its_vlen(capsys, tmp_path):
    """Before: only the three refusal rows at 128..512 ran and check said "3 of 3 builds passed"."""
    spec = tmp_path / "d1024.imegen"
    spec.write_text(RVV_1024_DISPATCH)
    code, out, err = run(capsys, "check", str(spec))
    assert code == 0, out + err
    data = [r for r in _table(out) if r[0] == "r_gemv"]
    assert [(r[3], r[-1]) for r in data] == [("1024", "PASS")] and int(data[0][4]) > 0, out


@NEEDS_TOOLS
def test_check_with_only_refusals_fails(capsys, tmp_path, monkeypatch):
    """A dispatch (or kernel) with no VLEN to run its data at: its refusal rows alone must not pass."""
    from imegen import check

    spec = tmp_path / "d.imegen"
    spec.write_text(RVV_1024_DISPATCH)  # its refusals at 128..512 are right, and pass
    monkeypatch.setattr(check, "dispatch_vlens", lambda d: [])  # the fallback for vlen > 512 missing, as before
    code, out, err = run(capsys, "check", str(spec))
    assert code == 1, out
    assert any(r[0] == "r_gemv" and "nothing checked" in " ".join(r) for r in _table(out)), out
    assert err.splitlines()[-1] == "error: nothing was checked: no case ran at a VLEN its kernel accepts"


@NEEDS_TOOLS
def test_check_kernel_with_only_refusals_fails(capsys, tmp_path, monkeypatch):
    from imegen import check

    spec = tmp_path / "k.imegen"
    spec.write_text("kernel r { target = rvv  vlen = 1024 }\n")  # its refusals at 128..512 are right, and pass
    monkeypatch.setattr(check, "vlens_for", lambda plan: [])
    code, out, err = run(capsys, "check", str(spec))
    assert code == 1, out
    rows = _table(out)
    assert [r[3:5] for r in rows[:-1]] == [[v, "(refuses)"] for v in ("128", "256", "512")] and rows[-1][:5] == ["r", "rvv", "-", "-", "0"], out
    assert "FAIL: nothing checked: no build ran at a VLEN the kernel accepts" in out
    assert "error: nothing was checked" in err


def test_ort_check_unknown_builtin_kernel_is_a_usage_error(capsys):
    """Before: `ort-check -k nosuch` filtered the built-in set to nothing and reported 0 of 0, exit 0."""
    pytest.importorskip("onnxruntime")
    code, out, err = run(capsys, "ort-check", "-k", "nosuch")
    assert code == 2 and out == ""
    assert err.startswith("error: ort-check's built-in set has no kernel named nosuch; it has ")


@NEEDS_TOOLS
def test_ort_check_with_no_case_fails(capsys, monkeypatch):
    pytest.importorskip("onnxruntime")
    from imegen.ort import ort_check

    monkeypatch.setattr(ort_check, "fast_shapes", lambda: [])
    code, out, err = run(capsys, "ort-check", "-k", ort_check.builtin_specs(False)[0].name)
    assert code == 1
    assert "0 of 0 kernel x shape cases" in out
    assert err.splitlines()[-1].startswith("error: nothing was checked for 1 of 1 kernels")


@NEEDS_TOOLS
def test_ort_check_fails_for_a_kernel_no_shape_reaches(capsys, monkeypatch, tmp_path):
    """One kernel checked, the other (block 64) with no ORT shape in the run: the run fails naming it."""
    pytest.importorskip("onnxruntime")
    from imegen.ort import ort_check

    one = [s for s in ort_check.fast_shapes() if s.block == 32 and False in s.bias][:1]
    monkeypatch.setattr(ort_check, "fast_shapes", lambda: one)
    spec = tmp_path / "two.imegen"
    spec.write_text("kernel b32 { target = scalar  block = 32 }\nkernel b64 { target = scalar  block = 64 }\n")
    code, out, err = run(capsys, "ort-check", str(spec), "-j", "1")
    assert code == 1, out + err
    assert "1 of 1 kernel x shape cases within ORT's tolerance" in out
    assert err.splitlines()[-1] == "error: nothing was checked for 1 of 2 kernels (b64): ORT's shapes have no case for them"


def _fake_mlas_test(monkeypatch, imegen_run, baseline):
    from imegen.ort import ort_tree

    monkeypatch.setattr(ort_tree, "build_mlas_test", lambda pin, spec: Path("/nonexistent/onnxruntime_mlas_test"))
    monkeypatch.setattr(ort_tree, "run_mlas_test", lambda exe, flt, vlen, disable_imegen: baseline if disable_imegen else imegen_run)


def _gtest(passed: int, calls: int):
    from imegen.ort.ort_tree import GtestResult

    return GtestResult(passed, 0, 0, 0, 0, {"SQ4BitGemmKernel_CompInt8": calls}, "")


@pytest.mark.parametrize("imegen_run, why", [
    (_gtest(1, 0), "imegen's dispatch was never called"),  # e.g. --vlen 128 with an IME spec: MLAS kept its own kernels
    (_gtest(0, 0), "no test passed, so nothing was checked"),
])
def test_ort_mlas_test_fails_when_imegen_was_not_exercised(capsys, monkeypatch, imegen_run, why):
    """ORT's gtest results are real in tests/test_ort_tree.py; here only the command's verdict on them.
    Before, a run where MLAS never called imegen's dispatch (the BlockQ4 test passing) exited 0."""
    _fake_mlas_test(monkeypatch, imegen_run, baseline=_gtest(1, 0))
    code, out, err = run(capsys, "ort-mlas-test", str(ROOT / "examples" / "ort" / "ort121_ime.imegen"), "--vlen", "128")
    assert code == 1, out
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and why in errors[0], err


def test_ort_mlas_test_passes_when_imegen_ran(capsys, monkeypatch):
    _fake_mlas_test(monkeypatch, _gtest(3441, 44865), baseline=_gtest(1, 0))
    code, out, err = run(capsys, "ort-mlas-test", str(ROOT / "examples" / "ort" / "ort121_ime.imegen"))
    assert code == 0 and "error" not in out + err, out + err
