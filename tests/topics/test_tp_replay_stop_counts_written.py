"""A plain `rq replay` (no --commit) stopped by SIGTERM, Ctrl-C or SIGHUP must count in its done
line (and --json summary) every record it wrote to stdout, as tail, produce and replay --commit do.
Without a held stop the signal was raised between a batch's write and its count (deterministic
here: a hook in the rq process signals rq itself right after the first batch is written), so the
done line said 0 records after all of them were printed."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from rqtest import popen_rq_with, run_rq

from rqcli.exitcodes import ExitCode

N = 7
SIGNALLED = "signals rq itself once the first batch is out"


def _signal_after_first_write(sig: int) -> str:
    """popen_rq_with's setup: wraps the CLI's Writer so that it {SIGNALLED}."""
    return "\n".join(
        [
            "import os",
            "from rqcli.commands import topics as t",
            "orig = t.Writer.__call__",
            "calls = []",
            "def wrapped(self, records, decoded):",
            "    orig(self, records, decoded)",
            "    calls.append(len(records))",
            "    if len(calls) == 1:",
            f"        os.kill(os.getpid(), {int(sig)})",
            "t.Writer.__call__ = wrapped",
        ]
    )


@pytest.mark.parametrize(
    ("sig", "why"),
    [
        (signal.SIGTERM, "stopped by SIGTERM"),
        (signal.SIGINT, "interrupted"),
        (signal.SIGHUP, "stopped by SIGHUP"),
    ],
)
def test_a_plain_replay_stopped_after_a_write_counts_it(tmp_path: Path, sig: int, why: str) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    made = run_rq("produce", "ev", "-q", input=b"".join(b"%d\n" % i for i in range(N)), env=env)
    assert made.returncode == 0, made.stderr
    proc = popen_rq_with(_signal_after_first_write(sig), "--json", "replay", "ev", "--from", "0", env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    records = [x for x in lines if "event" not in x]
    done = lines[-1]
    assert done["event"] == "done" and len(records) == N, (out, err)
    assert done["records"] == N, done  # was 0
    assert (done["first_offset"], done["last_offset"], done["next_offset"]) == (0, N - 1, N), done
    assert done["error"] == why, done
