"""llama.cpp's SpacemiT IME1 sources: the llama-cpp-python sdist from PyPI (`pip download --no-deps
--no-binary :all:`), checked against SDIST_SHA256 and cached under ~/.cache/imegen (nothing of it enters
the repository); from `vendor/llama.cpp/ggml/` the ggml headers and `src/ggml-cpu/spacemit/`.
ime1_kernels.cpp is transformed at build time (translate): vendor `vmadot vd, vs1, vs2` mnemonics become
`.word` encodings (signed x signed), and `vsetvli` lines without a policy get an explicit `tu, mu`
(clang-19 requires it)."""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

from .... import cache
from ....targets.ime.encoding import encode_vmadot
from ....toolchain import ToolchainError

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
GGML = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/ggml"
SPACEMIT = "src/ggml-cpu/spacemit"


class LlamaUnavailable(RuntimeError):
    pass


def sdist(log=None) -> Path:
    """The cached sdist, downloaded with pip on first use and checked against SDIST_SHA256."""
    d = cache.root() / "sdist"
    path = d / SDIST
    if not path.exists():
        d.mkdir(parents=True, exist_ok=True)
        if log:
            log(f"llama.cpp: pip download llama-cpp-python=={VERSION} (sdist, 76 MB)")
        cmd = ["python3", "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={VERSION}", "-d", str(d)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not path.exists():
            raise LlamaUnavailable(f"pip download of llama-cpp-python {VERSION} failed:\n{proc.stderr.strip()}")
    digest = cache.file_digest(path).hex()
    if digest != SDIST_SHA256:
        raise LlamaUnavailable(f"{path}: sha256 {digest}, expected {SDIST_SHA256} (delete it to re-download)")
    return path


def sources(log=None) -> Path:
    """The ggml headers and spacemit sources extracted from the sdist (cached by version + hash)."""
    root = cache.root() / f"llama-cpp-python-{VERSION}-{SDIST_SHA256[:16]}"
    if not (root / "done").exists():
        tar_path = sdist(log)
        root.mkdir(parents=True, exist_ok=True)
        want = re.compile(re.escape(GGML) + r"/(include/[^/]+\.h|src/[^/]+\.h|src/ggml-cpu/[^/]+\.h|"
                          + re.escape(SPACEMIT) + r"/[^/]+)$")
        with tarfile.open(tar_path) as tar:
            tar.extractall(root, members=[m for m in tar if m.isfile() and want.match(m.name)], filter="data")
        (root / "done").write_text("")
    return root / GGML


def translate(text: str) -> tuple[str, int, int]:
    """vmadot mnemonics -> .word, policy-less vsetvli -> `, tu, mu`; returns (text, #vmadot, #vsetvli)."""
    def word(m: re.Match) -> str:
        return f".word 0x{encode_vmadot(int(m[1]), int(m[2]), int(m[3]), signedness='ss'):08x}"

    text, n_vmadot = re.subn(r"\bvmadot\s+v(\d+),\s*v(\d+),\s*v(\d+)", word, text)
    if re.search(r"\bvmadot\w", text):
        raise ToolchainError("ime1_kernels.cpp uses a vmadot variant the translation does not handle", [])
    text, n_vset = re.subn(r"(vsetvli\s+[\w%\[\]]+,\s*[\w%\[\]]+,\s*e\d+,\s*m?f?\d+)(\s*\\n)", r"\1, tu, mu\2", text)
    return text, n_vmadot, n_vset
