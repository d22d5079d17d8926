"""JetStream missing for rq, and a server -ERR on rq's own connection, against real nats-servers
started here (accounts need a config file; the shared server is never touched).

On the old code a user of an account without JetStream, on a server that runs it, read "JetStream
is not enabled on this NATS server — is the server running and the URL right?", and a -ERR the
server sent on rq's connection (here 'maximum subscriptions exceeded', an account limit) was
"NATS error: …", exit 6 "unreachable", though the server had answered."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import run_rq

from rqcli.exitcodes import ExitCode

_CONF = """
listen: 127.0.0.1:{port}
jetstream {{ store_dir: "{store}" }}
accounts {{
  JS: {{ jetstream: enabled, users: [{{user: a, password: pa}}] }}
  NOJS: {{ users: [{{user: b, password: pb}}] }}
  LIM: {{ jetstream: enabled, limits: {{max_subs: 1}}, users: [{{user: c, password: pc}}] }}
}}
"""


def _free_port() -> int:
    """A free port in 23100-23199 (the range this file's servers may use)."""
    for port in range(23100, 23200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise RuntimeError("no free port in 23100-23199")


def _wait_for(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """host:port of a nats-server with three accounts: JS (JetStream), NOJS (none), LIM (JetStream,
    at most one subscription per connection)."""
    binary = shutil.which("nats-server") or str(Path(__file__).parents[2] / ".venv/bin/nats-server")
    port = _free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(_CONF.format(port=port, store=tmp_path / "js"))
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(port)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.integration
def test_an_account_without_jetstream_is_named_not_the_server(server: str, tmp_path: Path) -> None:
    r = run_rq("replay", f"nats://b:pb@{server}/S", env={"RQ_TOPICS_DIR": str(tmp_path)})
    assert r.returncode == ExitCode.UNREACHABLE, r.stderr
    err = r.stderr.decode().strip()
    assert len(err.splitlines()) == 1, err
    assert "JetStream not enabled for account" in err and "connected as user 'b'" in err, err
    assert "is the server running" not in err, (
        err
    )  # was: "not enabled on this NATS server — is the server running"


@pytest.mark.integration
def test_a_server_error_on_rqs_connection_is_a_failure_not_unreachable(server: str, tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", f"nats://c:pc@{server}/LS/LS.x", input=b"a\nb\n", env=env).returncode == 0
    r = run_rq("replay", f"nats://c:pc@{server}/LS", "--format", "raw", env=env)
    err = r.stderr.decode().strip()
    assert r.returncode == ExitCode.FAILURE, err  # was: 6, "NATS error: -ERR …"
    assert f"NATS at {server} answered rq's request with an error" in err, err
    assert "maximum subscriptions exceeded" in err.lower(), err


@pytest.mark.integration
def test_a_server_without_jetstream_says_so(tmp_path: Path) -> None:
    """A control: a server started without -js is still 'not enabled on the server', exit 6."""
    binary = shutil.which("nats-server") or str(Path(__file__).parents[2] / ".venv/bin/nats-server")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_for(port)
        r = run_rq("replay", f"nats://127.0.0.1:{port}/S", env={"RQ_TOPICS_DIR": str(tmp_path)})
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert r.returncode == ExitCode.UNREACHABLE, r.stderr
    assert b"not enabled" in r.stderr, r.stderr
