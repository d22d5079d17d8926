"""GNU `timeout` sends SIGTERM to rq and then to its whole process group: the same stop, twice,
milliseconds apart. `rq replay -f --group g --commit` holds the second one while the first one's
commit runs, but the old code let it stop rq again once that commit was done (`_Stops.settle`):
landing while the source was being closed, before the done line was written, it dropped the
done line (exit 130, empty stdout: test_commit_second_signal failed now and then on a loaded
machine, where closing the NATS connection takes a while). The second signal is sent here from
inside rq as the source closes, deterministically; a signal that soon after the first
is that stop, and the done line comes last with the commit."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from rqtest import popen_rq_with, read_lines, run_rq

from rqcli.exitcodes import ExitCode

_AGAIN_AFTER_SETTLE = (
    "import os, signal\n"
    "from topics.sources import embedded as _e\n"
    "_close = _e.EmbeddedSource.close\n"
    "def _again(self):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)  # timeout(1)'s second SIGTERM, to the group\n"
    "    _close(self)\n"
    "_e.EmbeddedSource.close = _again\n"
)


def test_the_same_stop_twice_after_the_commit_keeps_the_done_line(tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", "ev", input=b"1\n2\n3\n", env=env).returncode == 0
    args = ("replay", "ev", "-f", "--group", "g", "--commit", "--format", "raw", "--json")
    rq = popen_rq_with(_AGAIN_AFTER_SETTLE, *args, env=env)
    read_lines(rq, [b"1", b"2", b"3"])
    rq.send_signal(signal.SIGTERM)
    out, err = rq.communicate(timeout=30)
    assert rq.returncode == ExitCode.INTERRUPTED, err
    assert err.decode().strip().splitlines() == ["rq: stopped by SIGTERM"], err
    done = json.loads(out.splitlines()[-1])  # old: no done line, stdout empty
    assert done["event"] == "done" and done["error"] == "stopped by SIGTERM"
    assert done["committed"] == {"group": "g", "offset": 3}
