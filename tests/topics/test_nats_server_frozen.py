"""A NATS server that goes silent under a follow (SIGSTOP of a nats-server of the test's own: the
connection stays open, nothing comes over it). The old reader asked for consumer heartbeats but
never looked at them and never PINGed: `rq tail -f` waited on for ever, and `--timeout S` ended
with exit 0 and a normal done line as if the stream had only been quiet. Now a silence (missed
heartbeats, or the --timeout) is checked with a PING: no PONG is exit 6 with one line, and the
--json done line still comes last, carrying the error."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from jskit import freeze, own_nats_process, produce
from rqtest import popen_rq, popen_rq_with, read_lines, wait_or_fail

from rqcli.exitcodes import ExitCode

_PORTS = range(23100, 23150)


@pytest.fixture
def frozen_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with own_nats_process(tmp_path, _PORTS) as (url, proc):
        produce(f"{url}/FZ/FZ.x", b"1\n2\n3\n")
        yield f"{url}/FZ/FZ.x", proc


def _ends_lost(rq: subprocess.Popen[bytes], records: int) -> None:
    rc = wait_or_fail(rq, 60, "rq still waits on a frozen server a minute later")
    assert rq.stdout is not None and rq.stderr is not None
    err = rq.stderr.read().decode()
    rest = rq.stdout.read().decode().splitlines()
    assert rc == ExitCode.UNREACHABLE, err
    assert len(err.strip().splitlines()) == 1 and "lost the NATS server at 127.0.0.1:" in err, err
    done = json.loads(rest[-1])  # the done line, last, saying what stopped the read
    assert done["event"] == "done" and done["records"] == records
    assert "lost the NATS server" in done["error"]


_FAST_HEARTBEAT = "import topics.sources.natswire as w; w.HEARTBEAT_S = 1.0"


def test_a_follow_with_timeout_on_a_frozen_server_is_exit_6_not_a_quiet_end(
    frozen_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, server = frozen_server
    rq = popen_rq("replay", url, "--from", "start", "-f", "--timeout", "1", "--format", "raw", "--json")
    read_lines(rq, [b"1", b"2", b"3"])
    freeze(server)
    _ends_lost(rq, 3)


def test_a_follow_without_timeout_notices_the_missed_heartbeats(
    frozen_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, server = frozen_server
    # heartbeats every 1 s instead of 5 (the server takes any interval): the same path, a third of the wait
    rq = popen_rq_with(_FAST_HEARTBEAT, "tail", url, "-f", "--format", "raw", "--json")
    read_lines(rq, [b"1", b"2", b"3"])
    freeze(server)
    _ends_lost(rq, 3)
