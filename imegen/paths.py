"""Where imegen's data folders (grammar/, templates/) are: inside the package when installed from a
wheel or sdist (pyproject.toml maps them there), at the repository root in a checkout."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def shipped(name: str) -> Path:
    inside = PACKAGE / name
    return inside if inside.is_dir() else PACKAGE.parent / name
