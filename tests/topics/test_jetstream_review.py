"""JetStream review findings, each against a real nats-server: groups past the server's list page,
a server lost during a commit, permissions refused, credentials rq does not read, unencoded user info."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import js_call, popen_rq_with, run_rq
from test_access import _env, _free_port, _nats_server, _one_line, _wait_port
from test_jetstream import make_stream, publish

pytestmark = pytest.mark.integration


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[Any]:
    """start(*flags) -> (port, process) of a private nats-server with JetStream, to kill or to
    configure (test_access's nats_server gives only the port)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*flags: str, port: int = 0) -> tuple[int, subprocess.Popen[bytes]]:
        port = port or _free_port()  # the same port again: the same store
        where = ["-a", "127.0.0.1", "-p", str(port), "-sd", str(tmp_path / f"js{port}")]
        proc = subprocess.Popen(
            [_nats_server(), "-js", *where, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        procs.append(proc)
        _wait_port(port, proc, "nats-server")
        return port, proc

    yield start
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait(10)


# Inside rq: every NATS request waits 120 s for its answer (nats-py's JetStream default is 5 s). What
# the tests below guard is that rq does not wait a request out when the server is gone or refused
# it; with this, one that did takes 120 s, far from the < 30 s they allow (rq's start-up included).
SLOW_REQUESTS = """
import nats.aio.client as _client
_request = _client.Client.request
async def _slow(self, subject, payload=b"", timeout=0.5, *args, **kwargs):
    return await _request(self, subject, payload, 120.0, *args, **kwargs)
_client.Client.request = _slow
"""


# -- 1. every group, past the server's page of 256 consumers --------------------------------------


def _add_groups(url: str, stream: str, names: list[str], subject: str | None) -> None:
    from nats.js.api import AckPolicy, ConsumerConfig

    async def go(js: Any) -> None:
        for name in names:
            cfg = ConsumerConfig(
                durable_name=name, ack_policy=AckPolicy.EXPLICIT, filter_subject=subject, mem_storage=True
            )
            await js.add_consumer(stream, cfg)

    js_call(url, go)


def test_offsets_lists_every_group_past_the_servers_page(nats_url: str, stream_name: str) -> None:
    make_stream(nats_url, stream_name)
    publish(nats_url, f"{stream_name}.x", [b"1", b"2", b"3"])
    whole = [f"g{i:03d}" for i in range(270)]  # more than one page of the consumer list
    _add_groups(nats_url, stream_name, whole, None)
    # named to sort after the 270 others: a page read before filtering by subject loses them
    mine = ["zz-a", "zz-b"]
    _add_groups(nats_url, stream_name, mine, f"{stream_name}.x")

    r = run_rq("--json", "offsets", f"{nats_url}/{stream_name}")
    assert r.returncode == 0, r.stderr
    assert [g["group"] for g in json.loads(r.stdout)["groups"]] == whole

    r = run_rq("--json", "offsets", f"{nats_url}/{stream_name}/{stream_name}.x")
    assert r.returncode == 0, r.stderr
    assert [g["group"] for g in json.loads(r.stdout)["groups"]] == mine


# -- 2. the server lost while a group's position is being stored ---------------------------------


def test_a_server_lost_at_the_commit_is_exit_6_promptly_and_the_group_stays_uncommitted(
    private_nats: Any, tmp_path: Path
) -> None:
    port, server = private_nats()
    url = f"nats://127.0.0.1:{port}/KS"
    env = _env(tmp_path)
    r = run_rq("produce", f"{url}/KS.x", "-q", input=b"".join(b"%d\n" % i for i in range(10)), env=env)
    assert r.returncode == 0, r.stderr
    proc = popen_rq_with(SLOW_REQUESTS, "replay", url, "--group", "kg", "--commit", "-f", "--json", env=env)
    try:
        lines: list[bytes] = []
        assert proc.stdout is not None
        threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, b"")), daemon=True).start()
        deadline = time.monotonic() + 20
        while len(lines) < 10 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(lines) == 10, proc.stderr.read() if proc.poll() is not None else lines
        server.kill()
        server.wait(10)
        lost_at = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        took = time.monotonic() - lost_at
        assert proc.poll() is not None, "rq still waits 60 s after the server went"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode()
    assert proc.returncode == 6, err
    assert "lost the connection to NATS" in err and "group kg" in err, err
    assert took < 30, f"{took:.1f} s to notice the server was gone"  # a request waits 120 s
    # at least once: nothing was stored, the next run reads the 10 records again
    private_nats(port=port)
    r = run_rq("--json", "offsets", url, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["groups"] == [], r.stdout


# -- 4. a permission the server denies ------------------------------------------------------------


def test_a_denied_permission_fails_at_once_naming_the_stream_in_its_case(
    private_nats: Any, tmp_path: Path
) -> None:
    conf = tmp_path / "perm.conf"
    conf.write_text(
        "authorization { users = [\n"
        '  {user: alice, password: "pw-a"}\n'
        '  {user: bob, password: "pw-b", permissions: {publish: "foo.>", subscribe: "foo.>"}}\n'
        "] }\n"
    )
    port, _ = private_nats("-c", str(conf))
    topic = f"nats://127.0.0.1:{port}/EvMixed/EvMixed.x"
    r = run_rq(
        "produce", topic, "-q", input=b"a\n", env=_env(tmp_path, NATS_USER="alice", NATS_PASSWORD="pw-a")
    )
    assert r.returncode == 0, r.stderr
    bob = _env(tmp_path, NATS_USER="bob", NATS_PASSWORD="pw-b")
    for cmd in (["offsets", topic], ["replay", topic, "--from", "start"], ["produce", topic]):
        began = time.monotonic()
        proc = popen_rq_with(SLOW_REQUESTS, *cmd, env={**bob, "CI": "1"})
        try:
            _out, err = proc.communicate(b"b\n", timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        took = time.monotonic() - began
        r = subprocess.CompletedProcess(cmd, proc.returncode, _out, err)
        assert r.returncode == 4, r.stderr
        line = _one_line(r)
        assert '"$JS.API.STREAM.INFO.EvMixed"' in line and "as user 'bob'" in line, line
        assert took < 30, f"{cmd[0]}: {took:.1f} s (the request waits 120 s for an answer)"


# -- 3. a spec replay over a message deleted since ---------------------------------------------------


def _delete(url: str, stream: str, *seqs: int) -> None:
    async def go(js: Any) -> None:
        for seq in seqs:
            await js.delete_msg(stream, seq)

    js_call(url, go)


def _interleaved(url: str, stream: str) -> None:
    """Sequences 1..200: odd ones on STREAM.a (a1, a3...), even ones on STREAM.b."""
    make_stream(url, stream)

    async def go(js: Any) -> None:
        for seq in range(1, 201):
            await js.publish(f"{stream}.{'a' if seq % 2 else 'b'}", b"v%d" % seq)

    js_call(url, go)


def test_check_spec_range_counts_what_is_left_on_the_subject(nats_url: str, stream_name: str) -> None:
    from topics.errors import DigestMismatch
    from topics.sources.jetstream import JetStreamSource
    from topics.sources.open import parse_topic

    _interleaved(nats_url, stream_name)
    _delete(nats_url, stream_name, 10)  # before the spec: a hole it already knew
    whole = JetStreamSource(parse_topic(f"{nats_url}/{stream_name}", Path("/none")))
    on_a = JetStreamSource(parse_topic(f"{nats_url}/{stream_name}/{stream_name}.a", Path("/none")))
    try:
        whole.check_spec_range(1, 201, 199)
        on_a.check_spec_range(1, 201, 100)
        _delete(nats_url, stream_name, 100)  # an even one: not on STREAM.a
        on_a.check_spec_range(1, 201, 100)
        with pytest.raises(DigestMismatch, match=r"deleted: offsets 1\.\.200 .* hold 198 records now"):
            whole.check_spec_range(1, 201, 199)
        _delete(nats_url, stream_name, 101)
        with pytest.raises(DigestMismatch, match="hold 99 records now, the spec pinned 100"):
            on_a.check_spec_range(1, 201, 100)
        on_a.check_spec_range(103, 201, 49)  # a range after the holes
    finally:
        whole.close()
        on_a.close()


def test_replay_by_spec_over_a_deleted_message_fails_before_writing(
    nats_url: str, stream_name: str, tmp_path: Path
) -> None:
    _interleaved(nats_url, stream_name)
    _delete(nats_url, stream_name, 10)
    env = _env(tmp_path)
    spec = tmp_path / "j.json"
    topic = f"{nats_url}/{stream_name}/{stream_name}.a"
    r = run_rq("replay", topic, "--from", "start", "--to", "200", "--save-spec", str(spec), env=env)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 100, r.stderr

    _delete(nats_url, stream_name, 50)  # STREAM.b's: the spec's records are all there
    r = run_rq("replay", "--spec", str(spec), "--format", "raw", env=env)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 100, r.stderr

    _delete(nats_url, stream_name, 51)  # one of the spec's
    r = run_rq("replay", "--spec", str(spec), "--format", "raw", env=env)
    assert r.returncode == 5, r.stderr
    assert r.stdout == b"", "records written before the replay failed"
    assert "deleted" in _one_line(r) and "changed" not in r.stderr.decode(), r.stderr


# -- 5. natscli's credentials rq does not read ------------------------------------------------------


def test_a_refusal_says_nats_creds_and_nkey_were_not_read(private_nats: Any, tmp_path: Path) -> None:
    port, _ = private_nats("--user", "alice", "--pass", "pw-a")
    creds = tmp_path / "user.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\nnot.a.jwt\n------END NATS USER JWT------\n")
    topic = f"nats://127.0.0.1:{port}/CR"
    r = run_rq("offsets", topic, env=_env(tmp_path, NATS_CREDS=str(creds)))
    assert r.returncode == 4, r.stderr
    assert "NATS_CREDS is set, but rq does not read .creds files or NKEYs" in _one_line(r), r.stderr
    r = run_rq("offsets", topic, env=_env(tmp_path, NATS_CREDS=str(creds), NATS_NKEY=str(creds)))
    assert r.returncode == 4 and "NATS_CREDS and NATS_NKEY are set" in _one_line(r), r.stderr
    r = run_rq("offsets", topic, env=_env(tmp_path))  # neither: the message stays as it was
    assert r.returncode == 4 and "NATS_CREDS" not in _one_line(r), r.stderr


# -- 6. user info with '/', '?' or '#' not percent-encoded -----------------------------------------


@pytest.mark.parametrize(
    ("url", "env_names"),
    [
        ("nats://alice:ab/Zq9@127.0.0.1:4222/S", "NATS_USER/NATS_PASSWORD"),
        ("nats://alice:ab#Zq9@127.0.0.1:4222/S", "NATS_USER/NATS_PASSWORD"),
        ("nats://alice:ab?Zq9@127.0.0.1:4222/S", "NATS_USER/NATS_PASSWORD"),
        ("tls://tok/Zq9@127.0.0.1/S", "NATS_USER/NATS_PASSWORD"),  # a token
        ("mqtt://alice:ab/Zq9@127.0.0.1:1883/t/#", "RQ_MQTT_USERNAME/RQ_MQTT_PASSWORD"),
        ("mqtts://alice:ab#Zq9@127.0.0.1/t", "RQ_MQTT_USERNAME/RQ_MQTT_PASSWORD"),
    ],
)
def test_unencoded_user_info_is_named_without_the_secret(url: str, env_names: str, tmp_path: Path) -> None:
    r = run_rq("tail", url, "-n", "1", env=_env(tmp_path), timeout=20)
    assert r.returncode == 2, r.stderr
    line = _one_line(r)
    assert "must be percent-encoded" in line and env_names in line, line
    assert "Zq9" not in r.stderr.decode() and "bad port" not in line, line


def test_percent_encoded_user_info_still_parses() -> None:
    from topics.sources.open import parse_topic

    ref = parse_topic("nats://alice:ab%2F%23%3Fcd@127.0.0.1:4222/S", Path("/none"))
    assert (ref.user, ref.password, ref.stream) == ("alice", "ab/#?cd", "S")
    ref = parse_topic("mqtt://127.0.0.1/dev/a@b/x", Path("/none"))  # an '@' in a topic is no user info
    assert (ref.host, ref.subject, ref.user) == ("127.0.0.1", "dev/a@b/x", None)
