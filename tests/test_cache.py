"""The per-user build cache (imegen/cache.py): every key covers every input of what it caches,
the directory is private and checked, concurrent builders and killed builds leave no debris."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from imegen import cache, toolchain, verify
from imegen.cli import main
from imegen.ir import specs_from_text
from imegen.abi import mlas_check
from imegen.abi.mlas import COMPUTE_INT8, plan_dispatch
from imegen.perf.count import measure, mlas_counts, plugin
from imegen.perf.cli import output_dir
from imegen.plan import plan_kernel

ROOT = Path(__file__).resolve().parents[1]
NEEDS_TOOLS = pytest.mark.skipif(bool(toolchain.missing_tools()), reason="RISC-V toolchain not installed")

IME = "kernel k { target = ime  op = gemm  compute = int8  tile = 4x8  k_unroll = 2  bits = 4  block = 32 }"
MLAS = """defaults { abi = mlas  bits = 4  block = 32  compute = int8 }
kernel m_i8 { target = ime  op = gemm  tile = 4x8  k_unroll = 2 }"""


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("IMEGEN_CACHE_DIR", str(d))
    return d


# ---------------------------------------------------------------------------------------------
# Keys


def test_key_covers_each_input_class(tmp_path, monkeypatch):
    f = tmp_path / "a.c"
    f.write_text("int x;")
    base = cache.key(files=[f], strings=["-O2"], tools=["cc"])
    assert cache.key(files=[f], strings=["-O2"], tools=["cc"]) == base
    f.write_text("int y;")
    assert cache.key(files=[f], strings=["-O2"], tools=["cc"]) != base
    f.write_text("int x;")
    g = tmp_path / "b.c"
    shutil.copy(f, g)
    assert cache.key(files=[g], strings=["-O2"], tools=["cc"]) != base  # the name is an input too
    assert cache.key(files=[f], strings=["-O3"], tools=["cc"]) != base
    assert cache.key(files=[f], strings=["-O2"], tools=["clang-19"]) != base
    monkeypatch.setattr(cache, "tool_identity", lambda t: f"{t}: version 99")
    assert cache.key(files=[f], strings=["-O2"], tools=["cc"]) != base
    assert cache.key(strings=["ab"]) != cache.key(strings=["a", "b"])  # no collisions by concatenation


def _plans():
    [ime] = specs_from_text(IME, "k.imegen")
    d = plan_dispatch([plan_kernel(s) for s in specs_from_text(MLAS, "m.imegen")], "m.imegen")
    return plan_kernel(ime), d


# Every cache that compiles: name -> its key, computed without building.
def _keys():
    ime, d = _plans()
    return {
        "verify.build": lambda: verify.build_inputs(ime, compiler="clang")[1].key(),
        "mlas_check.build": lambda: mlas_check.build_inputs(d, "m.imegen")[1].key(),
        "measure.build_bench": lambda: measure.bench_inputs(ime)[2].key(),
        "mlas_counts.build": lambda: mlas_counts.build_inputs(d, "m.imegen")[1].key(),
    }


def _edit_copy(tmp_path: Path, src: Path, monkeypatch, module, attr: str) -> None:
    """Point module.attr at a copy of src with one more comment line."""
    dst = tmp_path / ("copy-" + src.name)
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy(src, dst)
    monkeypatch.setattr(module, attr, dst)
    return dst


def _mutate_runtime(name):
    def mutate(tmp_path, monkeypatch):
        d = _edit_copy(tmp_path, toolchain.RUNTIME_DIR, monkeypatch, toolchain, "RUNTIME_DIR")
        (d / name).write_text((d / name).read_text() + "\n/* changed */\n")
    return mutate


def _mutate_sysroot(tmp_path, monkeypatch):
    root = tmp_path / "sysroot"
    (root / "lib").mkdir(parents=True)
    for lib in ("libc.a", "libm.a"):
        (root / "lib" / lib).write_text(lib)
    monkeypatch.setattr(toolchain, "SYSROOT", root)


def _mutate_driver(module):
    def mutate(tmp_path, monkeypatch):
        p = _edit_copy(tmp_path, module.DRIVER, monkeypatch, module, "DRIVER")
        p.write_text(p.read_text() + "\n/* changed */\n")
    return mutate


MUTATIONS = {
    "ime_emu.c": (_mutate_runtime("ime_emu.c"), None),
    "ime_emu.h": (_mutate_runtime("ime_emu.h"), None),
    "bench_markers.h": (_mutate_runtime("bench_markers.h"), None),
    "compiler flags": (lambda tmp, mp: mp.setattr(toolchain, "COMMON_FLAGS", toolchain.COMMON_FLAGS + ("-g",)), None),
    "compiler path": (lambda tmp, mp: mp.setattr(toolchain, "CLANG", "clang-20"), None),
    "compiler version": (lambda tmp, mp: mp.setattr(cache, "tool_identity", lambda t: f"{t}: version 99"), None),
    "sysroot libc": (_mutate_sysroot, None),
    "MLAS driver": (_mutate_driver(mlas_check), {"mlas_check.build", "mlas_counts.build"}),
    "bench driver": (_mutate_driver(measure), {"measure.build_bench"}),
}


@pytest.mark.parametrize("which, what", [(w, m) for w in sorted(_keys()) for m, (_, applies) in sorted(MUTATIONS.items())
                                         if applies is None or w in applies])
def test_every_build_key_covers_every_input(which, what, tmp_path, monkeypatch):
    mutate, _ = MUTATIONS[what]
    key = _keys()[which]
    before = key()
    assert key() == before
    mutate(tmp_path, monkeypatch)
    assert key() != before, f"{which}: changing the {what} keeps the cache key"


def test_build_keys_cover_spec_compiler_and_host():
    ime, _ = _plans()
    [scalar] = specs_from_text("kernel s { target = scalar  op = gemm  compute = fp32  tile = 2x4 }", "s.imegen")
    s = plan_kernel(scalar)
    keys = {verify.build_inputs(ime, compiler="clang")[1].key(), verify.build_inputs(ime, compiler="gcc")[1].key(),
            verify.build_inputs(s, compiler="clang")[1].key(), verify.build_inputs(s, host=True)[1].key(),
            verify.build_inputs(plan_kernel(specs_from_text(IME.replace("4x8", "8x8"), "k.imegen")[0]))[1].key()}
    assert len(keys) == 5
    assert measure.bench_inputs(ime, compiler="gcc")[2].key() != measure.bench_inputs(ime)[2].key()


def test_build_keys_ignore_the_templates_stamp_but_not_the_code(monkeypatch):
    """A template edit changes every generated file's stamp (render.templates_hash), not every
    kernel's code: keys follow the code, so a bench rerun recounts only the kernels that changed."""
    from imegen import render

    before = {name: key() for name, key in _keys().items()}
    env = render.env()
    monkeypatch.setitem(env.globals, "templates_hash", "0123456789abcdef")
    assert "(templates 0123456789abcdef)" in render.render_kernel(_plans()[0], "k.imegen")["k.h"]
    assert {name: key() for name, key in _keys().items()} == before
    # A change in the code itself still changes the bench and test-driver keys.
    monkeypatch.setattr(render, "_render", lambda t, plan, spec_file: f"/* {t} */ int changed;\n")
    assert measure.bench_inputs(_plans()[0])[2].key() != before["measure.build_bench"]
    assert verify.build_inputs(_plans()[0], compiler="clang")[1].key() != before["verify.build"]


