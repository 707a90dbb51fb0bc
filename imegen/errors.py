"""Errors that point at a place in a spec file."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class SpecError(Exception):
    """A spec that does not parse, or that the target hardware cannot run."""

    def __init__(self, span: Span | None, message: str):
        self.span = span
        self.message = message
        super().__init__(f"{span}: error: {message}" if span else f"error: {message}")
