"""An embedded topic's stored group offset is trusted only where a group can be: 0..end.

rq never stores a negative offset (check_commit_offset) and never one past the end (a reader
commits only what it read; `rq offsets reset` clamps to the end). One found there is damage: a
hand edit, or a group that committed records a power cut then took back (a reader may read a
batch between the writer's write and its fdatasync). It used to be taken as it was: -5 was
reported as `offsets -5..-1 aged out (retention)` and shown with a lag of 1000; 5000 on a topic
ending at 1000 read nothing (lag 0), and records produced later at 1000..4999 were skipped for good.
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import orjson
import pytest
from rqtest import run_rq
from test_ec_crash_consistency import kill_9_after

from rqcli.exitcodes import ExitCode
from topics.embedded.log import LogWriter, TopicLog
from topics.errors import DamagedGroup


def _topic(t: Path, n: int = 1000) -> TopicLog:
    with LogWriter(t) as w:
        w.append([(None, None, (), b"%d" % i) for i in range(n)])
    return TopicLog(t)


def _store(t: Path, group: str, committed: object) -> None:
    (t / "groups").mkdir(exist_ok=True)
    (t / "groups" / f"{group}.json").write_bytes(orjson.dumps({"group": group, "committed": committed}))


@pytest.mark.parametrize("stored", [-5, 1001, 5000])
def test_a_stored_offset_outside_the_topic_is_damage(tmp_path: Path, stored: int) -> None:
    t = tmp_path / "t"
    log = _topic(t)
    _store(t, "g", stored)
    with pytest.raises(DamagedGroup) as err:
        log.groups.committed("g")
    msg = str(err.value)
    assert "group g" in msg and str(stored) in msg and "rq offsets reset" in msg, msg
    for ok in (0, 999, 1000):  # the end itself is a group that read everything
        _store(t, "g", ok)
        assert log.groups.committed("g") == ok


def test_rq_refuses_a_group_past_the_end_and_reset_mends_it(tmp_path: Path) -> None:
    topics = tmp_path / "topics"
    _topic(topics / "t", 10)
    _store(topics / "t", "g", 5000)
    env = {"RQ_TOPICS_DIR": str(topics)}
    r = run_rq("replay", "t", "--group", "g", "--format", "raw", env=env)
    err = r.stderr.decode()
    assert r.returncode == ExitCode.VERIFY and r.stdout == b"", (
        r.returncode,
        err,
    )  # was: exit 0, nothing read
    assert len(err.strip().splitlines()) == 1 and "past the end" in err, err
    r = run_rq("offsets", "reset", "t", "--group", "g", "--to", "start", env=env)
    assert r.returncode == 0, r.stderr
    r = run_rq("replay", "t", "--group", "g", "--format", "raw", env=env)
    assert r.returncode == 0 and r.stdout.splitlines() == [b"%d" % i for i in range(10)], r.stderr


def test_a_commit_killed_at_any_point_leaves_the_old_or_the_new_offset(tmp_path: Path) -> None:
    # Holds on the old code too (write_atomic renames a whole file): kept as a guard. A child
    # commits 1, 2, 3, ... and reports each once commit() returned; SIGKILL at a random moment.
    t = tmp_path / "t"
    log = _topic(t, 100_000)
    rnd = random.Random(7)
    acked = 0
    for _ in range(20):

        def commits(wfd: int, start: int = acked + 1) -> None:
            for k in range(start, 100_000):
                log.groups.commit("g", k)
                os.write(wfd, struct.pack("<q", k))

        got = kill_9_after(commits, 8 * rnd.randint(1, 30))  # a few commits, then SIGKILL mid-way
        reported = max(struct.unpack(f"<{len(got) // 8}q", got[: len(got) // 8 * 8]), default=acked)
        now = TopicLog(t).groups.committed("g")
        assert now is not None and reported <= now <= reported + 1, (reported, now)  # never behind
        acked = now
    assert TopicLog(t).groups.groups() == ["g"]


def test_temp_files_of_killed_commits_are_swept_not_piled_up(tmp_path: Path) -> None:
    # A commit killed between its temp file and the rename left `.g.json.PID.RAND.tmp` in
    # groups/ for good (2 of them in the 20 kills above). The next commit of the group removes
    # the stale ones; one of a commit still in flight (fresh) stays, and other groups' stay.
    t = tmp_path / "t"
    log = _topic(t, 10)
    log.groups.commit("g", 1)
    groups = t / "groups"
    stale = [groups / ".g.json.4242.aaaaaaaaaaaa.tmp", groups / ".other.json.4242.bbbbbbbbbbbb.tmp"]
    fresh = groups / ".g.json.4343.cccccccccccc.tmp"
    for p in (*stale, fresh):
        p.write_bytes(b'{"committed":')
    old = os.stat(fresh).st_mtime - 2 * 3600
    for p in stale:
        os.utime(p, (old, old))
    log.groups.commit("g", 2)
    assert sorted(p.name for p in groups.iterdir()) == sorted(["g.json", fresh.name, stale[1].name])
    assert log.groups.committed("g") == 2 and log.groups.groups() == ["g"]
