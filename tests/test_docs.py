"""The project's own docs/ carry the facts the code relies on, with public sources; code cites
them (and nothing outside the repository)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from imegen.ort import ort_check
from imegen.perf.model import x60
from imegen.perf.workload import PUBLISHED, PUBLISHED_PP512_TPS

ROOT = Path(__file__).resolve().parents[1]
IME_DOC = (ROOT / "docs" / "ime-isa.md").read_text()
ORT_DOC = (ROOT / "docs" / "ort-matmulnbits.md").read_text()

# Sources outside the repository, or private ones, that code must not cite.
FORBIDDEN = re.compile(r"ime-isa-notes|ort-matmulnbits-notes|kernel-generator-anchors|\.\./shared|/work/shared|issue 4\b")
# Generated outputs (rewritten by their commands) and files another change owns.
NOT_CHECKED = {
    "bench/results",  # committed run of `imegen bench`; the next full run rewrites its legend
}


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines()
            if not any(p == x or p.startswith(x + "/") for x in NOT_CHECKED) and (ROOT / p).is_file()]


def _text(p: Path) -> str | None:
    try:
        return p.read_text()
    except UnicodeDecodeError:
        return None


def test_nothing_cites_sources_outside_the_repository():
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in _tracked() if p.name != Path(__file__).name
           for i, line in enumerate((_text(p) or "").splitlines(), 1) if FORBIDDEN.search(line)]
    assert not bad, "\n".join(bad)


def test_cited_doc_sections_exist():
    # docs/ itself cites upstream docs/ paths; elsewhere a path after "/" is another repository's.
    cites = [(p, m) for p in _tracked() if p.parent != ROOT / "docs"
             for m in re.finditer(r"(?<![\w/])docs/([\w.-]+\.md)(?: §([\d.]+))?", _text(p) or "")]
    assert cites
    for p, m in cites:
        doc = ROOT / "docs" / m.group(1)
        assert doc.is_file(), f"{p.relative_to(ROOT)} cites missing {doc.relative_to(ROOT)}"
        if m.group(2):
            assert re.search(rf"^#+ {re.escape(m.group(2))}\.? ", doc.read_text(), re.M), \
                f"{p.relative_to(ROOT)} cites {m.group(0)}, which has no such section"


def test_ime_doc_has_every_llvm_vector_the_encoding_test_uses():
    text = (ROOT / "tests" / "test_ime_encoding.py").read_text()
    vectors = text[text.index('LLVM_VECTORS = """') + 18:].split('"""')[0].strip().splitlines()
    assert len(vectors) == 16
    for line in vectors:
        asm, word = line.rsplit(None, 1)
        assert f"| `{' '.join(asm.split())}` | `{word}` |" in IME_DOC, line


def test_ime_doc_has_the_x60_figures_the_model_uses():
    p = x60.X60
    for fact in (f"{p.clock_hz / 1e9:.1f} GHz", f"VLEN {p.vlen}", f"DLEN {p.dlen}", f"IssueWidth {p.issue_width}",
                 f"`fdiv.s` {p.div_cycles} cycles", f"{p.l1_bytes // 1024} KB L1", f"{p.l2_bytes // 1024} KB L2",
                 f"{p.dram_theoretical / 1e9:.2f} GB/s", f"memcpy {p.dram_memcpy_1t / 1e9:.2f} GB/s",
                 f"{p.dram_effective / 1e9:.2f} GB/s", "511.5 GOPS", "2.046 TOPS", f"{p.ime_cores} (cores 0-3)",
                 "32.0"):
        assert fact in IME_DOC, fact
    assert f"{PUBLISHED_PP512_TPS}" in IME_DOC and all("10.03" in k for k in PUBLISHED) and "10.03" in IME_DOC


def test_ort_doc_has_the_shapes_seed_and_tolerances_ort_check_uses():
    for shape in ort_check.MATMUL_4BITS:
        assert "(" + ",".join(map(str, shape)) + ")" in ORT_DOC, shape
    assert f"RandomValueGenerator{{{ort_check.SEED}}}" in ORT_DOC
    for level, (abs_tol, rel_tol) in ort_check.TOLERANCE.items():
        for what, tol in (("abs", abs_tol), ("rel", rel_tol)):
            spellings = {f"{what} {tol:g}", f"{what} {tol:.0e}".replace("e-0", "e-")}
            assert any(x in ORT_DOC for x in spellings), (level, what, spellings)
    for shape in ("(43, 500, 401)", "1027, 1031", "527, 2131"):
        assert shape in ORT_DOC


@pytest.mark.parametrize("doc", ["ime-isa.md", "ort-matmulnbits.md"])
def test_docs_name_public_sources(doc):
    text = (ROOT / "docs" / doc).read_text()
    sources = text[text.index("## Sources"):]
    assert len(re.findall(r"https://", sources)) >= 3
    assert not FORBIDDEN.search(text)


def test_published_figures_cite_their_public_source():
    """The bench report and plot legend label published figures (workload.PUBLISHED) with their source."""
    from imegen.perf.workload import LLAMA_CPP_SOURCE
    assert PUBLISHED and all(LLAMA_CPP_SOURCE in label for label in PUBLISHED)
    assert "ggml-org/llama.cpp" in LLAMA_CPP_SOURCE and "build-riscv64-spacemit.md" in IME_DOC
