"""A JetStream sink whose URL names a stream that does not capture the subject: the server stores
the publishes in whichever stream does, and its answers carry that stream's sequences. Real
nats-server streams (the lead's server).

On the old code rq produce into a stream that only sources another (no subjects of its own), while
a third stream captured its name as a subject (max_msg_size 200), had a 300-byte record refused
there, then deleted the sequences that stream gave the records after it (2, 3, 4) from the URL's
stream: another producer's records, sourced in; rq's own stayed in the capturing stream."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jskit import MakeStream, made_streams
from rqtest import js_call, run_rq

from topics.errors import PublishedElsewhere
from topics.sources import open_sink, parse_topic

_INPUT = b"a\n" + b"B" * 300 + b"\nc\nd\ne\n"


@pytest.fixture
def stream(nats_url: str) -> Iterator[MakeStream]:
    with made_streams(nats_url, "h-elsewhere") as make:
        yield make


def _held(nats_url: str, name: str) -> list[tuple[int, bytes]]:
    """(sequence, data) of every message the stream holds."""

    async def go(js: Any) -> list[tuple[int, bytes]]:
        import nats.js.errors

        state = (await js.stream_info(name)).state
        out = []
        for seq in range(state.first_seq or 1, (state.last_seq or 0) + 1):
            try:
                out.append((seq, (await js.get_msg(name, seq)).data or b""))
            except nats.js.errors.NotFoundError:
                pass
        return out

    return list(js_call(nats_url, go))


def _publish(nats_url: str, subject: str, count: int) -> None:
    async def go(js: Any) -> None:
        for i in range(count):
            await js.publish(subject, f"other-producer-{i}".encode())

    js_call(nats_url, go)


def _others(count: int) -> list[tuple[int, bytes]]:
    return [(i + 1, f"other-producer-{i}".encode()) for i in range(count)]


@pytest.mark.integration
def test_produce_into_a_stream_that_only_sources_others_is_refused(nats_url: str, stream: Any) -> None:
    """The reviewer's setup: AGG sources X and has no subjects, CAP captures the subject AGG.
    rq produce nats://…/AGG is refused before anything is sent (exit 2, one line naming CAP);
    AGG keeps the other producer's six records, CAP stores nothing."""
    from nats.js.api import StreamSource

    x = stream(["{name}.>"])
    _publish(nats_url, f"{x}.a", 6)
    agg = stream([], sources=[StreamSource(name=x)])
    cap = stream([agg], max_msg_size=200)
    deadline = time.monotonic() + 10
    while len(_held(nats_url, agg)) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _held(nats_url, agg) == _others(6)

    r = run_rq("produce", f"{nats_url}/{agg}", input=_INPUT)
    err = r.stderr.decode()
    assert _held(nats_url, agg) == _others(6), err
    assert _held(nats_url, cap) == []
    assert r.returncode == 2, err
    assert err.count("\n") == 1 and f"stream {agg} takes no publishes (it sources {x}" in err, err
    assert f"is stored in stream {cap}" in err, err


@pytest.mark.integration
def test_produce_into_a_mirror_is_refused(nats_url: str, stream: Any) -> None:
    """A mirror takes no publishes, and nothing captures its name: refused up front, not a
    10-second wait for an answer that reads like an outage."""
    from nats.js.api import StreamSource

    origin = stream()
    mirror = stream([], mirror=StreamSource(name=origin))
    r = run_rq("produce", f"{nats_url}/{mirror}", input=b"a\n")
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert f"stream {mirror} takes no publishes (it mirrors {origin}" in err and "reaches no stream" in err, (
        err
    )


@pytest.mark.integration
def test_answers_from_another_stream_stop_the_append_and_remove_nothing(
    nats_url: str, stream: Any, tmp_path: Path
) -> None:
    """The URL's stream S took the subject when the sink opened; then S gave it up and CAP
    (max_msg_size 200) took it. The first answer names CAP: the append stops there with
    PublishedElsewhere, and nothing is deleted anywhere: S keeps its own six records (the old code
    deleted S's sequences 2-4, the ones CAP gave c, d, e), CAP keeps what it stored."""
    s = stream()
    _publish(nats_url, f"{s}.x", 6)
    sink = open_sink(parse_topic(f"{nats_url}/{s}/{s}.x", tmp_path))
    try:

        async def move(js: Any) -> None:
            config = (await js.stream_info(s)).config
            config.subjects = [f"{s}.y"]
            await js.update_stream(config)

        js_call(nats_url, move)
        cap = stream([f"{s}.x"], max_msg_size=200)
        with pytest.raises(PublishedElsewhere) as raised:
            sink.append([(None, None, (), v) for v in _INPUT.splitlines()])
    finally:
        sink.close()
    e = raised.value
    assert (e.index, e.at, e.other, e.stored_before, e.appended.stored) == (0, 0, cap, 0, 0)
    assert f"in stream {cap}, not in stream {s}" in str(e) and "removes nothing" in str(e), e
    assert _held(nats_url, s) == _others(6)
    assert [v for _, v in _held(nats_url, cap)][:1] == [b"a"]
