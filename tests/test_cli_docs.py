"""imegen's command line tells the truth, and the docs are held to it: every argument has help, a bad
value is refused with what would be valid, every `imegen ...` command line README.md and docs/*.md show
parses with imegen's own parser and names only options its command has, and the README's first
commands run."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from imegen import __version__, cli, cli_types, toolchain
from imegen.cli import build_parser
from imegen.ir import _CHOICES

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PARSER = build_parser()
COMMANDS: dict[str, argparse.ArgumentParser] = next(
    a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def _documented(p: argparse.ArgumentParser) -> set[str]:
    """The option strings --help shows (not a former spelling kept hidden)."""
    return {s for a in p._actions if a.help is not argparse.SUPPRESS for s in a.option_strings}


# ---------------------------------------------------------------------------------------------
# (1) Every argument has help; a bad value is refused with what is valid


@pytest.mark.parametrize("command", COMMANDS)
def test_every_argument_has_help(command):
    p = COMMANDS[command]
    assert p.description and p.description.strip(), command
    for a in p._actions:
        if a.help is argparse.SUPPRESS:  # only a former spelling of a documented option, never a hidden feature
            assert a.option_strings and any(b.dest == a.dest and b.help is not argparse.SUPPRESS for b in p._actions), \
                (command, a.option_strings)
        else:
            assert a.help and len(a.help) >= 10, (command, a.option_strings or a.dest)


def test_top_level_help_lists_every_command_once_in_its_group(capsys):
    with pytest.raises(SystemExit) as exit_:
        PARSER.parse_args(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: imegen [-h] [--version] COMMAND ...\n")
    grouped = [name for _, names in cli.GROUPS for name in names]
    assert sorted(grouped) == sorted(COMMANDS) and len(set(grouped)) == len(grouped)
    listed = re.findall(r"^  ([a-z][a-z0-9-]*)  ", out, re.M)
    assert listed == grouped  # every command once, in the groups' order
    for title, names in cli.GROUPS:
        assert f"\n{title}:\n  {names[0]} " in out


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"imegen {__version__}\n"


def test_vlens_are_the_dsls():
    assert cli_types.VLENS == _CHOICES["vlen"][1]


BAD_VALUES = ("x", "", "-1", "0", "1.5", "48", "3000", "x=1", "1x")
# What argparse prints when a type raises ValueError instead of saying what is valid.
UNHELPFUL = re.compile(r"invalid \S+ value:")
SAYS_WHAT_IS_VALID = re.compile(r"expected |must be |choose from |given more than once|is empty")


def _valued_options() -> list[tuple[str, str]]:
    return [(command, a.option_strings[-1]) for command, p in COMMANDS.items() for a in p._actions
            if a.option_strings and a.nargs != 0 and (a.type is not None or a.choices is not None)]


def _action(command: str, option: str) -> argparse.Action:
    return COMMANDS[command]._option_string_actions[option]


def _refuses(action: argparse.Action, text: str) -> bool:
    try:
        value = action.type(text) if action.type else text
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return True
    return action.choices is not None and value not in action.choices


def _required(command: str) -> list[str]:
    """Arguments the command cannot parse without: a placeholder per positional and required option."""
    argv = []
    for a in COMMANDS[command]._actions:
        if not a.option_strings and a.nargs is None:
            argv.append("x")
        elif a.option_strings and a.required:
            argv += [a.option_strings[0], "x"]
    return argv


@pytest.mark.parametrize("command, option", _valued_options())
def test_a_bad_value_is_refused_with_what_is_valid(capsys, command, option):
    action = _action(command, option)
    refused = [v for v in BAD_VALUES if _refuses(action, v)]
    assert refused, f"{command} {option}: no sample value is refused; add one to BAD_VALUES"
    for value in refused:
        with pytest.raises(SystemExit) as exit_:
            PARSER.parse_args([command, option, value, *_required(command)])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.splitlines()[-1]
        assert err.startswith(f"imegen {command}: error: argument {'/'.join(action.option_strings)}: "), err
        assert not UNHELPFUL.search(err) and SAYS_WHAT_IS_VALID.search(err), (value, err)


# ---------------------------------------------------------------------------------------------
# (2) The docs' command lines parse with imegen's parser and name only options their command has

SPAN = re.compile(r"`([^`]+)`")
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*(=[A-Z_]+)?")
COMMAND_LIKE = re.compile(r"[a-z][a-z0-9-]*")  # not `imegen COMMAND --help`, not `imegen IME emulator: ...`
SAMPLE_VALUES = ("1", "a=1", "32", "256", "1x1")  # one of them is valid for each typed option


def _code_lines(lines: list[str]) -> list[tuple[int, str]]:
    """(line number, text) of the lines in fenced or indented code blocks."""
    out, fence, in_indented = [], False, False
    for i, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        indented = line.startswith("    ") and line.strip() and (in_indented or not lines[i - 2].strip())
        in_indented = bool(indented) or (in_indented and not line.strip())
        if fence or indented:
            out.append((i, line))
    return out


def _units(lines: list[str]) -> list[tuple[int, str]]:
    """Prose units, each (first line number, text on one line): a paragraph, a list item or a table row."""
    code = {i for i, _ in _code_lines(lines)}
    units: list[tuple[int, list[str]]] = []
    for i, line in enumerate(lines, 1):
        if i in code or not line.strip() or line.lstrip().startswith("```"):
            units.append((i, []))
            continue
        starts = line.lstrip().startswith(("|", "- ", "* ")) or re.match(r"\s*\d+\. ", line)
        if starts or not units or not units[-1][1] or units[-1][1][0].lstrip().startswith("|"):
            units.append((i, [line]))
        else:
            units[-1][1].append(line)
    return [(i, " ".join(s.strip() for s in text)) for i, text in units if text]


def _commands_in(text: str, bare: bool = False) -> list[list[str]]:
    """The imegen command lines in a code line or an inline span (the words after `imegen`); with `bare`
    (a prose span) also `CMD ...`, a command named without `imegen`."""
    found = []
    for segment in re.split(r"&&|;|\s\|\s", re.split(r"\s#\s", text)[0]):
        try:
            words = shlex.split(segment)
        except ValueError:
            words = segment.split()
        if words[:1] == ["imegen"] and len(words) > 1 and COMMAND_LIKE.fullmatch(words[1]):
            found.append(words[1:])
        elif bare and words and words[0] in COMMANDS:
            found.append(words)
    return found


def _scan_docs() -> tuple[list[tuple[str, list[str], bool]], list[tuple[str, tuple[str, ...], str]]]:
    """The docs' command lines: (where, words after `imegen`, whether it is a whole command line to parse,
    not a fragment such as `bench --quick`); and the options (`--name`) prose mentions after naming
    commands in the same paragraph, list item or table row: (where, those commands, option)."""
    commands, mentions = [], []
    for path in DOCS:
        lines = path.read_text().splitlines()
        name = path.relative_to(ROOT)
        for i, line in _code_lines(lines):
            commands += [(f"{name}:{i}", words, True) for words in _commands_in(line.strip())]
        for i, text in _units(lines):
            row = text.startswith("|")
            first_cell = SPAN.findall(text.split("|")[1]) if row else []
            named: list[str] = []  # the commands the unit has named so far
            for span in SPAN.findall(text):
                found = _commands_in(span, bare=True)
                # A whole command line: `imegen CMD ...` or, in a table's first column, `CMD ...`.
                whole = span.startswith("imegen ") or span in first_cell
                commands += [(f"{name}:{i}", words, whole and len(words) > 1) for words in found]
                named += [words[0] for words in found if words[0] not in named]
                if named and not found and re.match(r"--[a-z]", span):
                    mentions.append((f"{name}:{i}", tuple(named), span.split()[0].split("=")[0]))
    return commands, mentions


DOC_COMMANDS, DOC_MENTIONS = _scan_docs()
# pytest's own options (tests/conftest.py), which the docs mention next to the commands a test runs.
PYTEST_OPTIONS = set(re.findall(r'addoption\("(--[\w-]+)"', (ROOT / "tests" / "conftest.py").read_text()))


def _synopsis_to_argv(words: list[str]) -> list[str]:
    """A synopsis as an argv: [optional] parts given, the first of a|b alternatives, a placeholder value of
    a typed option (`--seq N`) replaced by a valid one."""
    argv = []
    for w in words:
        w = w.replace("[", "").replace("]", "")
        if w in ("", "..."):
            continue
        argv.append(w.split("|")[0] if "|" in w else w)
    p = COMMANDS.get(argv[0]) if argv else None
    for k in range(1, len(argv) - 1):
        a = p and p._option_string_actions.get(argv[k])
        if a and a.type and a.nargs != 0 and PLACEHOLDER.fullmatch(argv[k + 1]):
            argv[k + 1] = next(v for v in SAMPLE_VALUES if not _refuses(a, v))
    return argv


def test_the_docs_show_command_lines():
    where = {w.split(":")[0] for w, _, whole in DOC_COMMANDS if whole}
    assert {"README.md", "docs/commands.md", "docs/onnxruntime.md"} <= where
    assert sum(whole for _, _, whole in DOC_COMMANDS) > 40 and len(DOC_MENTIONS) > 10


@pytest.mark.parametrize("where, words, whole", DOC_COMMANDS, ids=[f"{w} {' '.join(c)}" for w, c, _ in DOC_COMMANDS])
def test_doc_command_line_parses_with_imegens_parser(capsys, where, words, whole):
    """A whole command line parses as it stands; a fragment (`bench --quick`) names only its command's options."""
    command = words[0]
    assert command in COMMANDS, f"{where}: `imegen {' '.join(words)}`: imegen has no command {command!r}"
    documented = _documented(COMMANDS[command])
    argv = _synopsis_to_argv(words)
    named = {w.split("=")[0] for w in argv[1:] if re.match(r"--?[a-zA-Z]", w)}
    assert named <= documented, f"{where}: `imegen {' '.join(words)}`: {command} has no {sorted(named - documented)}"
    if whole:
        try:
            PARSER.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: `imegen {' '.join(words)}` does not parse: {capsys.readouterr().err.strip()}")


