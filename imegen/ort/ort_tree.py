"""A real ONNX Runtime source tree: fetch it, patch it for imegen, build its MLAS for riscv64, run
ORT's own MLAS unit tests under QEMU.

The tree is Debian's onnxruntime source package (only the upstream .orig.tar.xz is used), fetched
through apt from a trixie deb-src entry (.ci/install adds it) and verified against the SHA-256 in
apt's Sources index. Everything lands under $XDG_CACHE_HOME/imegen/ort (default ~/.cache): the
tarball, the pristine extract, one patched tree per patch, and one build per input hash.

The patch (`imegen ort-patch`) is rendered from templates/ort_patch/ and inserted at anchors found in
the pristine files, then written as a unified diff, so it is regenerated rather than maintained.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, cache, toolchain
from ..render import env

ROOT = Path(__file__).resolve().parent.parent.parent  # the directory holding imegen/ and templates/
BUILD_DIR = Path(__file__).resolve().parent / "mlas_build"
GTEST_SOURCE = Path("/usr/src/googletest")  # Debian's googletest package
MEMBERS = ("cmake/", "onnxruntime/core/mlas/", "onnxruntime/test/mlas/")  # what the MLAS build and tests read


class OrtTreeError(Exception):
    """A user-facing failure: no deb-src entry, checksum mismatch, an anchor missing, a build error."""


@dataclass(frozen=True)
class OrtSource:
    pin: str  # abi.mlas.PINS key
    package: str
    version: str  # Debian source version
    orig: str  # upstream tarball file name
    topdir: str


SOURCES = {"1.21": OrtSource("1.21", "onnxruntime", "1.21.0+dfsg-1", "onnxruntime_1.21.0+dfsg.orig.tar.xz",
                             "onnxruntime-1.21.0")}


def log(msg: str) -> None:
    print(f"ort-tree: {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    return cache.root() / "ort"


def source_for(pin: str) -> OrtSource:
    if pin not in SOURCES:
        raise OrtTreeError(f"no ORT source tree is known for --mlas-pin {pin}; trees: {', '.join(SOURCES)}")
    return SOURCES[pin]


# --- fetching ---------------------------------------------------------------------------------

def _showsrc(src: OrtSource) -> str:
    """apt's Sources stanza for exactly src.version."""
    out = subprocess.run(["apt-cache", "showsrc", src.package], capture_output=True, text=True).stdout
    for stanza in out.split("\n\n"):
        if re.search(rf"^Version: {re.escape(src.version)}$", stanza, re.M):
            return stanza
    raise OrtTreeError(f"apt knows no source package {src.package} {src.version}: add a deb-src entry for trixie "
                       f"(bash .ci/install does) and run apt-get update")


def index_sha256(src: OrtSource) -> str:
    stanza = _showsrc(src)
    m = re.search(r"^Checksums-Sha256:\n((?: .*\n?)+)", stanza, re.M)
    for line in (m.group(1).splitlines() if m else []):
        sha, _size, name = line.split()
        if name == src.orig:
            return sha
    raise OrtTreeError(f"apt's Sources index lists no SHA-256 for {src.orig}")


def _sha256(path: Path) -> str:
    return cache.file_digest(path).hex()


