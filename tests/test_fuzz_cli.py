"""Fuzzing the front end through the command line, in-process (imegen.cli.main).

Inputs are mutations of real specs (token deletions, duplications, swaps, digit changes, random
insertions) and byte garbage. Whatever the input, `imegen generate` must either accept it (exit 0)
or refuse it with exactly one `file:line:col: error: ...` line (exit 2): never a traceback, never
an error without a position. Accepted specs must generate C that compiles warning-free (clang
-Wall -Wextra -Werror; GCC too for scalar and IME); with the deep profile (`--fuzz`) they must
also pass `imegen check` under QEMU.
"""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from imegen import targets, toolchain
from imegen.cli import main
from imegen.ir import load_specs
from imegen.render import march_for
from imegen.plan import plan_kernel

ROOT = Path(__file__).resolve().parent.parent
DEEP = settings.default.max_examples > settings.get_profile("ci").max_examples  # `--fuzz`
SMALL = [
    "defaults { bits = 8  block = 64 }\nkernel k { target = rvv  compute = int8  tile = 2x16  vlen = 256 }\n",
    "kernel g { op = gemv  target = scalar  compute = fp32  tile = 1x4  panel = 8  bias = yes }\n",
    "kernel i { target = ime  compute = int8  op = gemm  tile = 4x8  k_unroll = 2  scales = separate }\n",
    "kernel m1 { abi = mlas  compute = int8  op = gemv  target = scalar  tile = 1x16 }\n"
    "kernel mm { abi = mlas  compute = int8  op = gemm  target = scalar  tile = 4x16 }\n",
]
CORPUS = [(ROOT / "examples" / "qwen_mlp.imegen").read_text(), (ROOT / "examples" / "ort_mlas.imegen").read_text(), *SMALL]
TOKEN = re.compile(r"\s+|#[^\n]*|[A-Za-z0-9_]+|.", re.S)
SNIPPETS = ["{", "}", "=", ";", "kernel", "defaults", "x", "0", "4x", "x16", "256", "9" * 40, "\n", "#", "\t",
            "tile = 16x16", "panel = 1", "abi = mlas", "qwen_mlp_dispatch", "Q4_prefill_ime", "driver", "stdint", "k" * 300, "\u00e9", "\ufeff", "\x00"]
POSITIONED = re.compile(r"[^\n]+:\d+:\d+: error: [^\n]+\n")


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


@st.composite
def mutated(draw, max_ops: int = 4) -> bytes:
    toks = tokens(draw(st.sampled_from(CORPUS)))
    for _ in range(draw(st.integers(1, max_ops))):
        i = draw(st.integers(0, len(toks) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "digit", "insert", "text"]))
        if op == "delete" and len(toks) > 1:
            del toks[i]
        elif op == "duplicate":
            toks.insert(i, toks[i])
        elif op == "swap":
            j = draw(st.integers(0, len(toks) - 1))
            toks[i], toks[j] = toks[j], toks[i]
        elif op == "digit":
            digits = [k for k, t in enumerate(toks) if any(c.isdigit() for c in t)]
            k = draw(st.sampled_from(digits))
            pos = draw(st.sampled_from([p for p, c in enumerate(toks[k]) if c.isdigit()]))
            toks[k] = toks[k][:pos] + draw(st.sampled_from("0123456789") | st.just("99999")) + toks[k][pos + 1:]
        elif op == "insert":
            toks.insert(i, draw(st.sampled_from(SNIPPETS)))
        else:
            toks.insert(i, draw(st.text(max_size=8)))
    data = "".join(toks).encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 9)) == 0:  # now and then a stray byte
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=3)) + data[at:]
    return data


def generate(data: bytes, folder: Path) -> tuple[int, str, str, Path]:
    spec = folder / "fuzz.imegen"
    spec.write_bytes(data)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["generate", str(spec), "-o", str(folder / "out")])
    return code, out.getvalue(), err.getvalue(), spec


def assert_clean_outcome(code: int, out: str, err: str, spec: Path) -> None:
    if code == 0:
        assert not err or all(line.startswith("warning: ") for line in err.splitlines()), err
        return
    assert code == 2, (code, out, err)
    assert out == ""
    assert POSITIONED.fullmatch(err) and err.startswith(f"{spec}:"), err
    line, col = map(int, err[len(f"{spec}:"):].split(":")[:2])
    lines = spec.read_bytes().split(b"\n")
    assert 1 <= line <= len(lines) and 1 <= col <= len(lines[line - 1]) + 1, err  # a place in the file


FAST = settings(max_examples=3000 if DEEP else 300, suppress_health_check=[HealthCheck.too_slow], deadline=None)


@FAST
@given(mutated())
@example(b"\xef\xbb\xbf#\x80 comment\n")  # a stray byte right after a byte-order mark (CI, 2026-12-03)
def test_mutated_specs_are_accepted_or_refused_with_a_position(data):
    with tempfile.TemporaryDirectory() as d:
        assert_clean_outcome(*generate(data, Path(d)))


@FAST
@given(st.binary(max_size=200) | st.builds(lambda a, b: a + b, st.sampled_from(CORPUS).map(str.encode), st.binary(max_size=20)))
def test_byte_garbage_is_refused_with_a_position(data):
    with tempfile.TemporaryDirectory() as d:
        assert_clean_outcome(*generate(data, Path(d)))


def _compilers(target: str) -> list[str]:
    return list(targets.get(target).compilers)  # GCC 12: no RVV intrinsics, so rvv is clang only


@pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")
@settings(max_examples=40 if DEEP else 5, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
          deadline=None)
@given(mutated(max_ops=2).filter(lambda data: b"kernel" in data))
def test_accepted_mutations_compile_warning_free(data):
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        code, out, err, spec = generate(data, folder)
        assert_clean_outcome(code, out, err, spec)
        assume(code == 0)
        plans = [plan_kernel(s) for s in load_specs(spec)]
        gen = folder / "out"
        kernels = {f"{p.name}.c": p for p in plans}
        for src in sorted(gen.glob("*.c")):
            plan = kernels.get(src.name)
            compilers = _compilers(plan.spec.target) if plan else ["clang", "gcc"]  # the MLAS dispatch is plain C
            for compiler in compilers:
                toolchain.compile_c([src], folder / f"{src.stem}.{compiler}.o", compiler=compiler,
                                    march=march_for(plan) if plan else "rv64gc", include_dirs=[gen])
        if DEEP:  # and run them: generate, compile, QEMU, compare to NumPy
            out_, err_ = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out_), contextlib.redirect_stderr(err_):
                code = main(["check", str(spec)])
            assert code == 0, out_.getvalue() + err_.getvalue()
