"""Stage 1: spec text -> blocks of raw settings, each with its source position.

Only syntax is checked here; what the settings mean is decided in ir.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import lark

from .errors import Span, SpecError

GRAMMAR = Path(__file__).resolve().parent.parent / "grammar" / "imegen.lark"

# Human names for the grammar's terminals, used in "expected ..." messages.
_TERMINAL_NAMES = {
    "KEY": "a setting name",
    "NAME": "a name",
    "INT": "an integer",
    "TILE": "a tile such as 4x16",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "EQUAL": "'='",
    "SEMICOLON": "';'",
    "KERNEL": "'kernel'",
    "DEFAULTS": "'defaults'",
    "$END": "end of file",
}


@dataclass(frozen=True)
class Setting:
    key: str
    value: int | str | tuple[int, int]
    span: Span  # position of the key
    value_span: Span


@dataclass(frozen=True)
class Block:
    kind: str  # "defaults" | "kernel"
    name: str | None
    settings: tuple[Setting, ...]
    span: Span


@lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    return lark.Lark(GRAMMAR.read_text(), parser="lalr", propagate_positions=True)


def _describe(expected: set[str]) -> str:
    names = sorted({_TERMINAL_NAMES.get(t, t) for t in expected})
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def parse_text(text: str, filename: str = "<spec>") -> list[Block]:
    try:
        tree = _parser().parse(text)
    except lark.UnexpectedToken as e:
        got = "end of file" if e.token.type == "$END" else repr(str(e.token))
        raise SpecError(Span(filename, e.line, e.column), f"expected {_describe(e.expected)}, got {got}") from None
    except lark.UnexpectedCharacters as e:
        expected = f"; expected {_describe(e.allowed)}" if e.allowed else ""
        raise SpecError(Span(filename, e.line, e.column), f"unexpected character {text[e.pos_in_stream]!r}{expected}") from None
    except lark.UnexpectedEOF as e:
        lines = text.splitlines() or [""]
        raise SpecError(Span(filename, len(lines), len(lines[-1]) + 1), f"unexpected end of file; expected {_describe(set(e.expected))}") from None
    return [_block(node, filename) for node in tree.children]


def parse_file(path: str | Path) -> list[Block]:
    path = Path(path)
    return parse_text(path.read_text(), str(path))


def _span(filename: str, tok) -> Span:
    return Span(filename, tok.line, tok.column)


def _block(node: lark.Tree, filename: str) -> Block:
    children = list(node.children)
    name = str(children.pop(0)) if node.data == "kernel" else None
    settings = tuple(_setting(s, filename) for s in children)
    return Block(str(node.data), name, settings, Span(filename, node.meta.line, node.meta.column))


def _setting(node: lark.Tree, filename: str) -> Setting:
    key, value_node = node.children
    tok = value_node.children[0]
    if value_node.data == "tile":
        m, n = str(tok).split("x")
        value: int | str | tuple[int, int] = (int(m), int(n))
    elif value_node.data == "int":
        value = int(tok)
    else:
        value = str(tok)
    return Setting(str(key), value, _span(filename, key), _span(filename, tok))
