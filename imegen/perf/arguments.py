"""argparse types of the perf commands' arguments: each value checked once, the same way wherever the
argument appears, and refused with a message argparse prints as one line (`argument -j/--jobs: ...`).
The types every command shares (-j/--jobs, integers) are imegen/cli_types.py's."""

from __future__ import annotations

import argparse

from ..cli_types import integer, integers_at_least
from .workload import BLOCKS

_positive_list = integers_at_least(1)


def blocks(text: str) -> tuple[int, ...]:
    """--blocks: comma-separated block sizes, each one the Qwen workload is benched at (workload.BLOCKS)."""
    values = _positive_list(text)
    bad = [b for b in values if b not in BLOCKS]
    if bad:
        raise argparse.ArgumentTypeError(f"blocks must be among {', '.join(map(str, BLOCKS))}, "
                                         f"got {', '.join(map(str, bad))}")
    return values


def shape(text: str) -> tuple[int, int]:
    """--shape NxK: a weight of N output columns and K inputs (C[M, N] = A[M, K] x B[K, N])."""
    parts = text.lower().split("x")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected NxK (e.g. 896x4864), got {text!r}")
    return integer(parts[0], 1), integer(parts[1], 1)


def m_values(text: str) -> tuple[int, ...]:
    """--m: comma-separated row counts M (1 = decode, more = a prefill of M tokens)."""
    return _positive_list(text)
