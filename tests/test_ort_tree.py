"""imegen in a real ONNX Runtime tree (Debian's onnxruntime 1.21.0 source, fetched by .ci/install):
the committed patch is what the generator makes from the pristine tree and applies there; the
patched cmake adds imegen only on riscv64; ORT's own MLAS unit tests pass under QEMU with imegen's
dispatch (its kernels verifiably ran) and without it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imegen.ort import ort_tree

ROOT = Path(__file__).resolve().parent.parent
PIN = "1.21"

pytestmark = pytest.mark.skipif(shutil.which("apt-cache") is None, reason="needs apt (Debian) for the ORT source")


@pytest.fixture(scope="module")
def pristine():
    return ort_tree.pristine_tree(PIN)


def test_committed_patch_is_regenerated_from_the_pristine_tree_and_applies(pristine):
    patch = ort_tree.make_patch(pristine, PIN)
    assert ort_tree.committed_patch_path(PIN).read_text() == patch, "run `imegen ort-patch --mlas-pin 1.21`"
    ort_tree.git_apply(pristine, patch, check=True)
    r = subprocess.run(["patch", "-p1", "--dry-run"], cwd=pristine, input=patch, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert patch.count("\n+++ b/") == 4


def test_a_missing_anchor_is_a_clear_error(tmp_path, pristine):
    for hunk in ort_tree.HUNKS:
        (tmp_path / hunk.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pristine / hunk.path, tmp_path / hunk.path)
    qnb = tmp_path / "onnxruntime/core/mlas/lib/qnbitgemm.cpp"
    qnb.write_text(qnb.read_text().replace("    switch (Variant) {", "    switch (Variant)  {"))
    with pytest.raises(ort_tree.OrtTreeError, match="qnbitgemm.cpp: cannot place"):
        ort_tree.make_patch(tmp_path, PIN)


def _configure(build: Path, spec: Path, toolchain: bool) -> None:
    cmd = ["cmake", "-S", str(ort_tree.BUILD_DIR), "-B", str(build), f"-DORT_ROOT={ort_tree.patched_tree(PIN)}",
           f"-DGTEST_SOURCE_DIR={ort_tree.GTEST_SOURCE}", f"-Donnxruntime_MLAS_IMEGEN_SPEC={spec}",
           f"-DIMEGEN_PYTHON={sys.executable}"]
    if toolchain:
        cmd.append(f"-DCMAKE_TOOLCHAIN_FILE={ort_tree.BUILD_DIR / 'riscv64-clang.cmake'}")
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def test_patched_cmake_adds_imegen_on_riscv64_and_nothing_on_x86_64(tmp_path):
    spec = ROOT / "examples" / "ort" / "ort121_ime.imegen"
    _configure(tmp_path / "rv", spec, toolchain=True)
    mlas = tmp_path / "rv" / "CMakeFiles" / "onnxruntime_mlas.dir"
    assert "-DMLAS_USE_IMEGEN_QNBIT" in (mlas / "flags.make").read_text()
    build_make = (mlas / "build.make").read_text()
    assert "imegen_generated/ort121_ime_mlas_dispatch.cpp" in build_make
    assert "imegen_generated/q4b256_gemm.c" in build_make and "imegen generate" in build_make

    _configure(tmp_path / "x86", spec, toolchain=False)  # the host: x86-64
    mlas = tmp_path / "x86" / "CMakeFiles" / "onnxruntime_mlas.dir"
    assert "IMEGEN" not in (mlas / "flags.make").read_text()
    assert "imegen_generated" not in (mlas / "build.make").read_text() and not (tmp_path / "x86" / "imegen_generated").exists()
    assert "sqnbitgemm_kernel_avx2.cpp" in (mlas / "build.make").read_text()  # MLAS's own x86 kernels


@pytest.mark.parametrize("target", ["ime", "rvv"])
def test_orts_mlas_unit_tests_pass_with_imegens_dispatch(target):
    exe = ort_tree.build_mlas_test(PIN, ROOT / "examples" / "ort" / f"ort121_{target}.imegen")
    r = ort_tree.run_mlas_test(exe, ort_tree.CI_FILTER)
    print(f"{target}: {r.summary()}")
    assert r.failed == 0 and r.passed >= 3400, r.summary()
    # MLAS admitted and ran every block size with both compute types it routes in 1.21.
    for blk in (16, 32, 64, 128, 256):
        for compute in ("Fp32", "Int8"):
            assert f"BlkLen{blk}.SingleThread/isSymmetric1/M11xN527xK2131/hasBias1/computeType{compute} (" in r.output
    for entry in ("SQ4BitGemmM1Kernel_CompFp32", "SQ4BitBlkDequantBForSgemm_CompFp32", "QuantizeARow_CompInt8",
                  "SQ4BitGemmKernel_CompInt8", "SQ4BitGemmPackQuantBData"):
        assert r.calls[entry] > 0, r.calls
    assert (r.vmadot > 0) == (target == "ime"), r.vmadot

    base = ort_tree.run_mlas_test(exe, ort_tree.CI_FILTER, disable_imegen=True)
    print(f"{target} baseline: {base.summary()}")
    # MLAS 1.21 has no RISC-V QNBitGemm dispatch: without imegen it registers no SQNBitGemm test.
    assert base.failed == 0 and base.passed > 0 and "[ RUN      ] SQNBitGemm" not in base.output
    assert sum(base.calls.values()) == 0 and base.vmadot == 0


@pytest.mark.parametrize("vlen", [128, 512])
def test_orts_mlas_keeps_its_own_paths_on_a_hart_without_the_k1s_vlen(vlen):
    """The IME dispatch built into ORT's MLAS, on a riscv64 hart whose VLEN is not the K1's: its supported()
    says no, so MLAS installs no imegen dispatch (1.21 then has none for RISC-V: no SQNBitGemm test is
    registered), no imegen entry is called and no vmadot runs (no IME emulator is installed there, so one
    would be SIGILL), and ORT's other tests in the filter pass."""
    exe = ort_tree.build_mlas_test(PIN, ROOT / "examples" / "ort" / "ort121_ime.imegen")
    r = ort_tree.run_mlas_test(exe, ort_tree.CI_FILTER, vlen=vlen)
    print(f"VLEN {vlen}: {r.summary()}")
    assert r.failed == 0 and r.passed > 0, r.summary()
    assert "[ RUN      ] SQNBitGemm" not in r.output and "[ RUN      ] BlockQ4" in r.output
    assert r.calls and sum(r.calls.values()) == 0, r.calls
    assert r.vmadot == 0 and "(not installed: VLEN != 256)" in r.output


def test_mlas_admits_only_what_imegen_serves(tmp_path):
    """With kernels for block 32 only, MlasIsQNBitGemmAvailable (patched) admits just that block, so
    ORT's test registers only BlkLen32 and nothing can reach an imegen entry without a kernel."""
    spec = tmp_path / "ort121_b32.imegen"
    spec.write_text("defaults { abi = mlas  bits = 4  block = 32  unpack = planar  panel = 16 }\n"
                    "kernel m1 { compute = fp32  op = gemv  target = rvv  vlen = 128  tile = 1x16 }\n"
                    "kernel dq { compute = fp32  op = gemm  target = rvv  vlen = 128 }\n")
    exe = ort_tree.build_mlas_test(PIN, spec)
    r = ort_tree.run_mlas_test(exe, "SQNBitGemm*.SingleThread/isSymmetric0/M1xN*xK1*:SQNBitGemm*.SingleThread/isSymmetric1/M11*")
    assert r.failed == 0 and r.passed > 0
    assert "BlkLen32." in r.output and "computeTypeFp32" in r.output
    assert not any(f"BlkLen{b}." in r.output for b in (16, 64, 128, 256)) and "computeTypeInt8" not in r.output
