"""JetStream: the first messages of a stream deleted by a client (`js.delete_msg`, or a purge),
not by stream limits, were told as a `retention` gap ('offsets 1..3 aged out (retention) before
they were read'). A stream with no limits and the limits policy cannot remove a message itself:
the gap is now `"reason": "deleted"` and the warning says a client deleted them. A stream with
limits keeps `retention` (the server keeps no word of why a sequence went). Real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import js_call, run_rq

pytestmark = pytest.mark.integration


def _publish(nats_url: str, name: str, times: int, deleted: tuple[int, ...] = ()) -> None:
    async def act(js: Any) -> None:
        for i in range(times):
            await js.publish(f"{name}.x", b"%d" % i)
        for seq in deleted:
            await js.delete_msg(name, seq)

    js_call(nats_url, act)


def _replay(url: str, tmp_path: Path) -> tuple[list[dict], list[int], str]:
    """A group replay: read and commit (a group committed below the first sequence is what steps
    over a gap)."""
    r = run_rq("replay", url, "--group", "g", "--commit", "--json", env={"RQ_TOPICS_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.decode().splitlines() if x.strip()]
    gaps = [x for x in lines if x.get("event") == "gap"]
    return gaps, [x["offset"] for x in lines if x.get("event") is None], r.stderr.decode()


def test_head_messages_a_client_deleted_are_not_called_retention(nats_url: str, tmp_path: Path) -> None:
    with made_streams(nats_url, "TPDEL") as make:
        name = make()  # no limits: only a client can remove a message
        url = f"{nats_url}/{name}"
        _publish(nats_url, name, 1)
        assert _replay(url, tmp_path)[1] == [1]  # the group is at 2
        _publish(nats_url, name, 5, deleted=(1, 2, 3, 4))  # 2..6; 1..4 deleted: 5 is first
        gaps, offsets, err = _replay(url, tmp_path)
        assert gaps == [{"event": "gap", "topic": url, "first": 2, "last": 4, "reason": "deleted"}], err
        assert offsets == [5, 6]
        assert "offsets 2..4 were deleted (a client's delete or a purge" in err, err
        assert "retention" not in err, err  # was: offsets 2..4 aged out (retention)


def test_head_messages_of_a_limited_stream_stay_retention(nats_url: str, tmp_path: Path) -> None:
    with made_streams(nats_url, "TPDEL") as make:
        name = make(max_msgs=3)
        url = f"{nats_url}/{name}"
        _publish(nats_url, name, 1)
        assert _replay(url, tmp_path)[1] == [1]
        _publish(nats_url, name, 5)  # 2..6; max_msgs keeps 4..6
        gaps, offsets, err = _replay(url, tmp_path)
        assert [(g["first"], g["last"], g["reason"]) for g in gaps] == [(2, 3, "retention")], err
        assert offsets == [4, 5, 6] and "offsets 2..3 aged out (retention)" in err, err
