"""The CMake hook for real: a riscv64 cross build (clang-19) of the MLAS-driver stand-in whose
kernels imegen generates at build time, run under QEMU against NumPy; edits regenerate."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from imegen.abi import mlas_check
from imegen.ir import load_specs
from imegen.abi.mlas import COMPUTE_FP32, COMPUTE_INT8, plan_dispatch
from imegen.plan import plan_kernel

ROOT = Path(__file__).resolve().parent.parent
HOOK = ROOT / "tests" / "cmake_hook"


def _configure_and_build(src_spec: Path, build: Path) -> str:
    subprocess.run(["cmake", "-S", str(HOOK), "-B", str(build), f"-DCMAKE_TOOLCHAIN_FILE={HOOK / 'riscv64-clang.cmake'}",
                    f"-DIMEGEN_CMAKE_MODULE={ROOT / 'imegen' / 'cmake' / 'imegen.cmake'}", f"-DIMEGEN_SOURCE_DIR={ROOT}",
                    f"-DIMEGEN_SPEC={src_spec}", f"-DIMEGEN_DISPATCH_HEADER={src_spec.stem}_dispatch.h",
                    f"-DIMEGEN_PYTHON={sys.executable}"], check=True, capture_output=True, text=True)
    return _build(build)


def _build(build: Path) -> str:
    return subprocess.run(["cmake", "--build", str(build), "-j2"], check=True, capture_output=True, text=True).stdout


def test_hook_cross_builds_and_runs_under_qemu(tmp_path):
    spec = tmp_path / "ort_mlas.imegen"
    shutil.copy(ROOT / "examples" / "ort_mlas.imegen", spec)
    out = _configure_and_build(spec, tmp_path / "build")
    assert "imegen: generating kernels" in out
    generated = tmp_path / "build" / "imegen_generated"
    assert (generated / "ort_mlas_dispatch.c").exists() and (generated / "q4b32_int8_gemm.c").exists()

    d = plan_dispatch([plan_kernel(s) for s in load_specs(spec)], str(spec))
    rng = np.random.default_rng(5)
    cases = [mlas_check.random_case(rng, M, N, K, 32, symmetric=M % 2 == 0, bias=True, compute=c)
             for c in (COMPUTE_FP32, COMPUTE_INT8) for M, N, K in [(1, 40, 93), (6, 33, 64)]]
    cases += [mlas_check.random_case(rng, M, N, K, 32, symmetric=M % 2 == 0, bias=True, compute=COMPUTE_INT8, bits=8)
              for M, N, K in [(1, 40, 93), (6, 33, 64)]]
    results = mlas_check.run(tmp_path / "build" / "mlas_driver", cases)
    for case, res in zip(cases, results):
        verdict = mlas_check.check(d, case, res)
        assert verdict.ok, (case.case.shape, case.compute, verdict.message)

    # The generation step depends on every input of the generator, subpackages included.
    rules = "".join(p.read_text(errors="replace") for p in (tmp_path / "build").rglob("build.make"))
    for dep in ("imegen/abi/mlas.py", "imegen/render.py", "templates/kernel.c.j2", "grammar/imegen.lark"):
        assert str(ROOT / dep) in rules, dep

    # Nothing changed: no regeneration. A template-independent spec edit: regenerated.
    assert "imegen: generating" not in _build(tmp_path / "build")
    spec.write_text(spec.read_text().replace("k_unroll = 2 }", "k_unroll = 4 }"))
    assert "imegen: generating" in _build(tmp_path / "build")
    assert "k_unroll=4" in (generated / "q4b32_int8_gemm.c").read_text()