def test_options_the_docs_mention_after_a_command_are_its_own():
    """`--seq` after `ort-model-check` in the same paragraph is an option of ort-model-check (or of another
    command the paragraph named before it)."""
    wrong = [f"{where}: {option} after {', '.join(commands)}, none of which has it"
             for where, commands, option in DOC_MENTIONS
             if option not in PYTEST_OPTIONS.union(*(_documented(COMMANDS[c]) for c in commands))]
    assert not wrong, "\n".join(wrong)


def test_the_docs_list_every_command():
    commands_md = (ROOT / "docs" / "commands.md").read_text()
    readme_table = (ROOT / "README.md").read_text().split("## Commands", 1)[1].split("\n\n", 2)[1]
    for command in COMMANDS:
        assert f"`imegen {command}" in commands_md, f"docs/commands.md does not describe imegen {command}"
        assert re.search(rf"`{re.escape(command)}[ `]", readme_table), f"README's command table lacks {command}"


# ---------------------------------------------------------------------------------------------
# (3) The README's first commands run


def _readme_first_commands() -> list[list[str]]:
    """The imegen commands of the README's first code block."""
    code = _code_lines((ROOT / "README.md").read_text().splitlines())
    first = [text for k, (i, text) in enumerate(code) if i == code[0][0] + k]  # the lines up to the first gap
    return [words for text in first for words in _commands_in(text.strip())]


def test_the_readme_starts_with_check_on_the_example():
    assert _readme_first_commands() == [["check", "examples/qwen_mlp.imegen"]]


@pytest.mark.skipif(bool(toolchain.missing_tools()), reason="needs the cross toolchains and qemu-riscv64")
def test_the_readme_first_commands_run():
    for words in _readme_first_commands():
        r = subprocess.run([sys.executable, "-m", "imegen", *words], cwd=ROOT, capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, f"imegen {' '.join(words)}: exit {r.returncode}\n{r.stderr[-3000:]}"
        assert re.search(r"^(\d+) of \1 builds passed", r.stdout, re.M), r.stdout[-2000:]
