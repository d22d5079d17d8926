"""`rq tail --record NAME` onto a full disk (a real small tmpfs). The old tail wrote each batch to
stdout before the capture appended it: on ENOSPC stdout had one batch more than NAME holds, the
line was a bare "No space left on device" (exit 7) and --json got no done line. Now the capture
is written first (stdout shows exactly what NAME stored), the line names NAME's path and how many
records it stored, and the done line comes last with the error."""

from __future__ import annotations

import json
from pathlib import Path

from rqtest import run_rq, small_tmpfs

from rqcli.exitcodes import ExitCode

_LINES = [b"%05d-" % i + b"z" * 94 for i in range(5000)]


def test_a_capture_onto_a_full_disk_shows_only_what_it_stored_and_says_so(tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    for k in range(10):  # ten batches: the capture fails inside the read, not at its start
        chunk = b"\n".join(_LINES[k * 500 : (k + 1) * 500]) + b"\n"
        assert run_rq("produce", "src", input=chunk, env=env).returncode == 0
    with small_tmpfs(tmp_path / "mnt", "256k") as mnt:
        cap = mnt / "cap"
        r = run_rq("tail", "src", "-n", "5000", "--record", str(cap), "--format", "raw", "--json", env=env)
        err = r.stderr.decode().strip()
        assert r.returncode == ExitCode.NO_SPACE, err
        *shown, last = r.stdout.splitlines()
        back = run_rq("replay", str(cap), "--from", "start", "--format", "raw")
        assert back.returncode == 0, back.stderr
        stored = back.stdout.splitlines()
        assert 0 < len(stored) < 5000
        assert shown == stored == _LINES[: len(stored)]  # was: one batch more on stdout
        assert len(err.splitlines()) == 1, err
        assert f"the disk holding {cap} is full" in err and f"stored {len(stored)} record(s)" in err, err
        done = json.loads(last)  # was: no done line
        assert done["event"] == "done" and done["records"] == done["stored"] == len(stored)
        assert f"stored {len(stored)} record(s)" in done["error"]
