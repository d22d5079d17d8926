"""tq: a stream purge moves every consumer's ack floor up to the stream's new first sequence, so a
group left at 4 by rq read on from 8 after `purge(seq=8)` with no gap told: records 4..7 went
without a word (a delete_msg of them, or retention, was told). rq now notes the offset it stores
in the group's consumer metadata, and a group the server moved past that note over sequences no
longer in the stream reads from the note: the gap is told. Real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import js_call, run_rq
from test_tp_jetstream_deleted_head import _publish

pytestmark = pytest.mark.integration


def _group_read(url: str, tmp_path: Path) -> tuple[list[dict], list[int], str]:
    r = run_rq("replay", url, "--group", "g", "--commit", "--json", env={"RQ_TOPICS_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.decode().splitlines() if x.strip()]
    offsets = [x["offset"] for x in lines if x.get("event") is None]
    return [x for x in lines if x.get("event") == "gap"], offsets, r.stderr.decode()


def test_a_purge_over_a_groups_position_is_told_as_a_gap(nats_url: str, tmp_path: Path) -> None:
    with made_streams(nats_url, "TQPRG") as make:
        name = make()
        url = f"{nats_url}/{name}"
        _publish(nats_url, name, 3)
        assert _group_read(url, tmp_path)[1] == [1, 2, 3]  # the group is at 4
        _publish(nats_url, name, 7)  # 4..10

        async def purge(js: Any) -> None:
            await js.purge_stream(name, seq=8)  # keeps 8..10

        js_call(nats_url, purge)
        gaps, offsets, err = _group_read(url, tmp_path)
        assert [(g["first"], g["last"], g["reason"]) for g in gaps] == [(4, 7, "deleted")], err  # was []
        assert offsets == [8, 9, 10]
        assert "offsets 4..7 were deleted (a client's delete or a purge" in err, err
        assert _group_read(url, tmp_path)[:2] == ([], [])  # committed past it: told once


def test_a_group_moved_over_records_still_there_keeps_that_position(nats_url: str, tmp_path: Path) -> None:
    with made_streams(nats_url, "TQPRG") as make:
        name = make()
        url = f"{nats_url}/{name}"
        _publish(nats_url, name, 3)
        assert _group_read(url, tmp_path)[1] == [1, 2, 3]
        _publish(nats_url, name, 4)  # 4..7

        async def moved(js: Any) -> None:  # another application acked 4 and 5
            await js.reset_consumer(name, "g", 6)

        js_call(nats_url, moved)
        gaps, offsets, err = _group_read(url, tmp_path)
        assert (gaps, offsets) == ([], [6, 7]), err


def test_a_stale_note_never_moves_a_group_back(nats_url: str, tmp_path: Path) -> None:
    """The note is rq's position only while the server's is where a purge puts it (the stream's
    first sequence). Another application moved the group past the note (to 9), then records up
    to 7 went: the note (4) is stale, and reading from it delivered 8 again, which the group had
    already consumed, with a gap already told (reviewer dv, with an older rq as the other client
    and retention removing the note's offset)."""
    with made_streams(nats_url, "TQPRG") as make:
        name = make()
        url = f"{nats_url}/{name}"
        _publish(nats_url, name, 3)
        assert _group_read(url, tmp_path)[1] == [1, 2, 3]  # noted 4
        _publish(nats_url, name, 7)  # 4..10

        async def moved_then_purged(js: Any) -> None:
            await js.reset_consumer(name, "g", 9)  # another application consumed up to 8
            await js.purge_stream(name, seq=8)  # keeps 8..10: 4 is gone, the server still at 9

        js_call(nats_url, moved_then_purged)
        gaps, offsets, err = _group_read(url, tmp_path)
        assert (gaps, offsets) == ([], [9, 10]), err  # was a gap 4..7 and 8 delivered again