def test_plugin_and_count_keys_cover_their_inputs(tmp_path, monkeypatch):
    header = tmp_path / "qemu-plugin.h"
    header.write_text("/* one */")
    before = plugin.plugin_inputs(header).key()
    header.write_text("/* two */")
    assert plugin.plugin_inputs(header).key() != before
    source = _edit_copy(tmp_path, plugin.SOURCE, monkeypatch, plugin, "SOURCE")
    after_header = plugin.plugin_inputs(header).key()
    source.write_text(source.read_text() + "\n/* changed */\n")
    assert plugin.plugin_inputs(header).key() != after_header
    monkeypatch.setattr(plugin, "FLAGS", plugin.FLAGS + ("-g",))
    assert len({before, after_header, plugin.plugin_inputs(header).key()}) == 3
    # Counts: plugin .so, QEMU, VLEN and beat size.
    monkeypatch.setattr(plugin, "ensure_plugin", lambda: Path("insn_count-1.so"))
    base = measure.counts_inputs().key()
    for attr, value in (("VLEN", 512), ("BEAT_BYTES", 32)):
        with monkeypatch.context() as m:
            m.setattr(measure, attr, value)
            assert measure.counts_inputs().key() != base, attr
    with monkeypatch.context() as m:
        m.setattr(plugin, "ensure_plugin", lambda: Path("insn_count-2.so"))
        assert measure.counts_inputs().key() != base
    with monkeypatch.context() as m:
        m.setattr(cache, "tool_identity", lambda t: f"{t}: qemu 9")
        assert measure.counts_inputs().key() != base


