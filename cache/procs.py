"""Process identity that survives pid reuse: (pid, start time in clock ticks since boot)."""

from __future__ import annotations

import os


def start_time(pid: int) -> int | None:
    """The process's start time from /proc, or None if no such process exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # field 2 (comm) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19])


def me() -> tuple[int, int]:
    pid = os.getpid()
    return pid, start_time(pid) or 0


def alive(pid: int, started: int) -> bool:
    """True while the process that wrote (pid, started) still runs; a reused pid has another start time."""
    if pid <= 0:
        return False
    now = start_time(pid)
    return now is not None and now == started
