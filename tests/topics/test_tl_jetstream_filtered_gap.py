"""A gap under a JetStream subject filter claimed a number it could not know: a group reading
EV.a, committed at 6, on a stream whose max_msgs had deleted sequences 6..20 (all of them EV.b
messages) was told `offsets 6..20 aged out (retention) before they were read` and a gap event
that reads as 15 lost records, where none of EV.a was lost. The stream keeps no record of a
deleted message's subject, so rq now says the count is not known (`"records": null` and a
warning naming stream sequences and the subject); a filter that takes every subject of the
stream still tells an exact gap, as the whole stream does. Real server, deterministic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import js_call, run_rq

pytestmark = pytest.mark.integration


def _publish(nats_url: str, subject: str, times: int) -> None:
    async def fill(js: Any) -> None:
        for i in range(times):
            await js.publish(subject, b"%d" % i)

    js_call(nats_url, fill)


def _replay(url: str, env: dict[str, str]) -> tuple[list[dict], list[int], str]:
    r = run_rq("replay", url, "--group", "g", "--commit", "--json", env=env)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.decode().splitlines() if x.strip()]
    gaps = [x for x in lines if x.get("event") == "gap"]
    return gaps, [x["offset"] for x in lines if x.get("event") is None], r.stderr.decode()


def test_a_gap_under_a_narrower_filter_says_its_count_is_not_known(nats_url: str, tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    with made_streams(nats_url, "TLGAP") as make:
        name = make(subjects=["{name}.*"], max_msgs=10)
        url = f"{nats_url}/{name}/{name}.a"
        _publish(nats_url, f"{name}.a", 5)  # 1..5
        assert _replay(url, env)[1] == [1, 2, 3, 4, 5]  # the group is at 6
        _publish(nats_url, f"{name}.b", 15)  # 6..20: none of them on .a
        _publish(nats_url, f"{name}.a", 5)  # 21..25; max_msgs keeps 16..25, 6..15 deleted
        gaps, offsets, err = _replay(url, env)
        assert offsets == [21, 22, 23, 24, 25]
        assert gaps == [
            {"event": "gap", "topic": url, "first": 6, "last": 15, "reason": "retention", "records": None}
        ]
        assert "offsets 6..15 aged out" not in err  # was: claimed as ten of the topic's records
        assert "stream sequences 6..15 were deleted" in err and f"on {name}.a is not known" in err


def test_a_filter_taking_the_whole_stream_still_counts(nats_url: str, tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    with made_streams(nats_url, "TLGAP") as make:
        name = make(max_msgs=10)  # takes only {name}.x
        url = f"{nats_url}/{name}/{name}.x"
        _publish(nats_url, f"{name}.x", 5)
        assert _replay(url, env)[1] == [1, 2, 3, 4, 5]
        _publish(nats_url, f"{name}.x", 20)  # 6..25; 16..25 kept
        gaps, offsets, err = _replay(url, env)
        assert offsets == list(range(16, 26))
        assert gaps == [{"event": "gap", "topic": url, "first": 6, "last": 15, "reason": "retention"}]
        assert "offsets 6..15 aged out (retention) before they were read" in err


def test_covers() -> None:
    from topics.sources.jetstream import _covers

    assert _covers("a.x", "a.x") and _covers("a.*", "a.x") and _covers("a.>", "a.*")
    assert _covers("a.>", "a.>") and _covers("a.*", "a.*") and _covers(">", "a.b.c")
    assert not _covers("a.x", "a.*") and not _covers("a.*", "a.>") and not _covers("a.*", "a.b.c")
    assert not _covers("a.b", "a") and not _covers("b.>", "a.x")
