"""The per-user build cache: where it lives, who may write it, how entries are keyed and published.

Everything imegen caches (kernel test drivers, MLAS drivers, bench executables and their counts,
the QEMU counting plugin) lives in one directory per user: $IMEGEN_CACHE_DIR if set, else
$XDG_CACHE_HOME/imegen, else ~/.cache/imegen. The cache holds programs that imegen runs (drivers
under QEMU, a plugin QEMU loads), so whoever can write there can make imegen run their code: the
directory is created mode 0700 and refused if another user owns it or group/others may write it.

Keys: `key()` hashes an explicit list of inputs (file contents, strings such as rendered sources
and compiler flags, and the identity of each tool: its path and `--version`), so each cache states
everything its entries depend on in one call.

Publishing: `entry()` builds in a temporary directory inside the cache, named after the builder's
pid, and publishes it with one rename: concurrent builders of one key never see half-written
files. A builder killed by SIGTERM removes its temporary directories, then dies of the signal; one
killed by SIGKILL leaves them behind, and the next run removes those whose pid is dead or that
are older than STALE_SECONDS (another host's only by age).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

STALE_SECONDS = 3600
_TMP = re.compile(r"\.tmp-(\w*)-(\d+)-[0-9a-f]+$")  # <final name>.tmp-<host>-<pid>-<random>
_HOST = re.sub(r"\W", "", socket.gethostname())  # a home shared over NFS: only our own pids can be checked
# The stamp generated files carry (render.templates_hash) names every template, so it changes with
# any template edit; what a file compiles to depends on its code only, so keys leave the stamp out.
_STAMP = re.compile(r" \(templates [0-9a-f]+\)")
_live: set[Path] = set()  # temporaries of this process (removed on SIGTERM)
_lock = threading.Lock()
_swept: set[Path] = set()


class CacheError(OSError):
    """The cache directory cannot be used (not creatable, not writable, not safely ours)."""


HINT = "set IMEGEN_CACHE_DIR (or XDG_CACHE_HOME) to a directory of your own"


def root() -> Path:
    """The cache directory, created if needed and checked (see the module docstring)."""
    env = os.environ.get("IMEGEN_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"  # the XDG spec ignores relative paths
    path = Path(env).expanduser().absolute() if env else base / "imegen"
    try:
        path.mkdir(parents=True, mode=0o700, exist_ok=True)
        st = path.stat()
    except OSError as e:
        raise CacheError(f"cannot create the build cache {path}: {e.strerror or e} ({HINT})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"the build cache {path} is not a directory ({HINT})")
    if st.st_uid != os.getuid():
        raise CacheError(f"the build cache {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): "
                         f"refusing to run programs another user could have written ({HINT})")
    if st.st_mode & 0o022:
        raise CacheError(f"the build cache {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
                         f"refusing to run programs another user could have written (chmod 700 it, or {HINT})")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours and not writable by others: only tighten it
    try:  # a read-only file system passes every check above
        probe = tmp_name(path / ".probe")
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise CacheError(f"the build cache {path} is not writable: {e.strerror or e} ({HINT})") from None
    _install_sigterm_cleanup()
    if path not in _swept:
        _swept.add(path)
        sweep(path)
    return path


def tmp_name(final: Path) -> Path:
    """A private temporary next to `final` (same directory, so a rename publishes it)."""
    return final.with_name(f"{final.name}.tmp-{_HOST}-{os.getpid()}-{secrets.token_hex(4)}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(path: Path, *, now: float | None = None) -> list[Path]:
    """Remove temporaries left by dead or long-gone builders, in `path` and one level below."""
    now = time.time() if now is None else now
    removed = []
    candidates = list(path.iterdir())
    candidates += [p for d in candidates if d.is_dir() and not _TMP.search(d.name) for p in d.iterdir()]
    for p in candidates:
        m = _TMP.search(p.name)
        if not m or p in _live:
            continue
        try:
            old = now - p.lstat().st_mtime > STALE_SECONDS
        except FileNotFoundError:
            continue
        if old or (m.group(1) == _HOST and not _pid_alive(int(m.group(2)))):
            _remove(p)
            removed.append(p)
    return removed


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def track(tmp: Path) -> None:
    with _lock:
        _live.add(tmp)


def untrack(tmp: Path) -> None:
    with _lock:
        _live.discard(tmp)
    _remove(tmp)


def _on_sigterm(signum, frame) -> None:
    with _lock:
        live = list(_live)
        _live.clear()
    for p in live:
        _remove(p)
    print("imegen: terminated (SIGTERM); removed unfinished cache entries", file=sys.stderr, flush=True)
    # Die of the signal, as without this handler: an exception could be caught (a test runner
    # records SystemExit as a failure and carries on).
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_sigterm_cleanup() -> None:
    """SIGTERM -> remove this process's temporaries, then die of it (only if nobody else handles it).
    Signal handlers can only be set from the main thread: at import, and again from root()."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


