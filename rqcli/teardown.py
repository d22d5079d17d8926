"""Leaving the process without the interpreter's teardown, for a command that closed everything.

After a preload of 2,000 objects the interpreter spent ~0.1 s freeing what it had imported and built
(strace: no system calls, 100 ms of one thread's CPU between the last output and exit_group) — ~4%
of the run. A command that made everything durable and closed its files itself may skip that.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import NoReturn

_skip = False


def skip_teardown() -> None:
    """Called by a command once all it wrote is durable and closed: nothing at exit matters then."""
    global _skip
    _skip = True


def leave(code: int, console: bool) -> NoReturn:
    """Exits with `code`; without teardown only from the console entry point (never under a caller
    that imported rqcli and expects its process to go on, like a test runner).

    From the console the answer is decided here, so a signal from now on is ignored: a second
    SIGTERM (GNU `timeout` signals the child and then its process group) or a late Ctrl-C landing
    in the last flush or in the interpreter's teardown turned exit 0 or 130 into a traceback or
    143, after the summary had said otherwise."""
    if console and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
    if _skip and console:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                code = code or 120  # output was lost: say so, as the interpreter's own exit would
        os._exit(code)
    sys.exit(code)
