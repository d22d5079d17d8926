"""`rq send --connections N` over QUIC runs its connections in processes (transfer/procs.py): what
the summary says they moved, when one of them fails mid-transfer. Real rq send/recv on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from xfer_kit import Recv, journal_records, rq_cmd, rq_env, wait_for

pytestmark = pytest.mark.integration

# aioquic with small datagrams and chunks: slow enough to kill a process mid-transfer
SLOW = ("--quic-backend", "aioquic", "--datagram-size", "1400")
CHUNK = 256 << 10


def _children(pid: int) -> list[int]:
    return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_failed_connection_process_leaves_every_chunk_moved_counted(tmp_path: Path) -> None:
    """Receiver process 2 of 2 is killed early: sender connection process 1 fails at once
    (ICMP unreachable) while process 2 is still sending. The chunks process 2 moved after that
    were never counted (its reports were left in the queue and it was killed), yet the receiver
    kept them, so they were not sent again: a fresh 192-chunk transfer said it sent 171 distinct
    chunks and a bytes_raw less than the file."""
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(192 * CHUNK))
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "quic", *SLOW, "--workers", "2", "--once").start()
    args = ["send", str(src), recv.url, "--pin", str(recv.pin), "--json", "--transport", "quic", *SLOW]
    args += ["--chunk-size", "256KiB", "--connections", "2", "--retry-for", "30"]
    sender = subprocess.Popen(rq_cmd(*args), env=rq_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert recv.proc is not None
        assert wait_for(lambda: journal_records(dest) >= 3, 60)
        (worker,) = _children(recv.proc.pid)
        os.kill(worker, signal.SIGKILL)
        out, err = sender.communicate(timeout=180)
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
        recv.stop()
    assert sender.returncode == 0, err.decode()
    summary = [x for x in map(json.loads, out.decode().splitlines()) if x.get("event") == "summary"][-1]
    assert summary["attempts"] >= 2 and summary["complete"]
    # every chunk of a fresh transfer went out at least once; resent ones are counted again
    assert summary["chunks_sent"] - summary["chunks_resent"] == 192, summary
    assert summary["bytes_raw"] == summary["chunks_sent"] * CHUNK, summary
    assert (dest / "model.bin").read_bytes() == src.read_bytes()


def test_connection_0_runs_in_the_sender_and_its_failure_is_a_retryable_loss() -> None:
    """Connection 0 runs in the sending process itself (a thread; a child costs ~0.1 CPU-s of
    start-up): when it cannot connect, move_in_processes raises a PeerUnreachableError naming
    the cause (the sender retries those), and no child was started for a single share."""
    import multiprocessing

    from transfer.errors import PeerUnreachableError
    from transfer.procs import move_in_processes
    from transfer.sender import SendOptions, Stats
    from transfer.transport import ConnectOptions

    class Refusing:
        name = "quic"

        def connect(self, copts: ConnectOptions) -> None:
            raise ConnectionRefusedError(111, "Connection refused")

    before = multiprocessing.active_children()
    with pytest.raises(PeerUnreachableError, match="ConnectionRefusedError"):
        move_in_processes(
            [(0, 0)],
            Refusing(),  # type: ignore[arg-type]
            ConnectOptions("127.0.0.1", 9, None),
            b"t" * 32,
            None,  # type: ignore[arg-type]  (never reached)
            [],
            SendOptions(connections=2),
            [{}],
            Stats(),
            lambda _ev: None,
            [],
        )
    assert multiprocessing.active_children() == before


def test_connection_0_still_connecting_when_the_attempt_ends_is_closed_not_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child fails while connection 0 (a thread of the sender) is still in its handshake: the
    attempt ends, and connection 0 must not go on with a connection of its own afterwards (review:
    it did, and then raised ValueError on the attempt's closed queue in a thread traceback)."""
    import socket
    import threading

    import transfer.procs as procs
    from transfer.errors import PeerUnreachableError
    from transfer.sender import SendOptions, Stats
    from transfer.source import scan
    from transfer.transport import ConnectOptions

    monkeypatch.setattr(procs, "STOP_S", 0.2)
    release, made = threading.Event(), []

    class Conn:
        closed = False

        def open_channel(self) -> None:
            raise AssertionError("connection 0 used after its attempt ended")

        def close(self) -> None:
            self.closed = True

    class Blocked:
        name = "tcp"  # the child connects for real: to a closed port, refused at once

        def connect(self, copts: ConnectOptions) -> Conn:
            release.wait(60)
            made.append(Conn())
            return made[-1]

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    src = tmp_path / "s.bin"
    src.write_bytes(os.urandom(2 << 20))
    manifest, files = scan([src], 1 << 20, [])
    hooked: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: hooked.append(args.exc_value))
    with pytest.raises(PeerUnreachableError):
        procs.move_in_processes(
            [(0, 0), (0, 1)],
            Blocked(),  # type: ignore[arg-type]
            ConnectOptions("127.0.0.1", closed_port, None, tls=False, timeout=5),
            b"t" * 32,
            manifest,
            files,
            SendOptions(connections=2),
            [{}],
            Stats(),
            lambda _ev: None,
            [],
        )
    release.set()
    (own,) = [t for t in threading.enumerate() if t.name == "rq-conn-0"] or [None]
    if own is not None:
        own.join(30)
        assert not own.is_alive()
    assert made and made[0].closed
    assert hooked == []  # was: [ValueError('Queue ... is closed')]
