"""Helpers shared by the tests: import as `from rqtest import run_rq, Services` (tests/ is on sys.path
because tests/conftest.py lives there; `from conftest import` breaks where a folder has its own conftest).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Services:
    s3_endpoint: str
    access_key: str
    secret_key: str
    nats_url: str
    mqtt_url: str | None

    def aws_env(self) -> dict[str, str]:
        """Environment for a subprocess that should reach the test S3 through boto3's standard chain."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.s3_endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }


def rq_command() -> list[str]:
    """How tests run the CLI: the installed console script's module, in this interpreter."""
    return [sys.executable, "-m", "rqcli"]


def run_rq(
    *args: str,
    env: dict[str, str] | None = None,
    input: bytes | None = None,
    timeout: float = 120,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Runs `rq ARGS` as a real subprocess (exit codes, stderr and all)."""
    full_env = {**os.environ, "CI": "1", **(env or {})}
    return subprocess.run(
        [*rq_command(), *args],
        env=full_env,
        input=input,
        capture_output=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


def popen_rq(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Starts `rq ARGS` in the background (a follower to read line by line, then signal or wait)."""
    return subprocess.Popen(
        [*rq_command(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


def popen_rq_with(setup: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """popen_rq, with `setup` (Python statements, e.g. a module constant lowered so a test need
    not wait out a production interval) run in the rq process before the CLI starts."""
    code = f"{setup}\nimport sys\nsys.argv[0] = 'rq'\nfrom rqcli.console import main\nmain()\n"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


def run_rq_on_a_pty(args: list[str], env: dict[str, str]) -> str:
    """Runs `rq ARGS` with its stdout on a pseudo-terminal (stderr a pipe) and returns what it
    wrote there; it must exit 0."""
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([*rq_command(), *args], stdout=slave, stderr=subprocess.PIPE, env=env)
        os.close(slave)
        slave = -1
        got = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            got += chunk
        assert proc.wait(60) == 0
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    return got.decode()


def freeze(proc: subprocess.Popen[bytes]) -> None:
    """SIGSTOPs `proc` (a server or rq process of the test's own) and returns once every thread of it is stopped:
    kill() returns before they all are, and a nats-server thread still running on the other core
    answered a request sent at once (under load, 17 of 30 tries)."""
    proc.send_signal(signal.SIGSTOP)
    tasks = Path(f"/proc/{proc.pid}/task")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for task in tasks.iterdir():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.005)
    raise AssertionError(f"process {proc.pid} did not stop within 10 s of SIGSTOP")


def run_rq_ram_root_at(shm: Path, *args: str) -> tuple[int, str, str]:
    """rq run with its RAM tier's default root under `shm` (a stand-in for /dev/shm: a plain file
    there is a machine without a usable RAM tier); returns (exit code, stdout, stderr)."""
    setup = (
        "import cache.api\nfrom pathlib import Path\n"
        f"cache.api.default_ram_root = lambda root, n=0: Path({str(shm)!r}) / f'rq-{{n}}'"
    )
    proc = popen_rq_with(setup, *args)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out.decode(), err.decode()


def wait_or_fail(proc: subprocess.Popen[bytes], timeout: float, still: str) -> int:
    """The process's exit status; one still running after `timeout` s is killed and the test
    fails saying `still` (what it was still doing that it should not)."""
    import pytest

    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(still)


def recv_exactly(conn: Any, n: int) -> bytes:
    """`n` bytes from a socket; EOFError when the peer closes first."""
    buf = b""
    while len(buf) < n:
        got = conn.recv(n - len(buf))
        if not got:
            raise EOFError
        buf += got
    return buf


def read_lines(proc: subprocess.Popen[bytes], lines: list[bytes]) -> None:
    """Asserts the process's next stdout lines are `lines` (each given without its newline)."""
    assert proc.stdout is not None
    for want in lines:
        assert proc.stdout.readline() == want + b"\n"


def rdma_device_present() -> bool:
    tool = shutil.which("ibv_devices")
    if tool is None:
        return False
    out = subprocess.run([tool], capture_output=True, text=True, check=False)
    lines = [ln for ln in out.stdout.splitlines()[2:] if ln.strip()]
    return out.returncode == 0 and bool(lines)


def netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    name = f"rqprobe{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", name], capture_output=True, check=False).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    return ok


@dataclass(frozen=True)
class VethLink:
    ns: str  # the namespace; `ip netns exec <ns> …` runs there
    outer: str  # the veth end in this namespace (qdiscs on it shape what goes into ns)
    inner: str  # the end inside ns
    here: str  # outer's address
    there: str  # inner's address


@contextmanager
def veth_namespace(prefix: str) -> Iterator[VethLink]:
    """A fresh network namespace joined to this one by a veth pair (/24, both ends up), removed on
    exit. Names and subnet derive from the pid so parallel runs do not collide."""
    tag = f"{os.getpid() % 10000}"
    ns, outer, inner = f"{prefix}{tag}", f"{prefix}o{tag}", f"{prefix}i{tag}"
    subnet = 200 + os.getpid() % 50
    link = VethLink(ns, outer, inner, f"10.{subnet}.77.1", f"10.{subnet}.77.2")
    inside = ["ip", "netns", "exec", ns]
    cmds = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
        ["ip", "link", "set", inner, "netns", ns],
        ["ip", "addr", "add", f"{link.here}/24", "dev", outer],
        ["ip", "link", "set", outer, "up"],
        [*inside, "ip", "addr", "add", f"{link.there}/24", "dev", inner],
        [*inside, "ip", "link", "set", inner, "up"],
        [*inside, "ip", "link", "set", "lo", "up"],
    ]
    try:
        for cmd in cmds:
            subprocess.run(cmd, check=True, capture_output=True)
        yield link
    finally:
        subprocess.run(["ip", "link", "del", outer], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


# Older spelling, kept for tests written before the rename.
_rdma_device_present = rdma_device_present


def libc_with_mmap() -> ctypes.CDLL:
    """libc through ctypes with mmap/munmap/mincore prototyped (pointer-sized returns and arguments),
    for tests that look at mappings and the page cache directly."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


@contextmanager
def small_tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `mnt` (a full file system on demand); skips without root."""
    import pytest

    mnt.mkdir()
    ok = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True
    )
    if ok.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {ok.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def random_files(directory: Path, count: int, size: int, prefix: str = "", suffix: str = "") -> Path:
    """DIRECTORY (made) holding COUNT files PREFIX0SUFFIX, PREFIX1SUFFIX, ... of SIZE random bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (directory / f"{prefix}{i}{suffix}").write_bytes(os.urandom(size))
    return directory


@contextmanager
def serving(serve: Callable[[Any, Any], None] | None = None) -> Iterator[int]:
    """Accepts TCP connections on an ephemeral loopback port and yields the port. With `serve`,
    `serve(conn, done)` runs in a thread per connection (`done`: a threading.Event set at the end);
    without, connections are held open and never said a word to. Every connection is closed at the
    end."""
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn = srv.accept()[0]
            except OSError:
                continue
            held.append(conn)
            if serve is not None:
                threading.Thread(target=serve, args=(conn, done), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        done.set()
        t.join()
        for c in held:
            with suppress(OSError):
                c.close()
        srv.close()


@contextmanager
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word: a hung server, a half-dead
    proxy or port-forward, a wrong port. Yields the port."""
    with serving() as port:
        yield port


def js_call(url: str, fn: Any) -> Any:
    """Runs `await fn(jetstream)` on a fresh nats-py connection to `url` (test set-up and checks)."""
    import asyncio

    import nats

    async def go() -> Any:
        nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
        try:
            return await fn(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(go())


@contextmanager
def http_on_loopback(handler: type[Any]) -> Iterator[int]:
    """An http.server with `handler` on a free 127.0.0.1 port, served from a thread; yields the
    port and shuts the server down after."""
    import http.server

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        t.join()


@contextmanager
def s3_stub(status: int, body: bytes) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """An S3 'store' on a free loopback port answering every GET/HEAD with status and an XML
    body; yields the port and the headers of the requests it got (a port of its own: xdist
    workers run parametrized cases at once)."""
    import http.server

    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    with http_on_loopback(Handler) as port:
        yield port, seen


def home_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Variables for an rq that reads no config file of this machine: HOME and XDG_CONFIG_HOME
    under tmp_path (its default config file: tmp_path/xdg/rq/config.toml), RQ_CONFIG unset."""
    (tmp_path / "home").mkdir(exist_ok=True)
    return {
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "RQ_CONFIG": "",
        **extra,
    }


def home_config(tmp_path: Path, text: str) -> Path:
    """Writes `text` as the default config file of an rq run with home_env(tmp_path)."""
    path = tmp_path / "xdg" / "rq" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def quietly(serve: Callable[[Any], None]) -> Callable[[Any, object], None]:
    """A fake broker's script, for rqtest.serving: rq closing its end first ends it quietly."""

    def run(conn: Any, _done: object) -> None:
        with suppress(OSError, EOFError):
            serve(conn)

    return run


def read_packet(conn: Any) -> bytes:
    """One MQTT packet's fixed header byte and body."""
    first = recv_exactly(conn, 1)
    length, mult = 0, 1
    while True:
        b = recv_exactly(conn, 1)[0]
        length += (b & 0x7F) * mult
        mult *= 128
        if not b & 0x80:
            break
    return first + recv_exactly(conn, length)


@contextmanager
def serving_receiver(rx: Any, transport: Any, cert_dir: Path, tls: bool) -> Iterator[tuple[Any, Any]]:
    """A transfer Receiver's listener on 127.0.0.1, served on a thread of this process, and a
    sender's connection to it: (listener, connection). Afterwards the listener, the receiver, the
    serving thread (bounded) and the connection are closed, in that order."""
    from transfer.credentials import load_identity
    from transfer.transport import ConnectOptions, ListenOptions

    ident = load_identity(cert_dir)
    listener = transport.listen(ListenOptions("127.0.0.1", 0, ident, tls=tls), rx.handle_channel)
    server = threading.Thread(target=listener.serve_forever, name="test-serve", daemon=True)
    server.start()
    fingerprint = ident.fingerprint if tls else None
    conn = transport.connect(ConnectOptions("127.0.0.1", listener.address[1], fingerprint, tls=tls))
    try:
        yield listener, conn
    finally:
        listener.close()
        rx.close()
        server.join(10)
        conn.close()


def receiver_threads() -> set[threading.Thread]:
    """Live threads of a receiving side in this process: channel handlers and their chunk writers
    (a QUIC client's own loop thread is the sender's)."""
    return {
        t
        for t in threading.enumerate()
        if t.is_alive() and ("_serve_one" in t.name or t.name.startswith("rq-recv-write"))
    }


def assert_told_shut_down(channels: Any) -> None:
    """Each sender channel, read on past ACK/READY frames, ends with the receiver's ERROR
    `unreachable` saying it shut down (a lost peer to retry, not a refusal)."""
    from transfer import receiver
    from transfer.errors import PeerUnreachableError
    from transfer.frames import FrameType

    for ch in channels:
        frame = ch.recv(10)
        while frame is not None and frame.type is not FrameType.ERROR:
            frame = ch.recv(10)
        assert frame is not None, "the channel ended without a word"
        info = frame.json()
        assert info["code"] == PeerUnreachableError.code, info
        assert info["message"] == receiver.SHUT_DOWN


def wait_until(pred: Callable[[], object], timeout: float = 10.0, step: float = 0.02) -> bool:
    """Whether `pred()` came true within `timeout` seconds (polled every `step`)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())
