"""tq: on a JetStream stream with limits, head messages a client deleted (`js.delete_msg`) were
told as a `retention` gap although no limit could have removed them (10 messages on a stream
that keeps 1000). A count limit of N removes sequence s only once s + N is stored, and `discard:
new` removes nothing old: the gap is now `deleted`. Where a limit may have acted it stays
`retention`. Real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import run_rq
from test_tp_jetstream_deleted_head import _publish

from topics.sources.jetstream import _gap_reason

pytestmark = pytest.mark.integration


def _group_read(url: str, tmp_path: Path) -> tuple[list[dict], str]:
    r = run_rq("replay", url, "--group", "g", "--commit", "--json", env={"RQ_TOPICS_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.decode().splitlines() if x.strip()]
    return [x for x in lines if x.get("event") == "gap"], r.stderr.decode()


@pytest.mark.parametrize("limits", [{"max_msgs": 1000}, {"max_msgs_per_subject": 100}])
def test_deleted_head_under_unreached_count_limit_is_deleted(
    nats_url: str, tmp_path: Path, limits: dict[str, int]
) -> None:
    with made_streams(nats_url, "TQDEL") as make:
        name = make(**limits)
        url = f"{nats_url}/{name}"
        _publish(nats_url, name, 1)
        assert _group_read(url, tmp_path)[0] == []  # the group is at 2
        _publish(nats_url, name, 5, deleted=(1, 2, 3, 4))  # 2..6 stored; 5 is first
        gaps, err = _group_read(url, tmp_path)
        assert [(g["first"], g["last"], g["reason"]) for g in gaps] == [(2, 4, "deleted")], err
        assert "retention" not in err, err  # was: offsets 2..4 aged out (retention)


def test_reason_follows_what_the_limits_can_do() -> None:
    from nats.js.api import DiscardPolicy, StreamConfig

    def reason(last_seq: int, **config: Any) -> str:
        return _gap_reason(StreamConfig(name="s", **config), 3, last_seq)

    assert reason(6, max_msgs=3) == "retention"  # 3 + 3 stored: the limit reached sequence 3
    assert reason(5, max_msgs=3) == "deleted"
    assert reason(600, max_msgs=3, discard=DiscardPolicy.NEW) == "deleted"  # refuses new instead
    assert reason(5, max_bytes=100) == "retention"  # a size limit may have: not told apart
    assert reason(5, max_bytes=100, discard=DiscardPolicy.NEW) == "deleted"
    assert reason(5, max_age=60.0) == "retention"
    assert reason(5) == "deleted"
