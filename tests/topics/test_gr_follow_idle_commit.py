"""og's review 4: a `replay -f --commit` follower that read a backlog, then found the topic quiet,
committed nothing until the next record or its end (a kill -9 then re-read all of it). It now
commits about a second after the last batch while it waits, on both backends."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import popen_rq, run_rq
from test_jetstream import publish

pytestmark = pytest.mark.integration


def _committed(topic: str, env: dict[str, str] | None = None) -> Any:
    r = run_rq("offsets", topic, "--group", "f", "--json", env=env)
    if r.returncode == 3 and b"does not exist" in r.stderr:
        return None  # not committed yet: a named group that never committed is exit 3
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["groups"][0]["committed"]


def _follower_commits_while_it_waits(topic: str, want: int, env: dict[str, str] | None = None) -> None:
    proc = popen_rq(
        "replay", topic, "--group", "f", "--commit", "-f", "--timeout", "120", "--format", "raw", env=env
    )
    try:
        deadline = time.monotonic() + 30  # a condition waited for, not a time asserted
        seen = None
        while time.monotonic() < deadline and proc.poll() is None:
            seen = _committed(topic, env)
            if seen == want:
                break
            time.sleep(0.2)
        # was: committed null until the follow ended (here: its 120 s --timeout, far past the deadline)
        assert seen == want
        assert proc.poll() is None  # committed by the running follower, not by its exit
    finally:
        proc.kill()
        proc.wait(10)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


def test_embedded_follower_commits_a_backlog_then_quiet(tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", "T", input=b"1\n2\n3\n4\n5\n", env=env).returncode == 0
    _follower_commits_while_it_waits("T", 5, env)
    # killed (SIGKILL) after that commit: a rerun reads nothing again
    r = run_rq("replay", "T", "--group", "f", "--format", "raw", env=env)
    assert r.returncode == 0 and r.stdout == b"", r.stderr


@pytest.fixture
def stream(services: Any) -> Iterator[tuple[str, str]]:
    with made_streams(services.nats_url, "gr_idle") as make:
        yield services.nats_url, make(subjects=["{name}.>"])


def test_jetstream_follower_commits_a_backlog_then_quiet(stream: tuple[str, str]) -> None:
    url, name = stream
    publish(url, f"{name}.a", [b"1", b"2", b"3", b"4", b"5"])
    _follower_commits_while_it_waits(f"{url}/{name}/{name}.a", 6)
