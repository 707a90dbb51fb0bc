"""The K3's MLAS path: abi = mlas kernels of target ime2 (the A100's IME2, VLEN 1024) validate with 16-column
panels, their dispatch matches the NumPy reference the way MLAS drives it (imegen/runtime/mlas_driver.c, IME2
emulated), and ORT 1.21's own MLAS QNBitGemm unit tests pass under QEMU at VLEN 1024 with the dispatch built in
(its kernels verifiably ran), keep the vmadots on the harts IMEGEN_IME_HARTS names, and install nothing where no
hart has IME2."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from imegen import toolchain
from imegen.abi import mlas_check
from imegen.abi.mlas import COMPUTE_FP32, COMPUTE_INT8, plan_dispatch
from imegen.errors import SpecError
from imegen.ir import load_specs, specs_from_text
from imegen.plan import plan_kernel

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "ort" / "ort121_ime2.imegen"
VLEN = 1024

GROUP = """
defaults { abi = mlas  bits = 4  target = ime2  compute = int8  block = 32  k_unroll = 2  unpack = interleaved }
kernel g1 { op = gemv  tile = 1x16 }
kernel gm { op = gemm  tile = 8x16 }
"""


def test_ime2_kernels_validate_for_mlas_with_16_column_panels():
    """The old code refused every abi = mlas ime2 kernel ("target ime2 has no MLAS dispatch")."""
    gemv, gemm = specs_from_text(GROUP, "k3.imegen")
    assert (gemv.target, gemv.abi, gemv.panel, gemv.vlen, gemv.scales) == ("ime2", "mlas", 16, VLEN, "ort")
    assert (gemm.tile_m, gemm.tile_n, gemm.zero_point) == (8, 16, "asymmetric")  # zero points from ORT at run time
    assert len(load_specs(SPEC)) == 20


@pytest.mark.parametrize("settings, says", [
    ("op = gemm  tile = 8x32", "tile width 32 spans two panels"),
    ("op = gemm  tile = 8x32  panel = 32", "panel 32 must divide 16"),
    ("op = gemm  tile = 8x16  bits = 8", "serves 4-bit weights"),
    ("op = gemm  tile = 8x16  block = 16", "not a multiple of the K step"),
])
def test_what_ime2_cannot_serve_behind_mlas_is_refused(settings, says):
    with pytest.raises(SpecError, match=says):
        specs_from_text(f"kernel k {{ abi = mlas  target = ime2  compute = int8  k_unroll = 2  {settings} }}")


def _cases(rng, groups, shapes):
    return [(mlas_check.random_case(rng, M, N, K, block, symmetric=i % 3 == 0, bias=i % 2 == 0, compute=compute,
                                    exact=exact), exact)
            for i, (M, N, K) in enumerate(shapes) for block, compute in groups for exact in (False, True)]


# ORT's shapes (test_sqnbitgemm.cpp), a few: one row (the gemv kernel), rows past a tile of 8, N past a 16-column
# panel and past MLAS's 128-column chunks, K with a partial block.
SHAPES = [(1, 1, 16), (1, 288, 93), (1, 33, 1234), (11, 40, 93), (43, 50, 131), (9, 300, 200)]


def _check(d, spec_file, cases):
    results = mlas_check.run(mlas_check.build(d, spec_file), [c for c, _ in cases], vlen=VLEN)
    verdicts = [mlas_check.check(d, c, r, exact=exact) for (c, exact), r in zip(cases, results)]
    return results, [(c.case.shape, c.case.qw.block_size, v.message) for (c, _), v in zip(cases, verdicts) if not v.ok]


def test_the_k3_dispatch_matches_numpy_like_mlas_drives_it():
    """Every IME2 block size of the example, interleaved (A's k permuted while staged) and planar, and the RVV groups
    beside them, at VLEN 1024 against the NumPy reference; the CompInt8 cases ran vmadots."""
    d = plan_dispatch([plan_kernel(s) for s in load_specs(SPEC)], str(SPEC))
    groups = [(32, COMPUTE_INT8), (64, COMPUTE_INT8), (128, COMPUTE_INT8), (256, COMPUTE_INT8), (16, COMPUTE_INT8),
              (32, COMPUTE_FP32)]
    cases = _cases(np.random.default_rng(0), groups, SHAPES)
    results, bad = _check(d, str(SPEC), cases)
    assert not bad, bad[:5]
    ime2 = [r.vmadots for (c, _), r in zip(cases, results) if c.compute == COMPUTE_INT8 and c.case.qw.block_size > 16]
    assert all(ime2), ime2


def test_imegen_check_runs_the_k3_dispatch_at_vlen_1024(capsys):
    """`imegen check` on the example: every group at VLEN 1024 (IME2 emulated), and supported() refusing 128-512."""
    from imegen.cli import main

    assert main(["check", str(SPEC)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(("q4b", "ort121_ime2"))]
    assert {r[0] for r in rows if r[1] == "mlas:ime2"} == {f"q4b{b}_gemv+q4b{b}_gemm" for b in (32, 64, 128, 256)}
    assert all(r[3] == "1024" and r[-1] == "PASS" and int(r[-2]) > 0 for r in rows if r[1] == "mlas:ime2")
    assert sorted(r[3] for r in rows if r[0] == "ort121_ime2_supported()") == ["128", "256", "512"]
    assert all(r[-1] == "PASS" for r in rows)


def test_a_broken_staging_of_a_is_caught():
    """The check can fail: a gemm kernel that stages MLAS's A rows in natural k order while its B is interleaved
    (the planar kernel's A layout) must not pass."""
    d = plan_dispatch([plan_kernel(s) for s in specs_from_text(GROUP, "k3.imegen")], "k3.imegen")
    planar = plan_kernel(specs_from_text(GROUP.replace("interleaved", "planar"), "k3.imegen")[1])
    g = d.groups[0]
    broken = dataclasses.replace(g.gemm, a_index=planar.a_index)
    assert broken.a_index != g.gemm.a_index
    d2 = dataclasses.replace(d, groups=(dataclasses.replace(g, gemm=broken),),
                             kernels=tuple(broken if k is g.gemm else k for k in d.kernels))
    _, bad = _check(d2, "k3.imegen", _cases(np.random.default_rng(1), [(32, COMPUTE_INT8)], [(11, 40, 93)]))
    assert bad


# The routing tests start a process on host CPU 1 and name only hart 0.
needs_two_cpus = pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs host CPUs 0 and 1")


def _run_on_hart_1(exe, args):
    """The driver started on host CPU 1 with only hart 0 named: the IME2 emulator kills a vmadot anywhere else."""
    import subprocess

    env = {**os.environ, "IMEGEN_IME_HARTS": "0"}
    cmd = ["taskset", "-c", "1", *toolchain.launch(str(exe), vlen=VLEN), *args]
    r = subprocess.run(cmd, env=env, capture_output=True)
    if r.returncode:
        raise toolchain.ToolchainError("program failed", cmd, r.returncode, r.stdout.decode(), r.stderr.decode())


@needs_two_cpus
def test_each_call_moves_to_the_named_harts(monkeypatch):
    """A thread on a hart without IME2 (here hart 1, which IMEGEN_IME_HARTS does not name) is moved to hart 0 for
    each kernel call; a kernel that skips the move dies by the emulator's SIGILL there (on a K3: wrong numbers)."""
    d = plan_dispatch([plan_kernel(s) for s in specs_from_text(GROUP, "k3.imegen")], "k3.imegen")
    cases = _cases(np.random.default_rng(2), [(32, COMPUTE_INT8)], [(1, 40, 93), (11, 40, 93)])
    results = mlas_check.run(mlas_check.build(d, "k3.imegen"), [c for c, _ in cases], runner=_run_on_hart_1)
    assert all(mlas_check.check(d, c, r, exact=exact).ok and r.vmadots for (c, exact), r in zip(cases, results))

    sources = mlas_check.sources

    def unrouted(d, spec_file):
        files = sources(d, spec_file)
        out = {n: re.sub(r"const int entered = (\w+_enter_harts)\(&saved\);", r"const int entered = 0; (void)\1;", body)
               for n, body in files.items()}
        assert out != files
        return out

    monkeypatch.setattr(mlas_check, "sources", unrouted)
    with pytest.raises(toolchain.ToolchainError) as died:
        mlas_check.run(mlas_check.build(d, "k3.imegen"), [c for c, _ in cases], runner=_run_on_hart_1)
    assert "on hart 1, which IMEGEN_IME_HARTS does not name" in died.value.stderr, died.value.stderr


# --- ORT 1.21's own MLAS unit tests (tests/test_ort_tree.py does the K1's) ----------------------------------------

needs_apt = pytest.mark.skipif(shutil.which("apt-cache") is None, reason="needs apt (Debian) for the ORT source")

# The K1's CI filter costs ~10x under the IME2 emulator: here the M = 11 shapes (the gemm kernel, rows past its
# tile of 8) and the M = 1 shapes (the gemv kernel) with zero points and bias, every block size and both compute
# types.
FILTER = ("SQNBitGemm*.SingleThread/isSymmetric0/M11xN*/hasBias1/*:SQNBitGemm*.SingleThread/isSymmetric0/M1xN*/hasBias1/*"
          ":BlockQ4.*")


@pytest.fixture(scope="module")
def mlas_test_exe():
    from imegen.ort import ort_tree

    return ort_tree.build_mlas_test("1.21", SPEC)


@needs_apt
def test_orts_mlas_unit_tests_pass_with_the_ime2_dispatch(mlas_test_exe):
    from imegen.ort import ort_tree

    r = ort_tree.run_mlas_test(mlas_test_exe, FILTER, vlen=VLEN)
    print(r.summary())
    assert r.failed == 0 and r.passed >= 200, r.summary()
    for blk in (16, 32, 64, 128, 256):  # MLAS admitted every block size with both compute types
        for compute in ("Fp32", "Int8"):
            assert f"BlkLen{blk}.SingleThread/isSymmetric0/M11xN527xK2131/hasBias1/computeType{compute} (" in r.output
            assert f"BlkLen{blk}.SingleThread/isSymmetric0/M1xN527xK2131/hasBias1/computeType{compute} (" in r.output
    for entry in ("QuantizeARow_CompInt8", "SQ4BitGemmKernel_CompInt8", "SQ4BitGemmPackQuantBData"):
        assert r.calls[entry] > 0, r.calls
    assert r.vmadot > 0, r.summary()

    base = ort_tree.run_mlas_test(mlas_test_exe, FILTER, vlen=VLEN, disable_imegen=True)
    assert base.failed == 0 and base.passed > 0 and "[ RUN      ] SQNBitGemm" not in base.output  # 1.21: no RISC-V QNBitGemm
    assert sum(base.calls.values()) == 0 and base.vmadot == 0


ONE_INT8 = "SQNBitGemmBlkBitWidth4BlkLen32.SingleThread/isSymmetric0/M11xN527xK2131/hasBias1/computeTypeInt8"


@needs_apt
@needs_two_cpus
def test_the_dispatch_keeps_vmadots_on_the_named_harts(mlas_test_exe):
    """Started on host CPU 1 with IMEGEN_IME_HARTS=0: the emulator kills a vmadot on any hart but 0 (as an X100 would
    compute garbage), so the test passing with vmadots proves each call was moved to hart 0."""
    from imegen.ort import ort_tree

    r = ort_tree.run_mlas_test(mlas_test_exe, ONE_INT8, vlen=VLEN, env={"IMEGEN_IME_HARTS": "0"}, cpus="1")
    assert r.failed == 0 and r.passed == 1 and r.vmadot > 0, r.summary()
    assert r.calls["SQ4BitGemmKernel_CompInt8"] > 0


@needs_apt
def test_no_ime2_hart_keeps_mlas_on_its_own_paths(mlas_test_exe):
    """IMEGEN_IME_HARTS=none (no IME2 hart, as on a machine whose cpuinfo shows no A100): MLAS installs no imegen
    dispatch, so 1.21 registers no QNBitGemm test and no vmadot runs."""
    from imegen.ort import ort_tree

    r = ort_tree.run_mlas_test(mlas_test_exe, f"{ONE_INT8}:BlockQ4.*", vlen=VLEN, env={"IMEGEN_IME_HARTS": "none"})
    assert r.failed == 0 and r.passed > 0 and "[ RUN      ] SQNBitGemm" not in r.output, r.summary()
    assert sum(r.calls.values()) == 0 and r.vmadot == 0


@needs_apt
def test_ort_mlas_test_runs_at_the_k3s_vlen_and_fails_where_the_dispatch_never_ran(mlas_test_exe, capsys):
    """`imegen ort-mlas-test` on the K3 spec defaults to VLEN 1024; at VLEN 256 (a hart said to have IME2 at the
    wrong VLEN) MLAS installs nothing, and the command fails instead of passing on MLAS's own kernels."""
    from imegen.cli import main
    from imegen.ort import ort_tree

    assert ort_tree.emulator_vlen(SPEC) == VLEN and ort_tree.emulator_vlen(ROOT / "examples/ort/ort121_ime.imegen") == 256
    assert main(["ort-mlas-test", str(SPEC), "--vlen", "256"]) == 1
    assert "imegen's dispatch was never called" in capsys.readouterr().err
