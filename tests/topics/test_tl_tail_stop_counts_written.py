"""`rq tail -f` stopped by SIGTERM (or Ctrl-C) must count in its done line every record it wrote
to stdout. The count came after the write, outside any hold, so a signal landing between the two
(deterministic here: the hook signals rq itself right after a batch is written) left the batch
out: the done line said 0 records after 5 were printed. tail now holds a stop during the write and
its count, as replay --commit does (_Stops)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from rqtest import popen_rq_with, run_rq

from rqcli.exitcodes import ExitCode

N = 5


def _hook(sig: int, before: bool) -> str:
    """popen_rq_with's setup: `sig` sent to rq itself once, right before or right after the first
    batch is written out (inside the Writer, where a read loop's stop can land)."""
    fire = f"    os.kill(os.getpid(), {int(sig)})\n"
    return (
        "import os\n"
        "from rqcli.commands import topics as _cmd\n"
        "_real = _cmd.Writer.__call__\n"
        "_n = [0]\n"
        "def _hooked(self, records, decoded):\n"
        "    _n[0] += 1\n"
        + (fire if before else "")
        + "    _real(self, records, decoded)\n"
        + ("" if before else f"    if _n[0] == 1:\n    {fire}")
        + "_cmd.Writer.__call__ = _hooked\n"
    )


def _tail(tmp_path: Path, sig: int, before: bool, *extra: str) -> tuple[list[dict], dict, bytes]:
    return _stopped(tmp_path, sig, before, "tail", "ev", "-f", "-n", str(N), "--json", *extra)


def _stopped(tmp_path: Path, sig: int, before: bool, *args: str) -> tuple[list[dict], dict, bytes]:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    data = b"".join(b'{"i": %d}\n' % i for i in range(N))
    assert run_rq("produce", "ev", "-q", input=data, env=env).returncode == 0
    proc = popen_rq_with(_hook(sig, before), *args, env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert lines and lines[-1].get("event") == "done", out
    return [x for x in lines if "event" not in x], lines[-1], err


WHY = {signal.SIGTERM: "stopped by SIGTERM", signal.SIGINT: "interrupted", signal.SIGHUP: "stopped by SIGHUP"}


@pytest.mark.parametrize("sig", list(WHY))
def test_a_stop_right_after_a_write_counts_that_batch(tmp_path: Path, sig: int) -> None:
    records, done, err = _tail(tmp_path, sig, before=False)
    assert len(records) == N, err
    assert done["records"] == N, done
    assert (done["first_offset"], done["last_offset"]) == (records[0]["offset"], records[-1]["offset"])
    assert done["error"] == WHY[sig]


def test_a_committing_replay_stopped_by_sighup_in_a_write_keeps_its_done_line(tmp_path: Path) -> None:
    """SIGHUP (the terminal gone) was not one of _Stops' signals: main's handler raised it inside
    the held write, which then pointed stdout at /dev/null (a stop cutting a write), and the
    done line was lost, though the batch was out and its position committed."""
    records, done, err = _stopped(
        tmp_path, signal.SIGHUP, False, "replay", "ev", "--group", "g", "--commit", "--json"
    )
    assert done["records"] == len(records) == N, (done, err)
    assert done["committed"] == {"group": "g", "offset": N} and done["error"] == "stopped by SIGHUP"


def test_a_stop_during_a_write_waits_for_it_and_counts_it(tmp_path: Path) -> None:
    """The stop lands as the write starts: the batch goes out whole and counts."""
    records, done, err = _tail(tmp_path, signal.SIGTERM, before=True)
    assert done["records"] == len(records) == N, (done, err)


def test_a_recording_tail_counts_what_it_stored_and_wrote(tmp_path: Path) -> None:
    records, done, err = _tail(tmp_path, signal.SIGTERM, False, "--record", str(tmp_path / "cap"))
    assert done["records"] == len(records) == done["stored"] == N, (done, err)
