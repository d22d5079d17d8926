"""stdout that cannot be written — closed (`>&-`) or on a full device (`> /dev/full`) — is one line
naming stdout and exit 1, for every command. Closed, every command ran, dropped its output and
exited 0 (`rq replay -g G --commit >&-` moved the group to the end: records nobody got were
consumed); full, a bare "No space left on device" with exit 7, which says the cache's disk is full."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from rqtest import rq_command

CLOSED = "cannot write to stdout: Bad file descriptor"
FULL = "cannot write to stdout: No space left on device"


def _rq(*args: str, stdout: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """`rq ARGS` with stdout closed ("closed") or on /dev/full ("full")."""
    env = {**os.environ, "CI": "1"}
    if stdout == "closed":
        return subprocess.run(
            [*rq_command(), *args],
            input=stdin,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            check=False,
            timeout=120,
            preexec_fn=lambda: os.close(1),
        )
    with open("/dev/full", "wb") as full:
        return subprocess.run(
            [*rq_command(), *args],
            input=stdin,
            stdout=full,
            stderr=subprocess.PIPE,
            env=env,
            check=False,
            timeout=120,
        )


def _topic(tmp_path: Path) -> Path:
    topics = tmp_path / "topics"
    subprocess.run(
        [*rq_command(), "produce", "t", "-q", "--topics-dir", str(topics)],
        input=b"".join(b"%d\n" % i for i in range(50)),
        check=True,
        capture_output=True,
    )
    return topics


def _groups(topics: Path) -> list[object]:
    done = subprocess.run(
        [*rq_command(), "offsets", "t", "--json", "--topics-dir", str(topics)],
        capture_output=True,
        check=True,
    )
    groups: list[object] = json.loads(done.stdout.splitlines()[-1])["groups"]
    return groups


def test_replay_commit_with_stdout_closed_or_full_fails_and_commits_nothing(tmp_path: Path) -> None:
    topics = _topic(tmp_path)
    for how, line, fmt in (("closed", CLOSED, "raw"), ("full", FULL, "json")):
        done = _rq(
            "replay", "t", "-g", "g1", "--commit", "--format", fmt, "--topics-dir", str(topics), stdout=how
        )
        assert done.returncode == 1, (how, fmt, done.stderr)
        assert done.stderr.decode().splitlines()[-1] == f"rq: error: {line}", (how, fmt)
    assert _groups(topics) == []  # the group never moved


def test_listings_and_reads_fail_on_their_first_write(tmp_path: Path) -> None:
    topics = _topic(tmp_path)
    for args, how, line in (
        (("tail", "t", "-n", "3"), "closed", CLOSED),
        (("offsets", "t", "--json"), "full", FULL),
    ):
        done = _rq(*args, "--topics-dir", str(topics), stdout=how)
        assert (done.returncode, done.stderr.decode()) == (1, f"rq: error: {line}\n"), (args, how)


def test_side_effect_commands_finish_their_work_then_exit_1(tmp_path: Path) -> None:
    topics = tmp_path / "topics"
    done = _rq("produce", "p", "--json", "--topics-dir", str(topics), stdin=b"1\n2\n3\n", stdout="full")
    assert (done.returncode, done.stderr.decode()) == (1, f"rq: error: {FULL}\n")
    stored = subprocess.run(
        [*rq_command(), "offsets", "p", "--json", "--topics-dir", str(topics)],
        capture_output=True,
        check=True,
    )
    assert json.loads(stored.stdout)["records"] == 3  # the work was done
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a" * 100)
    cache = tmp_path / "cache"
    done = _rq("preload", f"{src}/", "--json", "--cache-dir", str(cache), stdout="closed")
    assert (done.returncode, done.stderr.decode()) == (1, f"rq: error: {CLOSED}\n")
    done = _rq("cache", "cat", str(src / "a"), "--cache-dir", str(cache), stdout="full")
    assert (done.returncode, done.stderr.decode()) == (1, f"rq: error: {FULL}\n")
    listed = subprocess.run(
        [*rq_command(), "cache", "ls", "--json", "--cache-dir", str(cache)], capture_output=True, check=True
    )
    assert len(listed.stdout.splitlines()) == 1  # preload's work was done


def test_commands_that_write_nothing_to_stdout_run_with_it_closed(tmp_path: Path) -> None:
    topics = tmp_path / "topics"
    done = _rq("produce", "q", "--topics-dir", str(topics), stdin=b"1\n2\n", stdout="closed")
    assert done.returncode == 0, done.stderr  # its line goes to stderr
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a")
    done = _rq("-q", "preload", f"{src}/", "--cache-dir", str(tmp_path / "c"), stdout="closed")
    assert (done.returncode, done.stderr) == (0, b"")
