"""Stage 1: spec text -> blocks of raw settings, each with its source position.

Only syntax is checked here; what the settings mean is decided in ir.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import lark

from .errors import Span, SpecError
from .paths import shipped

GRAMMAR = shipped("grammar") / "imegen.lark"
# No setting takes a number anywhere near this long; longer literals are refused here, before int()
# (which refuses more than 4300 digits) and before ir.py's range checks.
MAX_DIGITS = 30

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
    "COMMA": "',' (another value)",
    "KERNEL": "'kernel'",
    "ATTENTION": "'attention'",
    "DEFAULTS": "'defaults'",
    "$END": "end of file",
}


class ValueList(tuple):
    """A setting's comma-separated values, e.g. `shapes = 1152x896, 896x896`."""


@dataclass(frozen=True)
class Setting:
    key: str
    value: int | str | tuple[int, int] | ValueList
    span: Span  # position of the key
    value_span: Span


@dataclass(frozen=True)
class Block:
    kind: str  # "defaults" | "kernel" | "attention"
    name: str | None
    settings: tuple[Setting, ...]
    span: Span


@lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    return lark.Lark(GRAMMAR.read_text(), parser="lalr", propagate_positions=True)


def _describe(expected: set[str]) -> str:
    names = sorted({_TERMINAL_NAMES.get(t, t) for t in expected})
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _end_of(text: str) -> tuple[int, int]:
    """Line and column just past the last character of the last line (where an open block ends);
    lines end at '\n' only, as Lark counts them."""
    body = text[:-1] if text.endswith("\n") else text
    return body.count("\n") + 1, len(body) - body.rfind("\n")


def parse_text(text: str, filename: str = "<spec>") -> list[Block]:
    try:
        tree = _parser().parse(text)
    except lark.UnexpectedToken as e:
        if e.token.type == "$END":  # an open block: report where the file ends, not at its last token
            raise SpecError(Span(filename, *_end_of(text)), f"unexpected end of file, expected {_describe(e.expected)}") from None
        raise SpecError(Span(filename, e.line, e.column), f"expected {_describe(e.expected)}, got {str(e.token)!r}") from None
    except lark.UnexpectedCharacters as e:
        expected = f"; expected {_describe(e.allowed)}" if e.allowed else ""
        word = re.match(r"[^\s{};=#]*", text[e.pos_in_stream:]).group(0)[:40]
        what = f"unexpected {word!r}" if len(word) > 1 else f"unexpected character {text[e.pos_in_stream]!r}"
        raise SpecError(Span(filename, e.line, e.column), what + expected) from None
    except lark.UnexpectedEOF as e:
        raise SpecError(Span(filename, *_end_of(text)), f"unexpected end of file, expected {_describe(set(e.expected))}") from None
    return [_block(node, filename) for node in tree.children]


def decode(data: bytes, filename: str) -> str:
    """Spec bytes -> text. Specs are UTF-8 (a leading byte-order mark is allowed); anything else is
    refused at the first byte that is not UTF-8."""
    body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data  # positions below are in body
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = e.start
    line_start = body.rfind(b"\n", 0, bad) + 1
    line = body.count(b"\n", 0, bad) + 1
    column = len(body[line_start:bad].decode("utf-8")) + 1
    hint = " (this looks like UTF-16: save the spec as UTF-8)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
    raise SpecError(Span(filename, line, column), f"byte 0x{body[bad]:02x} is not UTF-8 text; specs must be UTF-8{hint}")


def parse_file(path: str | Path) -> list[Block]:
    path = Path(path)
    return parse_text(decode(path.read_bytes(), str(path)), str(path))


def _span(filename: str, tok) -> Span:
    return Span(filename, tok.line, tok.column)


def _block(node: lark.Tree, filename: str) -> Block:
    children = list(node.children)
    name = str(children.pop(0)) if node.data in ("kernel", "attention") else None
    settings = tuple(_setting(s, filename) for s in children)
    return Block(str(node.data), name, settings, Span(filename, node.meta.line, node.meta.column))


def _int(text: str, filename: str, tok) -> int:
    if len(text) > MAX_DIGITS:
        raise SpecError(_span(filename, tok), f"integer literal with {len(text)} digits; no setting takes more than {MAX_DIGITS}")
    return int(text)


def _value(value_node: lark.Tree, filename: str) -> int | str | tuple[int, int]:
    tok = value_node.children[0]
    if value_node.data == "tile":
        m, n = str(tok).split("x")
        return (_int(m, filename, tok), _int(n, filename, tok))
    if value_node.data == "int":
        return _int(str(tok), filename, tok)
    return str(tok)


def _setting(node: lark.Tree, filename: str) -> Setting:
    key, *value_nodes = node.children
    values = tuple(_value(v, filename) for v in value_nodes)
    # A comma-separated list is a ValueList (only list-valued keys such as `shapes` accept one).
    value = values[0] if len(values) == 1 else ValueList(values)
    return Setting(str(key), value, _span(filename, key), _span(filename, value_nodes[0].children[0]))
