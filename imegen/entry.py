"""The `imegen` console script and `python -m imegen`: Ctrl-C is one line and exit status 130 from
the first moment, not only once a command runs.

The command line imports lark, NumPy, Jinja2 and the whole generator before it parses its arguments;
a Ctrl-C during those imports would end in a KeyboardInterrupt traceback. This module imports nothing
heavy, so it is in place before they start.
"""

from __future__ import annotations

import os
import sys

import _signal  # the C module: ready at once, where `import signal` first builds its enums (a window of its own)

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a job ended by Ctrl-C


def _leave_while_loading(signum, frame) -> None:
    """Ctrl-C while imegen is still importing: nothing has started that needs undoing (no files, no
    child processes), so leave at once. Raising KeyboardInterrupt instead could land in a finalizer
    an import runs, where Python prints "Exception ignored" with a traceback and drops it."""
    os.write(2, b"interrupted\n")
    os._exit(INTERRUPTED)


def main(argv: list[str] | None = None) -> int:
    # Only when SIGINT has Python's usual handler: a parent that ignores it (nohup, a background job) keeps that.
    loading_handler = _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler
    if loading_handler:
        _signal.signal(_signal.SIGINT, _leave_while_loading)
    try:
        from .cli import main as cli_main
    finally:
        if loading_handler:  # from here on Ctrl-C unwinds, so a command removes what it was writing
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    from . import interrupt

    interrupt.install()  # a press that a finalizer swallows is still honoured (imegen/interrupt.py)
    try:
        return cli_main(argv)
    except KeyboardInterrupt:  # outside the command itself: while the argument parser is being built
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
