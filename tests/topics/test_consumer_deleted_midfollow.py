"""The ephemeral consumer of a follow goes away under it while the server stays up (deleted by an
operator, lost in a restart of its stream's leader): its heartbeats stop, the server still answers
a PING. rq re-creates the consumer after the last record read, as nats-py's ordered consumer
resets, and the follow goes on with the records published meanwhile: none skipped, none twice.
Real nats-server (the lead's); takes the two missed heartbeats (~10 s) before rq checks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from jskit import MakeStream, made_streams, produce
from rqtest import js_call, popen_rq_with, read_lines, wait_or_fail


@pytest.fixture
def stream(nats_url: str) -> Iterator[MakeStream]:
    with made_streams(nats_url, "h-consgone") as make:
        yield make


def _delete_consumers(nats_url: str, name: str) -> list[str]:
    """Deletes every consumer of the stream (the follow's ephemeral one); returns their names."""

    async def go(js: Any) -> list[str]:
        names = [i.name for i in await js.consumers_info(name)]
        for consumer in names:
            await js.delete_consumer(name, consumer)
        return names

    return list(js_call(nats_url, go))


@pytest.mark.integration
def test_a_follow_whose_consumer_was_deleted_goes_on_after_the_last_record(
    nats_url: str, stream: Any
) -> None:
    name = stream()
    url = f"{nats_url}/{name}/{name}.x"
    produce(url, b"1\n2\n3\n")
    # heartbeats every 1 s instead of 5: the same re-creation path, a fifth of the wait
    rq = popen_rq_with(
        "import topics.sources.natswire as w; w.HEARTBEAT_S = 1.0",
        "replay", url, "--from", "start", "-f", "--count", "6", "--format", "raw", "--json",
    )  # fmt: skip
    try:
        read_lines(rq, [b"1", b"2", b"3"])
        assert len(_delete_consumers(nats_url, name)) == 1
        produce(url, b"4\n5\n6\n")
        rc = wait_or_fail(rq, 60, "rq still follows a minute after its consumer was deleted")
    finally:
        if rq.poll() is None:
            rq.kill()
            rq.wait()
    assert rq.stdout is not None and rq.stderr is not None
    err = rq.stderr.read().decode()
    rest = rq.stdout.read().splitlines()
    assert rc == 0, err
    assert rest[:3] == [b"4", b"5", b"6"], (rest, err)
    done = json.loads(rest[-1])
    assert done["event"] == "done" and done["records"] == 6, done
