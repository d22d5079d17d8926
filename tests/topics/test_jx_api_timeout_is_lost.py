"""jx: a JetStream API request that timed out on a connection that was up (nats-py's TimeoutError,
an OSError with no errno) left the library as itself and the CLI said exit 1 "nats: timeout". The
stream info and a group's consumer info now say the server is lost (SourceUnreachable, exit 6),
naming the server and the request. A nats-server of the test's own, SIGSTOPped; the JetStream
request timeout lowered to 0.3 s."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from jskit import own_nats_process
from rqtest import js_call

from topics.errors import SourceUnreachable
from topics.sources.jetstream import JetStreamSource
from topics.sources.open import parse_topic

pytestmark = pytest.mark.integration


def test_a_stalled_server_is_lost_not_a_bare_timeout(tmp_path: Path) -> None:
    with own_nats_process(tmp_path, range(23350, 23400)) as (url, proc):

        async def add(js: object) -> None:
            await js.add_stream(name="JXTO", subjects=["jxto.x"])  # type: ignore[attr-defined]

        js_call(url, add)
        source = JetStreamSource(parse_topic(f"{url}/JXTO", Path(".")))
        try:
            source.conn.js._timeout = 0.3
            proc.send_signal(signal.SIGSTOP)
            where = url.removeprefix("nats://")
            with pytest.raises(SourceUnreachable, match=rf"lost the NATS server at {where}: no answer to "):
                source.conn.stream_info()  # was nats.errors.TimeoutError
            with pytest.raises(SourceUnreachable, match=r"no answer to \$JS\.API\.CONSUMER\.INFO\.JXTO\."):
                source.committed("g")
        finally:
            proc.send_signal(signal.SIGCONT)
            source.close()
