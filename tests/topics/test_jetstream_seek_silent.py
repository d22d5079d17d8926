"""A seek by time (`rq replay nats://… --from @T`) whose consumer says the stream holds records
from T on but delivers none in time. The old code let asyncio's bare TimeoutError out: "rq:
error: unexpected TimeoutError:  (run with -v for the traceback)", exit 1. It is now one line that
says what the server failed to do, exit 6 (unreachable: a re-run may get an answer)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from jskit import made_streams, produce
from rqtest import popen_rq_with, wait_or_fail

from rqcli.exitcodes import ExitCode

pytestmark = pytest.mark.integration

# the seek's wait for its first delivery never sees one (what a server too busy to deliver does)
_SILENT = """
import topics.sources.jetstream as js
async def _never(got, timeout):
    return False
js._delivered = _never
"""


def test_a_seek_that_gets_no_record_is_one_line(nats_url: str, tmp_path: Path) -> None:
    with made_streams(nats_url, "seeksilent") as make:
        name = make()
        url = f"{nats_url}/{name}/{name}.x"
        produce(url, b"a\nb\nc\n")
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
        proc = popen_rq_with(
            _SILENT,
            "--json",
            "replay",
            f"{nats_url}/{name}",
            "--from",
            f"@{since}",
            env={"RQ_TOPICS_DIR": str(tmp_path)},
        )
        code = wait_or_fail(proc, 60, "rq replay still running after 60 s")
        out, err = proc.communicate()
        lines = err.decode().strip().splitlines()
        assert code == ExitCode.UNREACHABLE, err
        assert len(lines) == 1, err
        assert "TimeoutError" not in lines[0], lines[0]  # was: unexpected TimeoutError, exit 1
        assert f"stream {name} holds records from" in lines[0] and "delivered none" in lines[0], lines[0]
        done = [json.loads(x) for x in out.decode().splitlines() if '"done"' in x]
        assert not [json.loads(x) for x in out.decode().splitlines() if '"offset"' in x]
        assert done == [] or done[-1].get("records") == 0, out


# whatever let a bare TimeoutError out (an OSError with no text), it must not print "rq: error: "
_BARE = """
import topics.sources.jetstream as js
async def _bare(got, timeout):
    raise TimeoutError()
js._delivered = _bare
"""


def test_a_bare_timeout_error_still_says_something(nats_url: str, tmp_path: Path) -> None:
    with made_streams(nats_url, "seekbare") as make:
        name = make()
        produce(f"{nats_url}/{name}/{name}.x", b"a\n")
        proc = popen_rq_with(
            _BARE,
            "replay",
            f"{nats_url}/{name}",
            "--from",
            "@2026-01-01T00:00:00Z",
            env={"RQ_TOPICS_DIR": str(tmp_path)},
        )
        wait_or_fail(proc, 60, "rq replay still running after 60 s")
        err = proc.communicate()[1].decode().strip()
        assert err == "rq: error: unexpected TimeoutError (run with -v for the traceback)", (
            err
        )  # was "rq: error:"
        assert proc.returncode == ExitCode.FAILURE
