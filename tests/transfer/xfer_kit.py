"""Helpers for the transfer tests: run a real `rq recv` in the background, make source trees, hash trees."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rqtest import libc_with_mmap, wait_until

from transfer import codec
from transfer.manifest import Manifest
from transfer.store import Store

TOKEN = "test-token-7f3a"
REPO = Path(__file__).resolve().parents[2]


def rq_env(token: str = TOKEN, **extra: str) -> dict[str, str]:
    env = {**os.environ, "CI": "1", "RQ_TOKEN": token, **extra}
    env.pop("RQ_PIN", None)
    return env


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bf16(n: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def make_tree(root: Path, random_bytes: int = 3_000_000, bf16_elems: int = 1_500_000) -> Path:
    """A small fake checkpoint: a random shard, a bf16 shard, an index, an empty file, a nested dir."""
    ckpt = root / "ckpt"
    (ckpt / "shards").mkdir(parents=True, exist_ok=True)
    (ckpt / "shards" / "rand.bin").write_bytes(os.urandom(random_bytes))
    (ckpt / "shards" / "weights.bf16").write_bytes(bf16(bf16_elems))
    (ckpt / "index.json").write_text(json.dumps({"shards": ["rand.bin", "weights.bf16"]}))
    (ckpt / "empty").write_bytes(b"")
    return ckpt


def tree_digest(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[p.relative_to(root).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


class Recv:
    """`rq recv` as a real subprocess; `start()` waits for its listening line."""

    def __init__(
        self,
        dest: Path,
        cert_dir: Path,
        transport: str = "tcp",
        *extra: str,
        port: int = 0,
        env: dict[str, str] | None = None,
        netns: str | None = None,
        host: str = "127.0.0.1",
        preexec: Any = None,
        wrap: list[str] | None = None,
    ):
        """`wrap`: a command to run it under (`setpriv --reuid=…`)."""
        self.dest, self.cert_dir, self.transport, self.extra = dest, cert_dir, transport, extra
        self.port, self.env, self.netns, self.host = port, env or rq_env(), netns, host
        self.preexec, self.wrap = preexec, wrap or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}

    def start(self) -> Recv:
        cmd = [
            sys.executable,
            "-m",
            "rqcli",
            "recv",
            str(self.dest),
            "--listen",
            f"{self.host}:{self.port}",
            "--transport",
            self.transport,
            "--json",
            "--cert-dir",
            str(self.cert_dir),
            *self.extra,
        ]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        cmd = [*self.wrap, *cmd]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            cwd=REPO,
            preexec_fn=self.preexec,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(
                f"rq recv did not start: {self.proc.stderr.read().decode() if self.proc.stderr else ''}"
            )
        self.info = json.loads(line)
        self.port = int(self.info["address"].rsplit(":", 1)[1])
        return self

    @property
    def url(self) -> str:
        return f"rq://{self.host}:{self.port}"

    @property
    def pin(self) -> str | None:
        return self.info.get("pin")

    def send_args(self) -> list[str]:
        args = ["--transport", self.transport]
        if self.pin:
            args += ["--pin", self.pin]
        if self.transport == "tcp" and "--tls" in self.extra:
            args.append("--tls")
        return args

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> tuple[int, str, str]:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            out, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        return self.proc.returncode, out.decode(), err.decode()

    def wait(self, timeout: float = 30) -> tuple[int, str, str]:
        assert self.proc is not None
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out.decode(), err.decode()


def quic_recv_in_namespace(tmp_path: Path, ns: str, host: str, backend: str) -> Recv:
    """A started `rq recv --once` over QUIC inside network namespace `ns`, listening on `host` at a
    free UDP port (recv.port), into tmp_path/dst."""
    return Recv(
        tmp_path / "dst",
        tmp_path / "cert",
        "quic",
        "--once",
        "--quic-backend",
        backend,
        netns=ns,
        host=host,
        port=free_port(socket.SOCK_DGRAM),
    ).start()


def rq_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "rqcli", *args]


def send(
    srcs: list[Path], recv: Recv, *extra: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        rq_cmd("send", *map(str, srcs), recv.url, *recv.send_args(), "--json", *extra),
        env=env or rq_env(),
        capture_output=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )


def summary(proc: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    lines = [json.loads(x) for x in proc.stdout.decode().splitlines() if x.strip()]
    found = [x for x in lines if x.get("event") == "summary"]
    assert found, f"no summary: rc={proc.returncode} stderr={proc.stderr.decode()}"
    return found[-1]


def journal_records(dest: Path) -> int:
    total = 0
    for j in (dest / ".rq-partial").glob("*.journal"):
        total += max(0, (j.stat().st_size - 32) // 24)
    return total


def wait_for(pred: Any, timeout: float, step: float = 0.02) -> bool:
    return wait_until(pred, timeout, step)


def require_o_direct(directory: Path, why: str = "") -> None:
    """Skips the calling test where the file system holding `directory` refuses O_DIRECT."""
    probe = directory / ".o-direct-probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError:
        import pytest

        pytest.skip(f"this file system refuses O_DIRECT{why}")
    finally:
        probe.unlink(missing_ok=True)


def resident_pages(path: Path) -> int:
    """How many of the file's pages sit in the page cache (mincore on a shared mapping)."""
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    libc = libc_with_mmap()
    with open(path, "rb") as fh:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fh.fileno(), 0)
        assert addr not in (None, ctypes.c_void_p(-1).value)
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0
            return sum(b & 1 for b in vec.raw)
        finally:
            libc.munmap(addr, size)


