"""jx: a JetStream API request that timed out on a connection that was up (nats-py's TimeoutError,
an OSError with no errno) left the library as itself and the CLI said exit 1 "nats: timeout". The
stream info, a group's consumer info, and the listings rq makes (the consumer list behind
`rq offsets`' groups, the stream list behind a sink's routing check) now say the server is lost
(SourceUnreachable, exit 6), naming the server and the request. A nats-server of the test's own,
SIGSTOPped; the JetStream request timeout lowered to 0.3 s."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from jskit import freeze, own_nats_process
from rqtest import js_call

from topics.errors import SourceUnreachable
from topics.sources.jetstream import JetStreamSource
from topics.sources.open import parse_topic

pytestmark = pytest.mark.integration


@contextmanager
def stalled(tmp_path: Path, ports: range) -> Iterator[tuple[str, JetStreamSource]]:
    """A source on stream JXTO of a server of the test's own, opened, then the server frozen."""
    with own_nats_process(tmp_path, ports) as (url, proc):

        async def add(js: object) -> None:
            await js.add_stream(name="JXTO", subjects=["jxto.x"])  # type: ignore[attr-defined]

        js_call(url, add)
        source = JetStreamSource(parse_topic(f"{url}/JXTO", Path(".")))
        try:
            assert source.groups() == []  # answered while the server runs
            source.conn.js._timeout = 0.3
            freeze(proc)
            yield url.removeprefix("nats://"), source
        finally:
            proc.send_signal(signal.SIGCONT)
            source.close()


def test_a_stalled_server_is_lost_not_a_bare_timeout(tmp_path: Path) -> None:
    with stalled(tmp_path, range(23350, 23400)) as (where, source):
        with pytest.raises(SourceUnreachable, match=rf"lost the NATS server at {where}: no answer to "):
            source.conn.stream_info()  # was nats.errors.TimeoutError
        with pytest.raises(SourceUnreachable, match=r"no answer to \$JS\.API\.CONSUMER\.INFO\.JXTO\."):
            source.committed("g")


def test_listings_of_a_stalled_server_say_it_is_lost(tmp_path: Path) -> None:
    with stalled(tmp_path, range(19720, 19760)) as (_, source):
        with pytest.raises(SourceUnreachable, match=r"no answer to \$JS\.API\.CONSUMER\.LIST\.JXTO "):
            source.groups()  # was nats.errors.TimeoutError
        with pytest.raises(SourceUnreachable, match=r"no answer to \$JS\.API\.STREAM\.LIST "):
            source._streams()
