"""Helpers for the tests that stop rq while the embedded log stores a batch in parts
(test_split_batch_interrupted.py, test_stop_done_line_position.py): the records, the hook that
raises a signal at the k-th part inside a real rq process (rqtest.popen_rq_with), and a topic's
values."""

from __future__ import annotations

from pathlib import Path

from topics.embedded.log import TopicLog

LINES = [b"%05d-" % i + b"z" * 94 for i in range(2000)]
AT = 3  # the hook fires at the third part

HOOKS = {
    "after_sync": (
        "_real = os.fdatasync\ndef _hooked(fd):\n    _real(fd)\n    _fire()\nos.fdatasync = _hooked\n"
    ),
    "between_parts": (
        "_real = fmt.encode_batch\n"
        "def _hooked(*a):\n"
        "    _fire()\n"
        "    return _real(*a)\n"
        "fmt.encode_batch = _hooked\n"
    ),
}


def hook_setup(hook: str, sig: int) -> str:
    """popen_rq_with's setup: the batch limit lowered to 8 KiB (a read batch of ~100 B records
    splits into parts), _Stops.GRACE_S to 0.01, and `sig` raised at part AT by HOOKS[hook], then
    a sleep past the grace so the held stop is overdue inside the append, as on a slow disk."""
    return (
        "import os, signal, time\n"
        "from topics.embedded import format as fmt\n"
        "fmt.MAX_BATCH_PAYLOAD = 8192\n"
        "from rqcli.commands import topics as _cmd\n"
        "_cmd._Stops.GRACE_S = 0.01\n"
        "_n = [0]\n"
        "def _fire():\n"
        "    _n[0] += 1\n"
        f"    if _n[0] == {AT}:\n"
        f"        os.kill(os.getpid(), {int(sig)})\n"
        "        time.sleep(2)  # a stop held for the write is overdue (GRACE_S) in here\n" + HOOKS[hook]
    )


def topic_values(target: str) -> list[bytes]:
    """The values of an embedded topic, in offset order."""
    return [r[4] for batch in TopicLog(Path(target)).reader(0, None, False) for r in batch]