class Relay:
    """A TCP relay in front of a receiver: each connection it accepts is pumped both ways, and
    `carry` decides what the sender's bytes become on their way (subclasses: a bit flip, a slow
    link). `piece` is the most it reads at a time from the sender."""

    piece = 1 << 16

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.closing = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.accepted(client)
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def accepted(self, client: socket.socket) -> None:
        """A hook for the sender's side of a new connection (socket options)."""

    def carry(self, data: bytes, seen: int) -> bytes:
        """What goes on for `data`, which starts `seen` bytes into a sender's connection."""
        return data

    def _pump(self, src: socket.socket, dst: socket.socket, outbound: bool) -> None:
        seen = 0
        with contextlib.suppress(OSError):
            while not self.closing.is_set() and (data := src.recv(self.piece if outbound else 1 << 16)):
                sent = self.carry(data, seen) if outbound else data
                seen += len(data)
                dst.sendall(sent)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.closing.set()
        self.sock.close()


def interrupt_after(src: Path, recv: Recv, chunks: int, chunk_size: int) -> None:
    """Sends `src` with the library until `chunks` chunks went out, then dies like a killed sender."""
    import pytest

    from transfer.events import ChunkMoved, Event
    from transfer.sender import SendOptions, send
    from transfer.transport import ConnectOptions, get_transport

    class Stop(BaseException):
        pass

    moved = [0]

    def on_event(ev: Event) -> None:
        if isinstance(ev, ChunkMoved):
            moved[0] += 1
            if moved[0] > chunks:
                raise Stop

    copts = ConnectOptions("127.0.0.1", recv.port, None, tls=False)
    opts = SendOptions(chunk_size=chunk_size, window=1, streams=1, compress="none")
    with pytest.raises(Stop):
        send([src], get_transport("tcp"), copts, TOKEN.encode(), opts, on_event)


def receive_chunks(
    store: Store,
    m: Manifest,
    datas: Sequence[bytes],
    chunk_size: int,
    *,
    first_chunk_of_file0_only: bool = False,
) -> list[str]:
    """Writes and makes durable every chunk of `m` (files in manifest order) through `store`'s plan,
    as a receiver would; returns each file's root digest. `first_chunk_of_file0_only` stops file 0
    after its first chunk (a transfer cut short)."""
    plan, roots = store.plan(m), []
    for f, data in enumerate(datas):
        digests = [
            codec.digest(data[k * chunk_size : (k + 1) * chunk_size])
            for k in range(m.files[f].chunks(chunk_size))
        ]
        for k, dig in enumerate(digests):
            if first_chunk_of_file0_only and f == 0 and k > 0:
                break
            if not plan.has(f, k):
                plan.write(f, k, data[k * chunk_size : (k + 1) * chunk_size])
                plan.make_durable([(f, k, dig)])
        roots.append(codec.root_digest(digests).hex())
    plan.close()
    return roots