def test_no_cache_computes_its_own_key():
    """One key helper: no module but cache.py hashes, none builds outside cache.entry."""
    for p in (ROOT / "imegen").rglob("*.py"):
        if p.name != "cache.py":
            text = p.read_text()
            assert "hashlib" not in text and "gettempdir" not in text, p


@NEEDS_TOOLS
def test_a_broken_emulator_fails_a_warm_mlas_check(tmp_path, monkeypatch, private_cache):
    """The issue's reproduction: warm cache, then an emulator that computes wrong tiles."""
    _, d = _plans()
    rng = np.random.default_rng(1)
    case = mlas_check.random_case(rng, 5, 20, 96, 32, symmetric=False, bias=False, compute=COMPUTE_INT8)
    [res] = mlas_check.run(mlas_check.build(d, "m.imegen"), [case])
    assert mlas_check.check(d, case, res).ok  # warm, and correct
    broken = _edit_copy(tmp_path, toolchain.RUNTIME_DIR, monkeypatch, toolchain, "RUNTIME_DIR") / "ime_emu.c"
    text = broken.read_text()
    assert "acc +=" in text
    broken.write_text(text.replace("acc +=", "acc -=", 1))
    [res] = mlas_check.run(mlas_check.build(d, "m.imegen"), [case])
    assert not mlas_check.check(d, case, res).ok


# ---------------------------------------------------------------------------------------------
# The directory


