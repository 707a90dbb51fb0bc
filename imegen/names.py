"""The names `imegen generate` gives its outputs: files, include guards and C symbol prefixes.

render.py writes these names and ir.py refuses specs in which two outputs would share one (on a
case-insensitive file system too), so no generated file ever overwrites another."""

from __future__ import annotations

import re
from pathlib import Path


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
