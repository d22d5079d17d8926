"""jx: `rq tail -f --timeout T` of a stream deleted while it followed ended after T s with a clean
done line, exit 0, as if the stream had gone idle (without --timeout: exit 3). The idle --timeout
now ends a follow only once the server says its consumer is still there; a stream gone is exit 3.
Real server."""

from __future__ import annotations

from typing import Any

import pytest
from jskit import made_streams
from rqtest import js_call, popen_rq_with, run_rq, wait_or_fail

pytestmark = pytest.mark.integration


def test_a_follow_of_a_deleted_stream_is_not_ended_as_idle(nats_url: str) -> None:
    with made_streams(nats_url, "JXDEL") as make:
        name = make()
        url = f"{nats_url}/{name}"
        assert run_rq("produce", f"{url}/{name}.x", input=b"one\n").returncode == 0
        proc = popen_rq_with("", "tail", url, "-n", "1", "-f", "--timeout", "1", "--format", "raw")
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"one\n"  # following: its consumer is there

        async def drop(js: Any) -> None:
            await js.delete_stream(name)

        js_call(nats_url, drop)
        code = wait_or_fail(proc, 30, "a follow of a deleted stream")  # it writes no more records
        err = proc.stderr.read() if proc.stderr else b""
        assert code == 3, err  # was 0
        assert b"does not exist" in err, err
