"""`rq tail --json`'s done line names the offsets of the first and last record it wrote out, as
docs/cli.md says for tail and replay alike (null when none was), also when SIGTERM ends a follow.
It had only records and next_offset (first-hour review): a script resuming after the last record
shown had to parse every record line for it."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from rqtest import popen_rq, run_rq


def _done(out: bytes) -> dict:
    lines = [json.loads(x) for x in out.decode().splitlines() if x.strip()]
    assert lines and lines[-1].get("event") == "done", lines
    return lines[-1]


def test_tail_says_which_offsets_it_wrote_out(tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert (
        run_rq("produce", "ev", "-q", input=b"".join(b"%d\n" % i for i in range(30)), env=env).returncode == 0
    )
    done = _done(run_rq("tail", "ev", "-n", "3", "--json", env=env).stdout)
    assert (done["records"], done["first_offset"], done["last_offset"], done["next_offset"]) == (
        3,
        27,
        29,
        30,
    )
    done = _done(run_rq("tail", "ev", "-n", "0", "--json", env=env).stdout)
    assert (done["records"], done["first_offset"], done["last_offset"]) == (0, None, None)


def test_a_follow_stopped_by_sigterm_names_them_too(tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", "ev", "-q", input=b"a\nb\nc\n", env=env).returncode == 0
    proc = popen_rq("tail", "ev", "-n", "2", "-f", "--json", env=env)
    try:
        assert proc.stdout is not None
        got = [json.loads(proc.stdout.readline()) for _ in range(2)]  # both written out: then stop
        assert [r["offset"] for r in got] == [1, 2]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    done = _done(out)
    assert (done["records"], done["first_offset"], done["last_offset"]) == (2, 1, 2), done
    assert done["error"] == "stopped by SIGTERM"
