"""JetStream skipped records that stream limits deleted before the read got to them without a
word (review): a group committed at 1001 on a stream whose max_msgs had moved its first sequence
to 1701 replayed from 1701, no `gap` line, no warning, exit 0; the embedded log reports such holes
as `gap` events (docs/cli.md). JetStreamSource.read accepted on_gap and never called it. A hole
below the stream's first sequence is now told; one above it (a message deleted by itself, other
subjects' messages under a subject filter) is not. All against the real server, deterministic:
publish, let max_msgs delete, then read from below the first sequence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import js_call, run_rq

from topics.sources.jetstream import JetStreamSource
from topics.sources.open import parse_topic

pytestmark = pytest.mark.integration


def _publish(nats_url: str, subjects: list[str], times: int) -> None:
    async def fill(js: Any) -> None:
        for i in range(times):
            for subject in subjects:
                await js.publish(subject, b"%s-%d" % (subject.rsplit(".", 1)[1].encode(), i))

    js_call(nats_url, fill)


def _read(url: str, start: int, stop: int | None, follow: bool = False) -> list[Any]:
    """What a read from `start` gives: ("gap", first, last) and the records' offsets, in order."""
    seen: list[Any] = []
    source = JetStreamSource(parse_topic(url, Path(".")), idle_timeout=0.5 if follow else None)
    try:
        for batch in source.read(start, stop, follow, on_gap=lambda a, b: seen.append(("gap", a, b))):
            seen.extend(r[0] for r in batch)
            if follow and batch and batch[-1][0] >= 30:
                break
    finally:
        source.close()
    return seen


def test_a_read_from_below_the_first_sequence_tells_the_gap(nats_url: str) -> None:
    with made_streams(nats_url, "FX5") as make:
        name = make(max_msgs=10)
        _publish(nats_url, [f"{name}.x"], 30)  # sequences 1..30; max_msgs keeps 21..30
        url = f"{nats_url}/{name}"
        want = [("gap", 5, 20), *range(21, 31)]
        assert _read(url, 5, 31) == want  # was: 21..30 and no gap
        assert _read(url, 5, None, follow=True) == want
        assert _read(url, 5, 12) == [("gap", 5, 11)]  # a read that ends in the hole
        assert _read(url, 21, 31) == list(range(21, 31))  # nothing stepped over


def test_a_subject_filter_tells_only_what_lies_below_the_first_sequence(nats_url: str) -> None:
    with made_streams(nats_url, "FX5") as make:
        name = make(subjects=["{name}.*"], max_msgs=10)
        _publish(nats_url, [f"{name}.a", f"{name}.b"], 15)  # a odd, b even; 21..30 kept
        # the b messages between the a ones are no gap; what max_msgs deleted is
        assert _read(f"{nats_url}/{name}/{name}.a", 5, 31) == [("gap", 5, 20), 21, 23, 25, 27, 29]
        assert _read(f"{nats_url}/{name}/{name}.a", 21, 31) == [21, 23, 25, 27, 29]


def test_a_message_deleted_by_itself_is_no_gap(nats_url: str) -> None:
    with made_streams(nats_url, "FX5") as make:
        name = make()
        _publish(nats_url, [f"{name}.x"], 10)

        async def delete(js: Any) -> None:
            await js.delete_msg(name, 5)

        js_call(nats_url, delete)
        assert _read(f"{nats_url}/{name}", 1, 11) == [1, 2, 3, 4, 6, 7, 8, 9, 10]


def test_a_group_committed_below_the_first_sequence_says_gap(nats_url: str, tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    with made_streams(nats_url, "FX5") as make:
        name = make(max_msgs=10)
        url = f"{nats_url}/{name}"
        _publish(nats_url, [f"{name}.x"], 5)
        r = run_rq("replay", url, "--group", "g", "--commit", "-q", "--format", "raw", env=env)
        assert r.returncode == 0, r.stderr  # the group is at 6
        _publish(nats_url, [f"{name}.x"], 20)  # 6..25; max_msgs keeps 16..25
        r = run_rq("replay", url, "--group", "g", "--commit", "--json", env=env)
        assert r.returncode == 0, r.stderr
        lines = [json.loads(x) for x in r.stdout.decode().splitlines() if x.strip()]
        gaps = [x for x in lines if x.get("event") == "gap"]
        assert gaps == [{"event": "gap", "topic": url, "first": 6, "last": 15, "reason": "retention"}], lines
        assert lines[0] == gaps[0]  # before the records after it
        assert [x["offset"] for x in lines if x.get("event") is None] == list(range(16, 26))
        assert "offsets 6..15 aged out (retention) before they were read" in r.stderr.decode()
