"""JetStream missing for rq, and a server -ERR on rq's own connection, against real nats-servers
started here (accounts need a config file; the shared server is never touched).

On the old code a user of an account without JetStream, on a server that runs it, read "JetStream
is not enabled on this NATS server — is the server running and the URL right?", and a -ERR the
server sent on rq's connection (here 'maximum subscriptions exceeded', an account limit) was
"NATS error: …", exit 6 "unreachable", though the server had answered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from jskit import own_nats_server
from rqtest import run_rq

from rqcli.exitcodes import ExitCode

_ACCOUNTS = """
accounts {
  JS: { jetstream: enabled, users: [{user: a, password: pa}] }
  NOJS: { users: [{user: b, password: pb}] }
  LIM: { jetstream: enabled, limits: {max_subs: 1}, users: [{user: c, password: pc}] }
}
"""
_PORTS = range(
    23200, 23300
)  # the range this file's servers may use (test_nats_server_frozen has 23100-23150)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """host:port of a nats-server with three accounts: JS (JetStream), NOJS (none), LIM (JetStream,
    at most one subscription per connection)."""
    with own_nats_server(tmp_path, _PORTS, config=_ACCOUNTS) as url:
        yield url.removeprefix("nats://")


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
    with own_nats_server(tmp_path, _PORTS, jetstream=False) as url:
        r = run_rq("replay", f"{url}/S", env={"RQ_TOPICS_DIR": str(tmp_path / "topics")})
    assert r.returncode == ExitCode.UNREACHABLE, r.stderr
    assert b"not enabled" in r.stderr, r.stderr
