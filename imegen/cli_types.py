"""argparse types shared by every imegen command. Each value is checked where it is parsed, the same way
wherever the argument appears, and refused with what would be valid: argparse prints the
ArgumentTypeError as one line (`imegen check: error: argument --seed: must be >= 0, got -1`), never
its own `invalid <type> value: 'x'`."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence


def add_command(sub, name: str, summary: str) -> argparse.ArgumentParser:
    """A subcommand whose one-line summary is both its line in `imegen --help` and the description
    `imegen NAME --help` opens with."""
    return sub.add_parser(name, help=summary, description=summary)


def add_renamed(parser: argparse.ArgumentParser, old: str, new: argparse.Action) -> None:
    """Accept `old`, the option's former spelling, for `new` without showing it in --help: scripts that
    still pass it keep working, the help and the docs name only the new one."""
    parser.add_argument(old, dest=new.dest, type=new.type, choices=new.choices, metavar=new.metavar,
                        default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def integer(text: str, low: int) -> int:
    """`text` as an integer >= low, or the reason it is not one."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def at_least(low: int) -> Callable[[str], int]:
    """An integer >= low (a number of layers, tokens, threads)."""
    def parse(text: str) -> int:
        return integer(text, low)
    parse.__name__ = f"integer >= {low}"
    return parse


def integers_at_least(low: int) -> Callable[[str], tuple[int, ...]]:
    """A comma-separated list of integers >= low, none repeated."""
    def parse(text: str) -> tuple[int, ...]:
        values = tuple(integer(part.strip(), low) for part in text.split(","))
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise argparse.ArgumentTypeError(f"{', '.join(map(str, repeated))} given more than once")
        return values
    parse.__name__ = f"integers >= {low}"
    return parse


def one_of(values: Sequence[int]) -> Callable[[str], int]:
    """One of a few integers (bits, a block size, a VLEN). Give the same values as choices= too, so the
    usage line shows them."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value not in values:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(map(str, values))}, got {text!r}")
        return value
    parse.__name__ = f"one of {values}"
    return parse


def jobs(text: str) -> int:
    """-j/--jobs: parallel builds and QEMU runs, at least 1."""
    return integer(text, 1)


def seed(text: str) -> int:
    """--seed: NumPy's random generator takes any integer >= 0."""
    return integer(text, 0)


def folder(text: str) -> str:
    """A non-empty folder name (an empty one would mean the current folder)."""
    if not text:
        raise argparse.ArgumentTypeError("is empty; name the folder to write into (e.g. -o generated)")
    return text


def name_value(text: str) -> tuple[str, int]:
    """NAME=VALUE: a symbolic input dimension and its size, an integer >= 1."""
    name, sep, value = text.partition("=")
    if not name or not sep or not value.strip().isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with VALUE an integer >= 1 (e.g. batch=2), got {text!r}")
    return name, int(value)


# The VLENs a spec's `vlen` takes (docs/dsl.md), which QEMU runs.
VLENS = (128, 256, 512, 1024)
vlen = one_of(VLENS)
vlen.__name__ = "vlen"