_install_sigterm_cleanup()  # builds often start in worker threads (ort-check, tune)


def entry(name: str, key: str, fill: Callable[[Path], None]) -> Path:
    """The directory `<root>/<name>-<key>`, filled by `fill(tmp)` on first use and published by rename."""
    d = root() / f"{name}-{key}"
    if d.is_dir():
        return d
    tmp = tmp_name(d)
    track(tmp)
    try:
        tmp.mkdir(mode=0o700)
        fill(tmp)
        os.rename(tmp, d)
    except OSError:
        if not d.is_dir():  # not "another builder won the race"
            raise
    finally:
        untrack(tmp)
    return d


def write_file(path: Path, data: bytes) -> None:
    """Replace `path` atomically (readers see the old or the new content, never a part)."""
    tmp = tmp_name(path)
    track(tmp)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        untrack(tmp)


@functools.lru_cache(maxsize=None)
def tool_identity(tool: str) -> str:
    """Where `tool` resolves on PATH and what its `--version` prints (first line)."""
    path = shutil.which(tool)
    if path is None:
        return f"{tool}: not found"
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        version = (proc.stdout or proc.stderr).strip().splitlines()[:1]
    except (OSError, subprocess.TimeoutExpired) as e:
        version = [f"--version failed: {e}"]
    return f"{os.path.realpath(path)}: {' '.join(version)}"


@functools.lru_cache(maxsize=256)
def _digest(path: str, stamp: tuple[int, ...]) -> bytes:
    return hashlib.sha256(Path(path).read_bytes()).digest()


def file_digest(path: Path) -> bytes:
    """sha256 of the content, memoised while inode, size, mtime and ctime stay the same."""
    st = Path(path).stat()
    return _digest(str(path), (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))


@dataclass(frozen=True)
class Inputs:
    """Everything a cache entry depends on: files (by name and content), strings (rendered sources,
    flags, parameters) and tools (by `tool_identity`). `a + b` joins two lists."""

    files: tuple[Path, ...] = ()
    strings: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()

    def __add__(self, other: Inputs) -> Inputs:
        return Inputs(self.files + other.files, self.strings + other.strings, self.tools + other.tools)

    def key(self) -> str:
        """16 hex digits; parts are tagged and length-prefixed, so different lists never collide
        by concatenation. Strings are taken without generated files' templates stamp (_STAMP)."""
        h = hashlib.sha256()

        def part(kind: bytes, data: bytes) -> None:
            h.update(kind + len(data).to_bytes(8, "little") + data)

        for f in self.files:
            part(b"f", Path(f).name.encode())
            part(b"c", file_digest(f))
        for s in self.strings:
            part(b"s", _STAMP.sub("", s).encode())
        for t in self.tools:
            part(b"t", tool_identity(t).encode())
        return h.hexdigest()[:16]


def sha256_hex(*chunks: bytes) -> str:
    """The SHA-256 of the chunks, concatenated, in hex: for digests of in-memory data that become parts of a key
    (key() itself digests files, strings and tools)."""
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()


def key(*, files: Iterable[Path] = (), strings: Iterable[str] = (), tools: Iterable[str] = ()) -> str:
    return Inputs(tuple(files), tuple(strings), tuple(tools)).key()