def test_cache_dir_is_private_and_per_user(tmp_path, monkeypatch):
    monkeypatch.setenv("IMEGEN_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "h0"))
    assert cache.root() == tmp_path / "h0" / ".cache" / "imegen"
    monkeypatch.delenv("IMEGEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.root() == tmp_path / "xdg" / "imegen"
    assert (tmp_path / "xdg" / "imegen").stat().st_mode & 0o777 == 0o700
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.root() == tmp_path / "home" / ".cache" / "imegen"
    monkeypatch.setenv("IMEGEN_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.root() == tmp_path / "mine"
    (tmp_path / "mine").chmod(0o755)  # ours, only readable by others: tightened
    cache.root()
    assert (tmp_path / "mine").stat().st_mode & 0o777 == 0o700


def test_cache_dir_writable_by_others_is_refused(private_cache):
    private_cache.mkdir(mode=0o700)
    for mode in (0o770, 0o707, 0o777):
        private_cache.chmod(mode)
        with pytest.raises(cache.CacheError, match="writable by group or others"):
            cache.root()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory to another user")
def test_cache_dir_of_another_user_is_refused(private_cache):
    private_cache.mkdir(mode=0o700)
    os.chown(private_cache, 65534, 65534)
    with pytest.raises(cache.CacheError, match="belongs to uid 65534"):
        cache.root()


def test_unusable_cache_is_a_clear_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("IMEGEN_CACHE_DIR", str(tmp_path / "file" / "cache"))
    spec = tmp_path / "s.imegen"
    spec.write_text("kernel s { target = scalar  op = gemm  compute = fp32  tile = 2x4 }\n")
    assert main(["check", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "cannot create the build cache" in err and "IMEGEN_CACHE_DIR" in err and "Traceback" not in err


@NEEDS_TOOLS
def test_plugin_blames_an_unwritable_cache_not_deb_src(tmp_path, monkeypatch, capsys):
    """`bench --quick` with a read-only HOME: no fetch is tried, the cache is named as the cause."""
    (tmp_path / "file").write_text("")
    monkeypatch.delenv("IMEGEN_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("IMEGEN_QEMU_PLUGIN_H", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "file"))  # nothing can be created under it
    monkeypatch.setattr(plugin.subprocess, "run", lambda *a, **k: pytest.fail(f"tried to run {a[0]}"))
    with pytest.raises(cache.CacheError, match="cannot create the build cache") as e:
        plugin.ensure_plugin()
    assert "deb-src" not in str(e.value)
    assert main(["bench", "--quick", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "build cache" in err and "deb-src" not in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# Publishing, killed builders


def test_concurrent_builders_publish_one_complete_entry(private_cache):
    calls, barrier = [], threading.Barrier(4)

    def fill(d: Path) -> None:
        calls.append(d)
        barrier.wait()
        (d / "a").write_text("a")
        (d / "b").write_text("b")

    out = []
    threads = [threading.Thread(target=lambda: out.append(cache.entry("x", "k", fill))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 4 and len(set(out)) == 1
    assert sorted(p.name for p in out[0].iterdir()) == ["a", "b"]
    assert [p.name for p in private_cache.iterdir()] == ["x-k"]  # no temporaries left


def test_stale_temporaries_are_swept(private_cache):
    private_cache.mkdir(mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    entry = private_cache / "bench-k-0123"
    entry.mkdir()
    host = cache._HOST
    stale = [private_cache / f"x-k.tmp-{host}-{dead.pid}-ab12", entry / f"counts-1.json.tmp-{host}-{dead.pid}-cd34"]
    old = private_cache / f"y-k.tmp-{host}-{os.getpid()}-ef56"  # a live pid, but two hours old
    fresh = private_cache / f"z-k.tmp-{host}-{os.getppid()}-0a0b"  # a live builder: kept
    elsewhere = private_cache / f"w-k.tmp-otherhost-{dead.pid}-1234"  # another host's pid: only age counts
    for p in (stale[0], old, fresh, elsewhere):
        p.mkdir()
    stale[1].write_text("{}")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    cache.sweep(private_cache)
    assert not any(p.exists() for p in (*stale, old))
    assert fresh.exists() and elsewhere.exists() and entry.exists()


SLOW_BUILD = textwrap.dedent("""
    import time
    from imegen import cache
    def fill(d):
        (d / "half").write_text("x")
        print("ready", flush=True)
        time.sleep(60)
    cache.entry("slow", "k", fill)
""")


def _sigterm_deliverable():
    """As a service manager starts a process: SIGTERM at its default, not blocked (a CI runner may hand it down blocked)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def test_sigterm_removes_unfinished_entries_and_terminates(private_cache):
    proc = subprocess.Popen([sys.executable, "-c", SLOW_BUILD], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "IMEGEN_CACHE_DIR": str(private_cache)},
                            preexec_fn=_sigterm_deliverable)
    assert proc.stdout.readline() == "ready\n"
    assert any(".tmp-" in p.name for p in private_cache.iterdir())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM  # killed by it, as without the handler (shell status 143)
    assert "Traceback" not in err and "terminated" in err
    assert list(private_cache.iterdir()) == []


def test_sigkilled_builds_are_swept_by_the_next_run(private_cache, monkeypatch):
    proc = subprocess.Popen([sys.executable, "-c", SLOW_BUILD], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "IMEGEN_CACHE_DIR": str(private_cache)})
    assert proc.stdout.readline() == "ready\n"
    proc.kill()
    proc.wait()
    assert any(".tmp-" in p.name for p in private_cache.iterdir())  # SIGKILL cannot clean up
    monkeypatch.setattr(cache, "_swept", set())  # a new run
    cache.root()
    assert list(private_cache.iterdir()) == []


def test_quick_bench_never_writes_the_committed_results():
    from argparse import Namespace
    assert output_dir(Namespace(quick=True, output=None)) == Path("bench/results-quick")
    assert output_dir(Namespace(quick=False, output=None)) == Path("bench/results")
    assert output_dir(Namespace(quick=True, output="x")) == Path("x")