def control_channel(port: int, tid: str, token: str = TOKEN, role: str = "control") -> Any:
    """An authenticated channel (`role` "control" or "data") to a real `rq recv` (TCP, no TLS),
    speaking the protocol by hand as a hostile sender would: what it sends next is up to the test."""
    from transfer.frames import FrameType, control
    from transfer.session import auth_mac
    from transfer.tcp import TcpChannel

    ch = TcpChannel(socket.create_connection(("127.0.0.1", port), timeout=10), 1 << 26)
    nonce = os.urandom(16)
    hello = {"role": role, "transfer_id": tid, "nonce": base64.b64encode(nonce).decode(), "auth": 2}
    ch.send(control(FrameType.HELLO, hello))
    frame = ch.recv(10)
    assert frame is not None and frame.type is FrameType.CHALLENGE
    server_nonce = base64.b64decode(frame.json()["nonce"])
    ch.send(control(FrameType.AUTH, {"mac": auth_mac(token.encode(), server_nonce, nonce, role, tid)}))
    return ch


def hello_reply(port: int, **fields: Any) -> dict[str, Any]:
    """Sends a HELLO (control role, a fresh nonce, plus `fields`: an "auth" version or none, as an
    rq send of another release would) to a real `rq recv` over TCP and returns its answer (`reply`)."""
    from transfer.frames import FrameType, control
    from transfer.tcp import TcpChannel

    ch = TcpChannel(socket.create_connection(("127.0.0.1", port), timeout=10), 1 << 20)
    nonce = base64.b64encode(os.urandom(16)).decode()
    ch.send(control(FrameType.HELLO, {"role": "control", "transfer_id": "t" * 32, "nonce": nonce, **fields}))
    return reply(ch)


def reply(ch: Any) -> dict[str, Any]:
    """The receiver's next frame on `ch` as {"type": "ACCEPT" | "ERROR" | …, plus the frame's JSON
    (an ERROR's "code")}; closes `ch`."""
    from transfer.frames import FrameType

    try:
        frame = ch.recv(10)
        assert frame is not None
        out: dict[str, Any] = {"type": frame.type.name}
        if frame.type in (FrameType.ERROR, FrameType.ACCEPT, FrameType.DONE):
            out.update(frame.json())
        return out
    finally:
        ch.close()


def manifest_reply(port: int, body: bytes) -> dict[str, Any]:
    """Sends a manifest body (any JSON at all, its own transfer_id) and returns the receiver's
    answer (`reply`)."""
    from transfer.frames import FrameType, header

    ch = control_channel(port, str(json.loads(body).get("transfer_id", "")))
    ch.send(header(FrameType.MANIFEST, len(body)), body)
    return reply(ch)


NOBODY = 65534
# setpriv, not a preexec_fn calling setuid: here only a program exec'd by setpriv may run the
# venv's Python as nobody (it lives under /root)
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@contextlib.contextmanager
def nobody_home() -> Any:
    """A directory only `nobody` may write, for an `rq recv` run as nobody (Recv(wrap=AS_NOBODY)):
    as root (where the tests run) permission bits never stop an open or a link. Skips the test
    where that cannot be done (not root, no setpriv, nobody cannot run this Python)."""
    import shutil
    import tempfile

    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root to run the receiver as nobody")
    home = Path(tempfile.mkdtemp(prefix="rq-nobody-", dir="/tmp"))
    os.chown(home, NOBODY, NOBODY)
    try:
        try:
            probe = subprocess.run([*AS_NOBODY, sys.executable, "-c", "import transfer.store"], cwd=REPO)
        except FileNotFoundError:  # no setpriv
            probe = None
        if probe is None or probe.returncode != 0:
            pytest.skip("nobody cannot run this Python here")
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


