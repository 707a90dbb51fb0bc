"""The code-generation targets, one package each (scalar, rvv, ime, ime2), and their registry.

The generic pipeline (ir, plan, render, verify, check) asks `get(spec.target)` for whatever depends on
the target and never compares target names; the DSL's `target` choices are NAMES.
"""

from __future__ import annotations

from ..spec import KernelSpec
from .base import Target
from .ime import TARGET as IME
from .ime2 import TARGET as IME2
from .rvv import TARGET as RVV
from .scalar import TARGET as SCALAR

ALL: tuple[Target, ...] = (IME, IME2, RVV, SCALAR)
NAMES = tuple(t.name for t in ALL)
_BY_NAME = {t.name: t for t in ALL}


def get(name: str) -> Target:
    """The target the DSL calls `name` (ir.py admits only NAMES)."""
    return _BY_NAME[name]


def of(spec: KernelSpec) -> Target:
    return _BY_NAME[spec.target]


def option_refusal(key: str, spec: KernelSpec) -> str | None:
    """Why spec cannot have its non-default value of setting `key`, which some target offers (see
    Target.options): the spec's own target judges if it offers the setting, else the one that does
    (whose answer then says which target it needs)."""
    offering = [t for t in ALL if key in t.options]
    judge = of(spec) if of(spec) in offering else offering[0]
    return judge.options[key](spec)
