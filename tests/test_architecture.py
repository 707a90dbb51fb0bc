"""The package's layering, checked from the source: no import cycles between imegen's modules, code
generation (the core) never reaches the ONNX Runtime tooling or the performance tooling, and no code
outside imegen/targets/ branches on a target's name (each target is a package the pipeline asks).

The import graph comes from ast-parsing every module, imports inside functions included: a lazy import
still makes the importer depend on the imported module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from imegen import targets

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "imegen"
TEMPLATES = ROOT / "templates"
# Code generation: the DSL front end, the pipeline stages, the targets and the ABIs it emits.
CORE = ("imegen.parse", "imegen.ir", "imegen.spec", "imegen.plan", "imegen.render", "imegen.toolchain",
        "imegen.verify", "imegen.check", "imegen.cache", "imegen.names", "imegen.errors", "imegen.paths",
        "imegen.reference", "imegen.targets", "imegen.abi")
TOOLING = ("imegen.ort", "imegen.perf")
# Where a target's name may be compared: the target packages themselves.
TARGET_HOME = PACKAGE / "targets"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names (relative levels resolved against the importer)."""
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The imegen modules `name` imports anywhere in its source. `from P import x` depends on P.x when
    that is a module, else on P. The root package is left out: importing it (for __version__) does not
    run the public API's lazy imports, which only its module __getattr__ makes."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, path.name == "__init__.py", node)
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in out if m in known and m != "imegen" and m != name}


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path back to its start) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, c) for c in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A path start -> ... -> start inside the component (breadth-first, so a shortest one)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    raise AssertionError(f"no cycle through {start}")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Module -> an import chain from start to it."""
    chains = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w not in chains:
                chains[w] = chains[v] + [w]
                queue.append(w)
    return chains


# `target == "ime"`, `"ime" != spec.target`, `s.target in ("rvv", "ime")`, `"rvv" in {p.spec.target ...}`
def target_comparison(names: tuple[str, ...] = targets.NAMES) -> re.Pattern:
    name = "[\"'](?:" + "|".join(map(re.escape, names)) + ")[\"']"
    return re.compile(rf"target\s*(?:==|!=)\s*{name}|{name}\s*(?:==|!=)\s*[\w.\[\]]*target\b"
                      rf"|target\s+(?:not\s+)?in\s*[(\[{{][^)\]}}]*{name}|{name}\s+(?:not\s+)?in\s+[^\n]*target")


def target_comparisons(paths: list[Path]) -> list[str]:
    pattern = target_comparison()
    return [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in paths
            for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]


# --- the checks ---------------------------------------------------------------------------------


def _sources(prefixes: tuple[str, ...]) -> list[Path]:
    return [p for name, p in modules().items() if _within(name, prefixes)]


@pytest.mark.parametrize("part", ["core", "ort", "perf", "rest"])
def test_no_import_cycles(part):
    """Cycles are reported where their first module lives, so each part of the package fails on its own."""
    found = [c for c in cycles(import_graph()) if _part(c[0]) == part]
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def _part(module: str) -> str:
    if _within(module, CORE):
        return "core"
    for tool in TOOLING:
        if _within(module, (tool,)):
            return tool.split(".")[1]
    return "rest"


def test_core_never_reaches_the_ort_or_perf_tooling():
    graph = import_graph()
    bad = []
    for name in sorted(graph):
        if _within(name, CORE):
            bad += [" -> ".join(chain) for m, chain in reachable(graph, name).items() if _within(m, TOOLING)]
    assert not bad, "core modules import imegen.ort / imegen.perf:\n" + "\n".join(sorted(set(bad)))


@pytest.mark.parametrize("part", ["core", "ort", "rest", "templates"])
def test_no_target_name_comparisons_outside_the_targets(part):
    if part == "templates":
        paths = sorted(TEMPLATES.rglob("*.j2"))
    else:
        paths = [p for name, p in modules().items() if _part(name) == part]
    paths = [p for p in paths if TARGET_HOME not in p.parents]
    found = target_comparisons(paths)
    assert not found, "target names compared outside imegen/targets/ (ask targets.get(name)):\n" + "\n".join(found)


def test_no_target_name_comparisons_in_perf():
    found = target_comparisons(_sources(("imegen.perf",)))
    assert not found, "target names compared outside imegen/targets/ (ask targets.get(name)):\n" + "\n".join(found)


# --- the checks can fail ------------------------------------------------------------------------


def test_the_checks_catch_what_they_are_for(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    lines = ['if spec.target == "ime":', "if 'rvv' != p.spec.target:", 'vector = s.target in ("rvv", "ime")',
             'if "ime" in {p.spec.target for p in d.kernels}:', '{% if s.target != "scalar" %}']
    assert all(target_comparison().search(line) for line in lines)
    assert not any(target_comparison().search(line) for line in
                   ['if opts.target != "k1":', "target = targets.get(name)", 'label = f"target={spec.target}"'])
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from .ort import customop\n    from .. import ir, targets\n")
    known = {"imegen.ort", "imegen.ort.customop", "imegen.ir", "imegen.targets", "imegen.x"}
    assert imports("imegen.x.m", src, known) == {"imegen.ir", "imegen.targets"}  # relative levels, lazy imports
    assert imports("imegen.m", src, known) == {"imegen.ort.customop"}