class BarSpy:
    """The calls rq send's and rq recv's progress handlers make on their rich progress bar,
    recording each figure it would show."""

    def __init__(self) -> None:
        self.shown: list[int] = []

    def add_task(self, _description: str, total: int, completed: int = 0, **_: Any) -> int:
        return 0  # (rich's signature: a bar may start at what is already there)

    def update(self, _task: int, completed: int | None = None, **_: Any) -> None:
        if completed is not None:
            self.shown.append(completed)

    def advance(self, _task: int, n: int) -> None:
        self.shown.append((self.shown[-1] if self.shown else 0) + n)


def repeated_random_file(path: Path, mib: int) -> Path:
    """A `mib` MiB file of one random MiB over and over: incompressible per chunk, quick to write."""
    block = os.urandom(1 << 20)
    with open(path, "wb") as fh:
        for _ in range(mib):
            fh.write(block)
    return path


def _bytes_written(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar")


def stop_once_writing(recv: Recv, written: int, hold: float) -> threading.Thread:
    """A started thread that SIGSTOPs `recv` (a --json receiver) once its transfer is planned and
    it has written `written` bytes of chunks (/proc wchar), and wakes it `hold` seconds later:
    chunks flow, and the receiver then falls silent mid-transfer. Join it before recv.stop()."""
    from rqtest import freeze

    proc = recv.proc
    assert proc is not None and proc.stdout is not None
    stdout = proc.stdout

    def run() -> None:
        line = stdout.readline()  # the `transfer` event: planned, chunks about to flow
        assert b'"transfer"' in line, line
        start = _bytes_written(proc.pid)
        deadline = time.monotonic() + 30
        while _bytes_written(proc.pid) < start + written and time.monotonic() < deadline:
            time.sleep(0.0005)
        freeze(proc)
        time.sleep(hold)
        proc.send_signal(signal.SIGCONT)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def send_while_stopped(
    tmp_path: Path, transport: str, written: int, hold: float, *send_args: str
) -> subprocess.CompletedProcess[bytes]:
    """`rq send --json` of a 256 MiB incompressible file to a `rq recv --once` (tmp_path/dst) that
    is stopped once it has written `written` bytes of chunks and woken `hold` s later
    (stop_once_writing); `send_args` are added to the send's."""
    src = repeated_random_file(tmp_path / "ckpt.bin", 256)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", transport, "--once").start()
    stopper = stop_once_writing(recv, written, hold)
    try:
        return subprocess.run(
            rq_cmd("send", str(src), recv.url, *recv.send_args(), "--json", "--compress", "none", *send_args),
            env=rq_env(), capture_output=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        stopper.join()
        recv.stop()


def interrupt_mid_send(
    recv: Recv, source: Path, *args: str, sig: int = signal.SIGTERM, settle: float = 0.0
) -> tuple[int, bytes, bytes]:
    """`rq send SOURCE` to `recv` (with `args`), stopped by `sig` mid-way: the receiver is held
    (SIGSTOP) until the sender runs, let go until it has journaled a chunk (plus `settle` seconds,
    for its ACKs to reach the sender), held again, and the signal sent. Returns the sender's exit
    code, stdout and stderr; the receiver is left running."""
    assert recv.proc is not None
    recv.proc.send_signal(signal.SIGSTOP)
    proc = subprocess.Popen(
        rq_cmd("send", str(source), recv.url, *recv.send_args(), *args),
        env=rq_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    try:
        recv.proc.send_signal(signal.SIGCONT)
        assert wait_for(lambda: journal_records(recv.dest) > 0, 30, step=0.005)
        time.sleep(settle)
        recv.proc.send_signal(signal.SIGSTOP)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        recv.proc.send_signal(signal.SIGCONT)
    return proc.returncode, out, err
