"""A regular (non-editable) install works away from the checkout: build the sdist, build the wheel
from the sdist, install it into a fresh venv, then generate and check the bundled example from a
folder outside the repository. Catches data files (grammar/, templates/, runtime C) that the
package does not ship, and run-time code that reaches into the checkout (e.g. tests/)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

import jinja2
import lark
import markupsafe
import numpy
import pytest

from imegen import toolchain

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["pyproject.toml", "README.md", "imegen", "grammar", "templates"]
EXAMPLE = ROOT / "examples" / "qwen_mlp.imegen"


def run(*argv, cwd: Path, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, argv))} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def _venv_with_dependencies(where: Path) -> Path:
    """A venv without the system site-packages (whose editable imegen would shadow the wheel's),
    seeing the already-installed dependencies through a plain path .pth (which does not run the
    editable finder's .pth)."""
    venv.create(where, with_pip=False)
    python = where / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = sorted({str(Path(m.__file__).resolve().parents[1]) for m in (jinja2, lark, markupsafe, numpy)})
    (Path(purelib) / "imegen_test_deps.pth").write_text("\n".join(deps) + "\n")
    return python


@pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")
def test_wheel_from_sdist_installs_and_runs_outside_the_checkout(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(
            ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if (ROOT / name).is_dir() else {}))
    dist = tmp_path / "dist"
    run(sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(dist)!r})", cwd=src)
    (sdist,) = dist.glob("imegen-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = t.getnames()
    for needed in ("grammar/imegen.lark", "templates/kernel.c.j2", "imegen/runtime/mlas_driver.c"):
        assert any(n.endswith(needed) for n in names), f"sdist lacks {needed}"

    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, sdist, cwd=tmp_path)
    (wheel,) = dist.glob("imegen-*.whl")
    python = _venv_with_dependencies(tmp_path / "venv")
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp_path)

    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(EXAMPLE, work / EXAMPLE.name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    where = run(python, "-c", "import imegen; print(imegen.__file__)", cwd=work, env=env).stdout.strip()
    assert where.startswith(str(tmp_path / "venv")), where
    imegen = tmp_path / "venv" / "bin" / "imegen"
    run(imegen, "generate", EXAMPLE.name, "-o", "out", cwd=work, env=env)
    assert sorted(p.name for p in (work / "out").glob("*.[ch]")) == sorted(
        f"{k}.{e}" for k in ("q4_prefill_ime", "q4_decode_ime", "q4_prefill_rvv", "q4_decode_scalar") for e in "ch")
    snippet = run(imegen, "cmake-snippet", EXAMPLE.name, cwd=work, env=env).stdout
    (module,) = re.findall(r'include\("([^"]+)"\)', snippet)
    assert Path(module).is_file() and module.startswith(str(tmp_path / "venv")), snippet
    assert (Path(module).parent.parent / "templates" / "kernel.c.j2").is_file()  # where imegen.cmake looks first
    r = run(imegen, "check", EXAMPLE.name, cwd=work, env=env)  # exit 0: every build passed
    assert re.search(r"\n(\d+) of \1 builds passed", r.stdout) and "FAIL" not in r.stdout, r.stdout


def test_every_package_is_listed_for_the_wheel():
    """pyproject.toml lists imegen's packages by hand: a package missing there is missing from every wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "imegen").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
