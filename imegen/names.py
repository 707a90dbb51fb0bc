"""The names `imegen generate` gives its outputs: files, include guards and C symbol prefixes.

render.py writes these names and ir.py refuses specs in which two outputs would share one (on a
case-insensitive file system too), so no generated file ever overwrites another, and kernel names
that would replace or shadow a file next to them (reserved_names)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
# The output folder goes on the include path (-I), which `#include <...>` searches too: a kernel
# named like a C11 header, or one imegen's own files include, would shadow it.
SYSTEM_HEADERS = frozenset("""assert complex ctype errno fenv float inttypes iso646 limits locale math setjmp signal
    stdalign stdarg stdatomic stdbool stddef stdint stdio stdlib stdnoreturn string tgmath threads time uchar wchar
    wctype riscv_vector ucontext unistd""".split())


@lru_cache(maxsize=1)
def reserved_names() -> dict[str, str]:
    """Lower-case kernel names refused -> what the kernel's files would replace or shadow: the files
    `imegen check`/`bench`/`ort-check` build next to a kernel's, the runtime's, system headers."""
    names = {"driver": "the test driver (driver.c)", "dispatch": "the dispatch object (dispatch.o)"}
    names.update({p.stem.lower(): f"imegen's runtime file {p.name}" for p in sorted(RUNTIME_DIR.glob("*.[ch]"))})
    names.update({h: f"a header that would shadow <{h}.h>" for h in SYSTEM_HEADERS})
    return names


def kernel_files(name: str) -> tuple[str, str]:
    """A kernel's header and source; its C symbols are NAME_*, its include guard IMEGEN_<NAME>_H."""
    return f"{name}.h", f"{name}.c"


def dispatch_prefix(spec_file: str) -> str:
    """C prefix of a spec's MLAS dispatch, from its file name: every character that cannot be in a C
    identifier becomes '_', and a name that would start with a digit or '_' (reserved) gets 'imegen_'
    in front, so `2layer.imegen` -> `imegen_2layer_`, `my-spec.imegen` -> `my_spec_`."""
    stem = re.sub(r"[^A-Za-z0-9_]", "_", Path(spec_file).stem)
    if not stem or not stem[0].isalpha():
        stem = "imegen_" + stem
    return stem + "_"


def dispatch_files(prefix: str) -> tuple[str, str, str]:
    """The dispatch's header, C routing and ORT's C++ glue."""
    return f"{prefix}dispatch.h", f"{prefix}dispatch.c", f"{prefix}mlas_dispatch.cpp"
