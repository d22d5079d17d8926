"""jx: after a NATS connection that was up is lost (the server killed mid-follow) or a tls://
URL reaches a server that does not do TLS, the error line ended with "— is the server running and
the URL right?", a hint only for a server that could not be reached at all. Those paths now raise
ConnectionLost (exit 6, no hint), as MQTT's do; a refused connection keeps the hint. Own servers."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from jskit import own_nats_process, own_nats_server
from rqtest import js_call, popen_rq_with, run_rq, wait_or_fail

from rqcli.exitcodes import ExitCode

pytestmark = pytest.mark.integration

HINT = "is the server running"


def test_a_server_killed_mid_follow_is_lost_without_the_hint(tmp_path: Path) -> None:
    with own_nats_process(tmp_path, range(23300, 23350)) as (url, proc):

        async def add(js: object) -> None:
            await js.add_stream(name="JXK", subjects=["jxk.x"])  # type: ignore[attr-defined]

        js_call(url, add)
        assert run_rq("produce", f"{url}/JXK/jxk.x", input=b"one\n").returncode == 0
        rq = popen_rq_with("", "tail", f"{url}/JXK", "-n", "1", "-f", "--format", "raw")
        assert rq.stdout is not None and rq.stderr is not None
        assert rq.stdout.readline() == b"one\n"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        code = wait_or_fail(rq, 30, "a follow of a killed server")
        err = rq.stderr.read().decode().strip()
    assert code == ExitCode.UNREACHABLE, err
    assert HINT not in err, err  # was: "… closed the connection — is the server running …"
    assert url.removeprefix("nats://") in err, err


def test_tls_to_a_plain_server_is_said_without_the_hint(tmp_path: Path) -> None:
    with own_nats_server(tmp_path, range(23300, 23350)) as url:
        r = run_rq("tail", url.replace("nats://", "tls://") + "/S", "-n", "1")
        refused = run_rq("tail", "nats://127.0.0.1:1/S", "-n", "1")
    err = r.stderr.decode().strip()
    assert r.returncode == ExitCode.UNREACHABLE, err
    assert HINT not in err, err
    assert refused.returncode == ExitCode.UNREACHABLE and HINT in refused.stderr.decode()
