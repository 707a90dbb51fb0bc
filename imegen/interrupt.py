"""Ctrl-C that is never lost.

Python raises KeyboardInterrupt from its SIGINT handler wherever the main thread happens to be, and when
that is inside a finalizer (a `__del__`, a weakref callback, a temporary folder's cleanup) it only prints
"Exception ignored" and drops it: the command then runs to its end and exits 0 as if nothing had been
pressed. So the handler also remembers the press: `check()`, called where imegen reports progress, raises
it again, and the command line reports `interrupted` (status 130) for a press whatever became of the first
KeyboardInterrupt.
"""

from __future__ import annotations

import signal
import threading

_pressed = False


def _on_sigint(signum, frame) -> None:
    global _pressed
    _pressed = True
    raise KeyboardInterrupt


def install() -> None:
    """Take over SIGINT where it has Python's usual handler (a parent that ignores it keeps that)."""
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _on_sigint):
        signal.signal(signal.SIGINT, _on_sigint)


def pressed() -> bool:
    return _pressed


def check() -> None:
    """Raise KeyboardInterrupt (main thread only) if Ctrl-C was pressed: one a finalizer swallowed acts here."""
    if _pressed and threading.current_thread() is threading.main_thread():
        raise KeyboardInterrupt
