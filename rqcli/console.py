"""The `rq` console script's entry point.

The collector is off while rq imports: imports build long-lived objects only, and the full passes
the collector made over them cost ~5 ms of every start (measured: the preload command's imports,
111 vs 116 ms). It comes back on once the command's own module is loaded (rqcli.main), or, for
`rq preload`, after the command has imported the cache and frozen what it imported.

SIGINT and SIGTERM are held from here on: rq's imports take ~100 ms, and a signal in them killed
the process without a word (SIGTERM) or with a Python traceback (SIGINT), where a script reading
`rq send --json` is promised a summary. rqcli.main answers a held signal before the command runs.
"""

import gc
import signal
import threading

gc.disable()

_held: list[int] = []


def _hold(signum: int, _frame: object) -> None:
    _held.append(signum)


def held_signals() -> list[int]:
    """The signals that arrived while rq was starting, and the normal handling back: SIGINT as
    KeyboardInterrupt (rqcli.main sets SIGTERM's own)."""
    if signal.getsignal(signal.SIGINT) is _hold:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is _hold:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    held, _held[:] = list(_held), []
    return held


def main() -> None:
    if threading.current_thread() is threading.main_thread():  # (signal.signal's own rule)
        signal.signal(signal.SIGINT, _hold)
        signal.signal(signal.SIGTERM, _hold)
    from rqcli.main import main as run

    run()
