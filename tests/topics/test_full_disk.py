"""`rq produce` onto a full disk: exit 7 naming the topic, a done line saying what was kept, and
nothing half-written (a real small tmpfs, not a mocked ENOSPC)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from rqtest import run_rq, small_tmpfs

from rqcli.exitcodes import ExitCode


def _lines(n: int) -> bytes:
    return b"".join(base64.b64encode(os.urandom(75)) + b"\n" for _ in range(n))


def _fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, bytes(4096)):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def test_produce_onto_a_full_disk_says_where_and_what_it_kept(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt", "256k") as mnt:
        data = _lines(5000)  # ~500 KB of records for 256 KiB of disk
        r = run_rq("produce", "t", "--topics-dir", str(mnt), "--json", input=data)
        err = r.stderr.decode()
        assert r.returncode == ExitCode.NO_SPACE, err
        assert len(err.strip().splitlines()) == 1 and f"the disk holding {mnt / 't'} is full" in err, err
        out = [json.loads(x) for x in r.stdout.decode().splitlines()]
        acked = sum(x["records"] for x in out if x["event"] == "ack")
        done = out[-1]  # was: no done line at all
        assert done["event"] == "done" and done["error"] == "No space left on device"
        assert done["records"] == acked > 0 and f"the {acked} record(s) acknowledged" in err
        back = run_rq("replay", "t", "--topics-dir", str(mnt), "--format", "raw")
        assert back.returncode == 0, back.stderr
        assert back.stdout == b"".join(data.splitlines(keepends=True)[:acked])

        # the batch cut short by the full disk was truncated away (its blocks given back): fill them
        _fill(mnt / "filler")
        r = run_rq("produce", "new", "--topics-dir", str(mnt), input=b"one\n")
        assert r.returncode == ExitCode.NO_SPACE and b"nothing was appended" in r.stderr, r.stderr
        assert os.listdir(mnt / "new") == []  # was: a half-written .topic.json.PID.tmp
