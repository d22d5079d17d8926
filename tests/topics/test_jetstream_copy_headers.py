"""Copying JetStream records into JetStream: the control headers a stored message carries, and a
publish the server refuses.

A stream that sources another stores each message with the server-set header Nats-Stream-Source,
and a producer's conditional publish keeps its Nats-Expected-* headers in the stream. Publishing
those again was refused by the server (400), and rq said the server was unreachable (exit 6). A
refused core publish in the middle of a batch was lost without a word."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import js_call, run_rq


@pytest.fixture
def streams(nats_url: str) -> Iterator[tuple[str, str, str]]:
    """ORIG (subjects ORIG.>), AGG sourcing ORIG, ANY (subjects ANY.>), ANY2 (ANY2.>); deleted
    afterwards."""
    from nats.js.api import StreamSource

    base = f"h-copyhdr-{uuid.uuid4().hex[:8]}"
    orig, agg, other = f"{base}-orig", f"{base}-agg", f"{base}-any"

    async def make(js: Any) -> None:
        await js.add_stream(name=orig, subjects=[f"{orig}.>"])
        await js.add_stream(name=agg, sources=[StreamSource(name=orig)])
        for name in (other, f"{other}2"):
            await js.add_stream(name=name, subjects=[f"{name}.>"])
        for n in range(3):
            hdrs = {"user": f"u{n}", "Nats-Expected-Stream": orig, "Nats-Msg-Id": f"id-{n}"}
            await js.publish(f"{orig}.n", b'{"n": %d}' % n, headers=hdrs)

    js_call(nats_url, make)
    yield orig, agg, other

    async def drop(js: Any) -> None:
        for name in (agg, orig, other, f"{other}2"):
            try:
                await js.delete_stream(name)
            except Exception:
                pass

    js_call(nats_url, drop)


def _records(nats_url: str, topic: str, env: dict[str, str]) -> list[dict[str, Any]]:
    r = run_rq("replay", f"{nats_url}/{topic}", "--from", "start", "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.mark.integration
def test_a_sourced_stream_copies_with_its_data_and_user_headers(
    nats_url: str, streams: tuple[str, str, str], tmp_path: Path
) -> None:
    orig, agg, other = streams
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    # the server waits a moment before it sources: the copy needs all three in AGG
    for _ in range(50):
        if len(_records(nats_url, agg, env)) == 3:
            break
    held = _records(nats_url, agg, env)
    assert all("Nats-Stream-Source" in rec["headers"] for rec in held), held

    # sourced (Nats-Stream-Source), conditional (Nats-Expected-Stream); two targets, as the Msg-Ids
    # repeat and a stream's dedup window would keep only the first copy
    for source, into in ((agg, other), (orig, f"{other}2")):
        target = f"{into}/{into}.copy"
        r = run_rq("replay", f"{nats_url}/{source}", "--to-topic", f"{nats_url}/{target}", env=env)
        assert r.returncode == 0, r.stderr
        copied = _records(nats_url, target, env)
        assert [rec["value"] for rec in copied] == [{"n": 0}, {"n": 1}, {"n": 2}]
        # data and user headers kept (Nats-Msg-Id too: it is for the target's dedup window)
        assert [rec["headers"] for rec in copied] == [
            {"user": f"u{n}", "Nats-Msg-Id": f"id-{n}"} for n in range(3)
        ]


@pytest.mark.integration
def test_a_publish_the_server_refuses_is_a_refusal_and_never_lost_in_a_batch(
    nats_url: str, streams: tuple[str, str, str], tmp_path: Path
) -> None:
    """ANY allows neither per-message TTLs nor rollups. The first record of the batch asks for a TTL:
    it was a core publish, refused without a word, and produce acked both records (exit 0). The
    last one asks for a rollup: exit 6 'is the server running'."""
    _, _, other = streams
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    url = f"{nats_url}/{other}/{other}.p"
    for lines, index in (
        (['{"value": "a", "headers": {"Nats-TTL": "5"}}', '{"value": "b"}'], 1),
        (['{"value": "c"}', '{"value": "d", "headers": {"Nats-Rollup": "all"}}'], 2),
    ):
        r = run_rq("produce", url, "--format", "json", input="\n".join(lines).encode() + b"\n", env=env)
        assert r.returncode == 1, r.stderr
        err = r.stderr.decode().strip()
        assert len(err.splitlines()) == 1 and "is the server running" not in err, err
        assert f"refused record {index} of the input" in err and "Nats-" in err, err
    values = [rec["value"] for rec in _records(nats_url, f"{other}/{other}.p", env)]
    # nothing the server refused, nothing else lost; b, sent after the refused a, was removed
    # again (the stream holds exactly the records before a refusal)
    assert values == ["c"], values
