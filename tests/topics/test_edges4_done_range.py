"""A replay stopped inside the write of its first batch (Ctrl-C or SIGTERM while stdout's reader
lags) printed a done line with `"records": 0` but `first_offset`/`last_offset` naming the whole
batch the read had tallied (1..1999): the range must describe what was written out. Every replay
now holds the stop until that batch is out (_Stops), so all of it is written and counted. rq's stdout is a 4 KiB pipe the test stops reading after one line, so the 1999-record
batch (~200 KB) cannot be out when the signal comes, whatever the machine's speed."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from rqtest import rq_command, run_rq

from rqcli.exitcodes import ExitCode

F_SETPIPE_SZ = 1031


def _stopped_replay(topics: Path, sig: signal.Signals, *extra: str) -> dict[str, object]:
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, 4096)
    env = {**os.environ, "RQ_TOPICS_DIR": str(topics)}
    proc = subprocess.Popen(
        [*rq_command(), "--json", "replay", "ev", "--from", "1", *extra],
        stdout=w,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(w)
    with os.fdopen(r, "rb") as stdout:
        try:
            assert json.loads(stdout.readline())["offset"] == 1  # the batch's write has begun
            proc.send_signal(sig)
            rest = stdout.read()
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == ExitCode.INTERRUPTED, err
    done: dict[str, object] = json.loads(rest.splitlines()[-1])
    return done


@pytest.fixture
def topics(tmp_path: Path) -> Path:
    made = run_rq(
        "produce",
        "ev",
        input=b"".join(b"%d\n" % i for i in range(2000)),
        env={"RQ_TOPICS_DIR": str(tmp_path)},
    )
    assert made.returncode == 0, made.stderr
    return tmp_path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_replay_stopped_mid_write_counts_the_batch_it_held_for(topics: Path, sig: signal.Signals) -> None:
    # Every replay holds the stop until the batch is out (as tail, produce and --commit do): the
    # done line counts exactly the records written. Before, a plain replay said 0 records here
    # (range null, next_offset 1) though the reader went on to get the part already written.
    done = _stopped_replay(topics, sig)
    assert done["event"] == "done" and done["records"] == 1999, done
    assert (done["first_offset"], done["last_offset"]) == (1, 1999), done
    assert done["next_offset"] == 2000, done


def test_a_committing_replay_stopped_mid_write_names_what_it_wrote(topics: Path) -> None:
    # with --commit the stop waits for the batch: all of it is out and counted, range and all
    done = _stopped_replay(topics, signal.SIGINT, "--group", "g", "--commit")
    assert done["records"] == 1999 and (done["first_offset"], done["last_offset"]) == (1, 1999), done
