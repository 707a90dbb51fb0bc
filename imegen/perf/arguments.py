"""argparse types of the perf commands' arguments: each value checked once, the same way wherever the
argument appears, and refused with a message argparse prints as one line (`argument -j/--jobs: ...`)."""

from __future__ import annotations

import argparse

from .workload import BLOCKS


def _integer(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def _integers(text: str, low: int) -> tuple[int, ...]:
    """A comma-separated list of integers >= low, none repeated."""
    values = tuple(_integer(part.strip(), low) for part in text.split(","))
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{', '.join(map(str, repeated))} given more than once")
    return values


def jobs(text: str) -> int:
    """-j/--jobs: parallel builds and QEMU runs, at least 1."""
    return _integer(text, 1)


def blocks(text: str) -> tuple[int, ...]:
    """--blocks: comma-separated block sizes, each one the Qwen workload is benched at (workload.BLOCKS)."""
    values = _integers(text, 1)
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
    return _integer(parts[0], 1), _integer(parts[1], 1)


def m_values(text: str) -> tuple[int, ...]:
    """--m: comma-separated row counts M (1 = decode, more = a prefill of M tokens)."""
    return _integers(text, 1)
