"""A group commit whose rename was done but whose directory fsync failed (EIO, ENOSPC, EROFS).

The rename is what every reader sees at once: the next replay starts at the new offset. Only its
durability across a power cut is unknown. The old code passed the fsync's OSError up as a failed
commit: `replay --commit --json` ended with `"committed": null` and a bare `Input/output error`
(no file named) while groups/g.json held the new offset, so a script trusting the done line
re-read those records, or believed nothing moved. Now the done line (and `rq offsets reset`'s
answer) says what readers see, and the run still fails naming the file: exit 1, or 7 for a full
disk. The faults are injected (os.fsync raising for the groups/ directory), no root needed."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from rqtest import popen_rq_with, run_rq

import topics.embedded.files as files
from rqcli.exitcodes import ExitCode
from topics.embedded.groups import GroupStore
from topics.errors import CommitNotDurable

# os.fsync of the groups/ directory (the one after a commit's rename) fails, `times` times
_FAIL_GROUPS_DIR_FSYNC = """
import errno, os, stat
real_fsync = os.fsync
left = [{times}]
def fsync(fd):
    if left[0] and stat.S_ISDIR(os.fstat(fd).st_mode) and os.readlink(f"/proc/self/fd/{{fd}}").endswith("/groups"):
        left[0] -= 1
        raise OSError(errno.{name}, os.strerror(errno.{name}))
    return real_fsync(fd)
os.fsync = fsync
"""

_CODES = {"EIO": ExitCode.FAILURE, "ENOSPC": ExitCode.NO_SPACE, "EROFS": ExitCode.FAILURE}


def _topic(tmp_path: Path, n: int = 50) -> dict[str, str]:
    env = {"RQ_TOPICS_DIR": str(tmp_path / "t")}
    lines = "".join(f"{i}\n" for i in range(n)).encode()
    assert run_rq("produce", "ev", "-q", input=lines, env=env).returncode == 0
    return env


def _stored(tmp_path: Path, group: str = "g") -> int:
    return int(json.loads((tmp_path / "t" / "ev" / "groups" / f"{group}.json").read_bytes())["committed"])


def test_the_library_says_the_commit_is_stored_but_not_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = GroupStore(tmp_path)
    store.commit("g", 3)
    real = files.os.fsync

    def failing(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(files.os, "fsync", failing)
    with pytest.raises(CommitNotDurable) as caught:  # was a bare OSError: read as not committed
        store.commit("g", 7)
    exc = caught.value
    path = str(tmp_path / "groups" / "g.json")
    assert (exc.group, exc.offset, exc.path, exc.errno) == ("g", 7, path, errno.EIO)
    assert path in str(exc) and "Input/output error" in str(exc), str(exc)
    monkeypatch.setattr(files.os, "fsync", real)
    assert GroupStore(tmp_path).committed("g") == 7  # what every reader sees
    assert [n for n in os.listdir(tmp_path / "groups") if n.endswith(".tmp")] == []


@pytest.mark.parametrize("name", sorted(_CODES))
def test_a_replay_commit_not_synced_reports_what_readers_see(tmp_path: Path, name: str) -> None:
    env = _topic(tmp_path)
    assert run_rq("replay", "ev", "--group", "g", "--commit", "--to", "10", "-q", env=env).returncode == 0
    proc = popen_rq_with(
        _FAIL_GROUPS_DIR_FSYNC.format(times=1, name=name),
        "replay", "ev", "--group", "g", "--commit", "--to", "20", "--json",
        env=env,
    )  # fmt: skip
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == _CODES[name], err
    done = json.loads(out.decode().splitlines()[-1])
    path = str(tmp_path / "t" / "ev" / "groups" / "g.json")
    assert _stored(tmp_path) == 20
    assert done["committed"] == {"group": "g", "offset": 20}, done  # was null
    assert path in done["error"] and os.strerror(errno.__dict__[name]) in done["error"], done
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rq: error: group g is committed at offset 20"), err
    assert path in lines[0] and "power cut" in lines[0], err
    # the next run goes on from there: nothing read twice
    again = run_rq("replay", "ev", "--group", "g", "--to", "21", "--format", "raw", env=env)
    assert again.stdout == b"20\n", again


def test_a_reset_not_synced_answers_the_new_offset_and_fails(tmp_path: Path) -> None:
    env = _topic(tmp_path)
    assert run_rq("offsets", "reset", "ev", "--group", "g", "--to", "20", env=env).returncode == 0
    proc = popen_rq_with(
        _FAIL_GROUPS_DIR_FSYNC.format(times=1, name="EIO"),
        "--json", "offsets", "reset", "ev", "--group", "g", "--to", "5",
        env=env,
    )  # fmt: skip
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.FAILURE, err
    answer = json.loads(out)  # was: no answer at all
    assert (answer["before"], answer["after"]) == (20, 5), answer
    assert _stored(tmp_path) == 5
    line = err.decode().strip()
    assert line.startswith("rq: error: group g is committed at offset 5"), line
    assert str(tmp_path / "t" / "ev" / "groups" / "g.json") in line, line


def test_a_follow_commit_not_synced_ends_the_run_saying_so(tmp_path: Path) -> None:
    env = _topic(tmp_path, 3)
    # the follow's commit (after a second) is stored but not synced; the final one syncs
    proc = popen_rq_with(
        _FAIL_GROUPS_DIR_FSYNC.format(times=1, name="EIO"),
        "replay", "ev", "--group", "f", "--commit", "-f", "--timeout", "20", "--json", "--format", "raw",
        env=env,
    )  # fmt: skip
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.FAILURE, err
    done = json.loads(out.decode().splitlines()[-1])
    assert done["committed"] == {"group": "f", "offset": 3}, done
    assert _stored(tmp_path, "f") == 3
    path = str(tmp_path / "t" / "ev" / "groups" / "f.json")
    assert path in done["error"] and "readers see it" in done["error"], done  # was a bare EIO
    assert err.decode().strip().startswith("rq: error: group f is committed at offset 3"), err


def test_a_commit_that_failed_before_its_rename_is_not_reported_stored(tmp_path: Path) -> None:
    # the temp file's fsync fails: nothing changed, and the done line says so (a guard: holds on
    # the old code too)
    env = _topic(tmp_path)
    assert run_rq("replay", "ev", "--group", "g", "--commit", "--to", "10", "-q", env=env).returncode == 0
    setup = """
import errno, os, stat
real_fsync = os.fsync
def fsync(fd):
    if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    return real_fsync(fd)
os.fsync = fsync
"""
    proc = popen_rq_with(setup, "replay", "ev", "--group", "g", "--commit", "--to", "20", "--json", env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.FAILURE, err
    done = json.loads(out.decode().splitlines()[-1])
    assert done["committed"] is None, done
    assert str(tmp_path / "t" / "ev" / "groups" / "g.json") in done["error"], done
    assert _stored(tmp_path) == 10
