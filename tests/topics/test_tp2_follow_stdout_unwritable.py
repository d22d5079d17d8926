"""`rq tail -f` / `rq replay -f` on an idle topic with stdout closed (`>&-`) or full (`> /dev/full`)
(tp2): they waited for the topic's next record, maybe hours away, before their first write found
stdout gone. They now say so at the first idle check: one line naming stdout, exit 1, no commit."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from rqtest import rq_command

LINES = {
    "closed": "cannot write to stdout: Bad file descriptor",
    "full": "cannot write to stdout: No space left on device",
}


def _rq(args: list[str], how: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "CI": "1"}
    with open("/dev/full", "wb") as full:
        return subprocess.run(
            [*rq_command(), *args],
            stdout=subprocess.DEVNULL if how == "closed" else full,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            check=False,
            timeout=60,  # old code: never ends on its own (the topic gets no record)
            preexec_fn=(lambda: os.close(1)) if how == "closed" else None,
        )


@pytest.fixture()
def topics(tmp_path: Path) -> Path:
    d = tmp_path / "topics"
    subprocess.run(
        [*rq_command(), "produce", "t", "-q", "--topics-dir", str(d)],
        input=b"1\n2\n",
        check=True,
        capture_output=True,
    )
    return d


@pytest.mark.parametrize("how", ["closed", "full"])
def test_tail_follow_of_an_idle_topic_tells_unwritable_stdout(topics: Path, how: str) -> None:
    done = _rq(["tail", "t", "-n", "0", "-f", "--topics-dir", str(topics)], how)
    assert (done.returncode, done.stderr.decode()) == (1, f"rq: error: {LINES[how]}\n")


@pytest.mark.parametrize("how", ["closed", "full"])
def test_replay_follow_of_an_idle_topic_tells_it_and_commits_nothing(topics: Path, how: str) -> None:
    args = ["replay", "t", "-f", "-g", "g1", "--commit", "--from", "end", "--topics-dir", str(topics)]
    done = _rq(args, how)
    assert done.returncode == 1, done.stderr
    assert done.stderr.decode().splitlines()[-1] == f"rq: error: {LINES[how]}"
    listed = subprocess.run(
        [*rq_command(), "offsets", "t", "--json", "--topics-dir", str(topics)],
        capture_output=True,
        check=True,
    )
    assert json.loads(listed.stdout.splitlines()[-1])["groups"] == []  # the group never moved
