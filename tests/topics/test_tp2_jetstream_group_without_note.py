"""A JetStream group committed by an older rq (its consumer has no "rq.committed" metadata note)
(tp2): after a purge over its position it still reads (no crash, nothing delivered twice, the
records still there all read), and the first commit by this rq writes the note, so the next purge
is told as a gap. Real server."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import js_call, run_rq
from test_tp_jetstream_deleted_head import _publish

pytestmark = pytest.mark.integration


def _group_read(url: str, tmp_path: Path) -> tuple[list[dict], list[int]]:
    r = run_rq("replay", url, "--group", "g", "--commit", "--json", env={"RQ_TOPICS_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.decode().splitlines() if x.strip()]
    return [x for x in lines if x.get("event") == "gap"], [
        x["offset"] for x in lines if x.get("event") is None
    ]


def _metadata(nats_url: str, name: str) -> dict[str, str]:
    async def get(js: Any) -> dict[str, str]:
        return dict((await js.consumer_info(name, "g")).config.metadata or {})

    result: dict[str, str] = js_call(nats_url, get)
    return result


def _strip_note(nats_url: str, name: str) -> None:
    async def strip(js: Any) -> None:  # what an older rq left: no note
        config = (await js.consumer_info(name, "g")).config
        meta = {k: v for k, v in (config.metadata or {}).items() if k != "rq.committed"}
        await js.add_consumer(name, dataclasses.replace(config, metadata=meta))

    js_call(nats_url, strip)


def test_a_group_without_the_note_reads_after_a_purge_and_gets_the_note(
    nats_url: str, tmp_path: Path
) -> None:
    with made_streams(nats_url, "TP2NN") as make:
        name = make()
        url = f"{nats_url}/{name}"
        _publish(nats_url, name, 3)
        assert _group_read(url, tmp_path)[1] == [1, 2, 3]  # the group is at 4
        _strip_note(nats_url, name)
        assert "rq.committed" not in _metadata(nats_url, name)
        _publish(nats_url, name, 7)  # 4..10

        async def purge(js: Any) -> None:
            await js.purge_stream(name, seq=8)  # keeps 8..10

        js_call(nats_url, purge)
        gaps, offsets = _group_read(url, tmp_path)
        assert offsets == [8, 9, 10], gaps  # no crash, nothing twice, nothing still there skipped
        assert _metadata(nats_url, name).get("rq.committed") == "11"  # this rq's commit noted it
        _publish(nats_url, name, 4)  # 11..14

        async def purge_again(js: Any) -> None:
            await js.purge_stream(name, seq=13)  # keeps 13..14

        js_call(nats_url, purge_again)
        gaps, offsets = _group_read(url, tmp_path)
        assert [(g["first"], g["last"]) for g in gaps] == [(11, 12)]  # told now: the note is there
        assert offsets == [13, 14]