def fetch(pin: str) -> Path:
    """The verified upstream tarball for pin (downloaded once)."""
    src = source_for(pin)
    want = index_sha256(src)
    dest = cache_dir() / src.orig
    if dest.exists() and _sha256(dest) == want:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    log(f"fetching {src.package} {src.version} source ({src.orig}) with apt-get source --download-only")
    # The .dsc and .debian.tar.xz may be gone from the mirror (404); only the orig tarball matters.
    subprocess.run(["apt-get", "source", "--download-only", f"{src.package}={src.version}"], cwd=dest.parent,
                   capture_output=True, text=True)
    if not dest.exists():  # apt-get source gave up early: fetch the one file with apt's helper
        stanza = _showsrc(src)
        directory = re.search(r"^Directory: (\S+)", stanza, re.M).group(1)  # type: ignore[union-attr]
        url = f"{_deb_src_mirror()}/{directory}/{src.orig}"
        r = subprocess.run(["/usr/lib/apt/apt-helper", "download-file", url, str(dest), f"SHA256:{want}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise OrtTreeError(f"could not download {url}: {r.stderr.strip()}")
    got = _sha256(dest)
    if got != want:
        dest.unlink()
        raise OrtTreeError(f"{src.orig}: SHA-256 {got} does not match apt's Sources index ({want})")
    return dest


def _deb_src_mirror() -> str:
    out = subprocess.run(["apt-get", "indextargets", "--format", "$(REPO_URI)", "Created-By: Sources"],
                         capture_output=True, text=True).stdout.split()
    return (out[0] if out else "http://deb.debian.org/debian/").rstrip("/")


def pristine_tree(pin: str) -> Path:
    """The unpatched tree (the parts MLAS's build and tests read), extracted once per tarball hash."""
    src = source_for(pin)
    tarball = fetch(pin)
    sha = _sha256(tarball)
    tree = cache_dir() / f"{src.topdir}-{sha[:12]}"
    if (tree / ".imegen-extracted").exists():
        return tree
    log(f"extracting {src.orig}")
    tmp = tree.with_name(tree.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(tarball) as tf:
        members = [m for m in tf.getmembers()
                   if any(m.name.startswith(f"{src.topdir}/{p}") for p in MEMBERS)]
        tf.extractall(tmp, members=members, filter="data")
    shutil.rmtree(tree, ignore_errors=True)
    (tmp / src.topdir).rename(tree)
    shutil.rmtree(tmp)
    (tree / ".imegen-extracted").write_text(sha + "\n")
    return tree


# --- the patch --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hunk:
    path: str  # in the ORT tree
    template: str  # templates/ort_patch/<template>
    within: str  # the hunk goes into the first occurrence of `anchor` after this text
    anchor: str
    before: bool = False  # insert ahead of the anchor (else after it)


HUNKS = (
    Hunk("cmake/onnxruntime_mlas.cmake", "onnxruntime_mlas.cmake.j2", "if(NOT ONNXRUNTIME_MLAS_MULTI_ARCH AND MLAS_SOURCE_IS_NOT_SET)",
         "    target_sources(onnxruntime_mlas PRIVATE ${mlas_platform_srcs})\nendif()\n"),
    Hunk("onnxruntime/core/mlas/lib/mlasi.h", "mlasi.h.j2", "struct MLAS_QNBIT_GEMM_DISPATCH;",
         "extern const MLAS_QNBIT_GEMM_DISPATCH MlasSQNBitGemmDispatchAvx512vnni;\n"),
    Hunk("onnxruntime/core/mlas/lib/platform.cpp", "platform.cpp.j2", "MLAS_PLATFORM::MLAS_PLATFORM(",
         "#endif // MLAS_TARGET_LARCH64\n"),
    Hunk("onnxruntime/core/mlas/lib/qnbitgemm.cpp", "qnbitgemm.cpp.j2", "MlasIsQNBitGemmAvailable(",
         "    switch (Variant) {\n", before=True),
)


# Not part of the patch: ORT 1.21's MLAS does not compile with BUILD_MLAS_NO_ONNXRUNTIME (its stand-in
# MLFloat16 lacks members compute.cpp uses), so the MLAS-alone build's copy of the tree gets them.
STANDALONE_HUNKS = (
    Hunk("onnxruntime/core/mlas/lib/mlasi.h", "standalone_mlfloat16.j2", "struct MLFloat16 {",
         "    float ToFloat() const { return MLAS_Half2Float(val); }\n"),
)


def _apply_hunk(text: str, hunk: Hunk, insert: str) -> str:
    start = text.find(hunk.within)
    at = text.find(hunk.anchor, start) if start >= 0 else -1
    if at < 0:
        raise OrtTreeError(f"{hunk.path}: cannot place imegen's hunk: no {hunk.anchor.strip()!r} after "
                           f"{hunk.within!r} (a different ORT version?)")
    at = at if hunk.before else at + len(hunk.anchor)
    return text[:at] + insert + text[at:]


def make_patch(tree: Path, pin: str, hunks: tuple[Hunk, ...] = HUNKS) -> str:
    """The unified diff (-p1) that hooks imegen into the ORT tree at `tree`."""
    header = (f"imegen {__version__}: ONNX Runtime {pin} MLAS QNBitGemm with imegen's generated kernels on riscv64.\n"
              f"Generated by `imegen ort-patch --mlas-pin {pin}` from the pristine tree; apply with `git apply` or `patch -p1`\n"
              f"in the onnxruntime checkout, then configure with -Donnxruntime_MLAS_IMEGEN_SPEC=/abs/spec.imegen\n"
              f"(and IMEGEN_PYTHON=/python/with/imegen if it is not the default python3).\n\n")
    out = [header]
    for hunk in hunks:
        old = (tree / hunk.path).read_text()
        new = _apply_hunk(old, hunk, env().get_template(f"ort_patch/{hunk.template}").render(pin=pin))
        out += difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                    f"a/{hunk.path}", f"b/{hunk.path}")
    return "".join(out)


def committed_patch_path(pin: str) -> Path:
    return ROOT / "examples" / "ort" / f"onnxruntime-{source_for(pin).topdir.split('-', 1)[1]}-imegen.patch"


def patched_tree(pin: str) -> Path:
    """A copy of the pristine tree with the patch applied by `git apply` (cached per patch hash)."""
    tree = pristine_tree(pin)
    patch = make_patch(tree, pin)
    fix = make_patch(tree, pin, STANDALONE_HUNKS)
    key = cache.key(strings=(tree.name, patch, fix))
    dest = cache_dir() / "patched" / key
    if (dest / ".imegen-patched").exists():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(tree, dest, symlinks=True)
    git_apply(dest, patch)
    git_apply(dest, fix)
    (dest / ".imegen-patched").write_text(patch + fix)
    return dest


def git_apply(tree: Path, patch: str, check: bool = False) -> None:
    cmd = ["git", "apply", "--check"] if check else ["git", "apply"]
    r = subprocess.run(cmd + ["-"], cwd=tree, input=patch, capture_output=True, text=True)
    if r.returncode != 0:
        raise OrtTreeError(f"git apply{' --check' if check else ''} failed in {tree}: {r.stderr.strip()}")


# --- building MLAS and its tests ---------------------------------------------------------------

def _generator_files() -> list[Path]:
    build_dir = [p for p in BUILD_DIR.rglob("*") if p.is_file()]  # emu_init.c and the shim headers too
    return sorted({*ROOT.glob("imegen/**/*.py"), *ROOT.glob("imegen/**/*.cmake"), *ROOT.glob("imegen/**/CMakeLists.txt"),
                   *build_dir, *ROOT.glob("imegen/runtime/*"), *ROOT.glob("templates/**/*.j2"),
                   *ROOT.glob("grammar/*.lark")})


def _emulation_defines(spec: Path) -> dict[str, str]:
    """The emulation build's CMake defines for the spec's IME target (the K1's IME when it has none): its emulator,
    installed at its VLEN (emu_init.c), and for a target whose kernels keep their calls on its harts
    (Target.mlas_hart_routing) the emulation rule the kernels follow: every hart has the unit, unless
    IMEGEN_IME_HARTS names some (which the emulator then enforces)."""
    from .. import targets
    from ..ir import load_specs

    runtime = ROOT / "imegen" / "runtime"
    ime = next((targets.of(s) for s in load_specs(str(spec)) if s.abi == "mlas" and targets.of(s).needs_ime), None)
    if ime is None or ime.emulator == "ime_emu":
        return {"IMEGEN_TEST_EXTRA_SOURCES": f"{runtime / 'ime_emu.c'};{BUILD_DIR / 'emu_init.c'}"}
    defines = {"IMEGEN_TEST_EXTRA_SOURCES": f"{runtime / (ime.emulator + '.c')};{BUILD_DIR / 'emu_init.c'}",
               "IMEGEN_TEST_DEFINES": f"IMEGEN_EMULATOR={ime.emulator};IMEGEN_EMULATOR_VLEN={ime.only_vlen}"}
    if ime.mlas_hart_routing:
        defines["IMEGEN_MLAS_DEFINES"] = "IMEGEN_IME_EMULATION"
    return defines


def emulator_vlen(spec: Path) -> int:
    """The VLEN ORT's MLAS tests run at for the spec: its IME target's (IME2: 1024), else the K1's 256."""
    from .. import targets
    from ..ir import load_specs

    vlens = [targets.of(s).only_vlen for s in load_specs(str(spec)) if s.abi == "mlas" and targets.of(s).only_vlen]
    return vlens[0] if vlens else 256


def build_mlas_test(pin: str, spec: Path | None, *, emulate: bool = True) -> Path:
    """onnxruntime_mlas_test for riscv64 from the patched tree; spec None builds MLAS without imegen.

    Cached by its inputs: tree (tarball hash), patch, spec text, imegen's sources, compiler, flags."""
    tree = patched_tree(pin)
    toolchain = BUILD_DIR / "riscv64-clang.cmake"
    defines = {"ORT_ROOT": str(tree), "GTEST_SOURCE_DIR": str(GTEST_SOURCE), "CMAKE_BUILD_TYPE": "Release",
               "CMAKE_TOOLCHAIN_FILE": str(toolchain), "IMEGEN_PYTHON": sys.executable}
    if spec is not None:
        defines["onnxruntime_MLAS_IMEGEN_SPEC"] = str(spec.resolve())
        if emulate:  # the IME trap-and-emulate runtime, and call counters in the glue
            defines.update(_emulation_defines(spec))
            defines["CMAKE_CXX_FLAGS"] = "-DIMEGEN_COUNT_CALLS"
    key = cache.key(files=_generator_files(), tools=("clang-19", "cmake"),
                    strings=((tree / ".imegen-patched").read_text(), tree.name, spec.read_text() if spec else "",
                             repr(sorted(defines.items() - {("ORT_ROOT", str(tree))}))))
    build = cache_dir() / "build" / f"{spec.stem if spec else 'baseline'}-{key}"
    exe = build / "onnxruntime_mlas_test"
    if exe.exists():
        return exe
    shutil.rmtree(build, ignore_errors=True)
    log(f"configuring MLAS ({pin}, {spec.name if spec else 'no imegen'}) in {build}")
    _run(["cmake", "-S", str(BUILD_DIR), "-B", str(build), *(f"-D{k}={v}" for k, v in defines.items())], "configure")
    log("building onnxruntime_mlas and onnxruntime_mlas_test (clang-19, riscv64; a few minutes on 2 cores)")
    _run(["nice", "cmake", "--build", str(build), "--target", "onnxruntime_mlas_test", "-j", str(os.cpu_count() or 2)],
         "build")
    return exe


def _run(cmd: list[str], what: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise OrtTreeError(f"MLAS {what} failed ({' '.join(cmd[:3])} ...):\n{(r.stdout + r.stderr)[-4000:]}")
    return r.stdout


# --- running ORT's tests ----------------------------------------------------------------------

@dataclass(frozen=True)
class GtestResult:
    passed: int
    failed: int
    skipped: int
    registered: int  # tests ORT's main registered programmatically (QNBitGemm ones only if available)
    vmadot: int  # IME instructions emulated (0 for RVV kernels)
    calls: dict[str, int]  # imegen dispatch calls per member ({} when imegen is off)
    output: str

    def summary(self) -> str:
        calls = sum(self.calls.values())
        return (f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped "
                f"({self.registered} registered programmatically); imegen dispatch calls {calls}, emulated vmadot {self.vmadot}")


# CI: of the single-thread half of the SQNBitGemm grid (this build has no thread pool, so the "Threaded"
# half runs the same code), every shape with zero points and the M = 11 shapes without them, plus the
# blockwise quantizer tests; --full runs everything.
CI_FILTER = "SQNBitGemm*.SingleThread/isSymmetric0/*:SQNBitGemm*.SingleThread/isSymmetric1/M11*:BlockQ4.*"


def run_mlas_test(exe: Path, gtest_filter: str | None, *, vlen: int = 256, disable_imegen: bool = False,
                  timeout: float = 3600, env: dict[str, str] | None = None, cpus: str | None = None) -> GtestResult:
    """Run ORT's MLAS tests under QEMU; `env` adds to the environment (e.g. IMEGEN_IME_HARTS), `cpus` starts the
    process on those host CPUs (taskset -c): where its threads start, when a test is about which harts run what."""
    env = {**os.environ, **(env or {})}
    if disable_imegen:
        env["IMEGEN_MLAS_DISABLE"] = "1"
    cmd = ["qemu-riscv64", "-L", "/usr/riscv64-linux-gnu", "-cpu", toolchain.qemu_cpu(vlen), str(exe)]
    if cpus is not None:
        cmd = ["taskset", "-c", cpus, *cmd]
    if gtest_filter:
        cmd.append(f"--gtest_filter={gtest_filter}")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    out = r.stdout + r.stderr

    def count(pattern: str) -> int:
        m = re.search(pattern, out, re.M)
        return int(m.group(1)) if m else 0

    calls = {}
    m = re.search(r"imegen dispatch \S+ calls:(.*)$", out, re.M)
    if m:
        calls = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    result = GtestResult(count(r"^\[  PASSED  \] (\d+) test"), count(r"^\[  FAILED  \] (\d+) test"),
                         count(r"^\[  SKIPPED \] (\d+) test"), count(r"----Total (\d+) tests registered"),
                         count(r"^imegen IME emulator: (\d+) vmadot"), calls, out)
    if r.returncode != 0 and result.failed == 0:
        raise OrtTreeError(f"onnxruntime_mlas_test exited with status {r.returncode}:\n{out[-3000:]}")
    return result
