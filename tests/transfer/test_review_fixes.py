"""Regression tests for defects an independent review reproduced in `rq send` / `rq recv`
(issue 4): each test failed before its fix. Real TCP/QUIC on loopback throughout."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xfer_kit import Recv, make_tree, rq_cmd, rq_env, summary, tree_digest, wait_for
from xfer_kit import send as rq_send

from transfer.credentials import load_identity
from transfer.errors import BusyError, PeerUnreachableError, SourceChangedError
from transfer.events import ChunkMoved, Event, Retrying
from transfer.frames import FrameType
from transfer.receiver import Receiver
from transfer.sender import SendOptions, send
from transfer.transport import Channel, ConnectOptions, Identity, ListenOptions, get_transport

pytestmark = pytest.mark.integration

TOKEN = b"review-token-0123456789abcdef"
NO_TLS = Identity(b"", b"", "")


@contextlib.contextmanager
def receiver(
    tmp_path: Path, transport: str, wrap: Any = None, **extra: Any
) -> Iterator[tuple[Receiver, ConnectOptions]]:
    """A real Receiver listening on loopback in this process; yields it and how to reach it."""
    rc = Receiver(tmp_path / "dst", TOKEN)
    handler = rc.handle_channel if wrap is None else wrap(rc.handle_channel)
    if transport == "quic":
        ident = load_identity(tmp_path / "cert")
        lopts = ListenOptions("127.0.0.1", 0, ident, extra=extra)
    else:
        ident = NO_TLS
        lopts = ListenOptions("127.0.0.1", 0, NO_TLS, tls=False, extra=extra)
    lst = get_transport(transport).listen(lopts, handler)
    thread = threading.Thread(target=lst.serve_forever, daemon=True)
    thread.start()
    host, port = lst.address
    copts = ConnectOptions(
        host, port, ident.fingerprint if transport == "quic" else None, tls=transport == "quic", extra=extra
    )
    try:
        yield rc, copts
    finally:
        lst.close()
        thread.join(timeout=5)
        rc.close()


# -- 1. a local source error is final; --retry-for counts acknowledged chunks -------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_a_source_file_deleted_mid_send_fails_at_once_not_retried(tmp_path: Path, transport: str) -> None:
    """Was: the reader's FileNotFoundError was taken for a lost connection and retried, forever
    over QUIC (each attempt 'progressed' by sending chunks again)."""
    src = tmp_path / "s9"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(3 << 20))
    (src / "b.bin").write_bytes(os.urandom(1 << 20))
    events: list[Event] = []

    def on_event(ev: Event) -> None:
        events.append(ev)
        if isinstance(ev, ChunkMoved):  # a.bin is on its way: b.bin goes away before it is read
            with contextlib.suppress(FileNotFoundError):
                (src / "b.bin").unlink()

    extra = {"quic_backend": "aioquic", "datagram_size": 1200} if transport == "quic" else {}
    with receiver(tmp_path, transport, **extra) as (_rc, copts):
        opts = SendOptions(chunk_size=1 << 20, retry_for=3.0, connections=1)
        with pytest.raises(SourceChangedError, match=r"b\.bin disappeared"):
            send([src], get_transport(transport), copts, TOKEN, opts, on_event)
    assert not [e for e in events if isinstance(e, Retrying)]
    assert not (tmp_path / "dst" / "s9").exists()  # nothing half-placed


def _chunk_dropper(handle: Any) -> Any:
    """A receiver that loses every chunk: a data channel is cut as its first chunk arrives, before
    anything is written or acknowledged (a peer whose link dies under every attempt)."""

    class Dropping:
        def __init__(self, ch: Channel):
            self.ch = ch

        def __getattr__(self, name: str) -> Any:
            return getattr(self.ch, name)

        def __setattr__(self, name: str, value: Any) -> None:  # frame_limit goes to the driver
            if name == "ch":
                object.__setattr__(self, name, value)
            else:
                setattr(self.ch, name, value)

        def recv(self, timeout: float | None = None) -> Any:
            frame = self.ch.recv(timeout)
            if frame is not None and frame.type == FrameType.CHUNK:
                self.ch.close()
                raise PeerUnreachableError("dropped")
            return frame

    return lambda ch: handle(Dropping(ch))


@pytest.mark.timeout(60)
def test_retry_for_counts_acknowledged_chunks_not_chunks_sent(tmp_path: Path) -> None:
    """Was: each attempt that sent a chunk reset the no-progress clock, so a receiver that never
    acknowledged anything kept the sender retrying forever, whatever --retry-for said."""
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(8 << 20))
    retries: list[Retrying] = []

    def on_event(ev: Event) -> None:
        if isinstance(ev, Retrying):
            retries.append(ev)
            if len(retries) > 60:  # the old behaviour: bounded here so the test fails, not hangs
                raise AssertionError("still retrying after 60 attempts")

    with receiver(tmp_path, "tcp", wrap=_chunk_dropper) as (_rc, copts):
        opts = SendOptions(chunk_size=1 << 20, retry_for=2.0, window=2)
        with pytest.raises(PeerUnreachableError, match="without progress"):
            send([src], get_transport("tcp"), copts, TOKEN, opts, on_event)
    assert retries  # it did retry, then gave up


# -- 2. `rq recv --once` finishes when the re-run sender finds the transfer complete ---------------


@pytest.mark.timeout(90)
def test_recv_once_exits_when_a_rerun_finds_the_transfer_already_complete(tmp_path: Path) -> None:
    """Was: the already-complete answer emitted nothing and never counted as a finished transfer,
    so a new `rq recv --once` kept listening after the sender printed '0 moved … verified'."""
    ckpt = make_tree(tmp_path / "src", 200_000, 50_000)
    first = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    try:
        assert rq_send([ckpt], first).returncode == 0
        assert first.wait()[0] == 0
    finally:
        first.stop()
    again = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    try:
        proc = rq_send([ckpt], again)
        assert proc.returncode == 0, proc.stderr.decode()
        assert summary(proc)["bytes_raw"] == 0
        rc, out, err = again.wait(timeout=30)
    finally:
        again.stop()
    assert rc == 0, err
    done = [json.loads(x) for x in out.splitlines() if '"event":"done"' in x]
    assert done and done[0]["already_complete"] is True and done[0]["files"] == 4
    assert tree_digest(tmp_path / "dst" / "ckpt") == tree_digest(ckpt)


# -- 3. TCP listens on IPv6 --------------------------------------------------------------------------


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
@pytest.mark.parametrize("transport", ["tcp", "quic"])
def test_send_and_recv_over_ipv6_loopback(tmp_path: Path, transport: str) -> None:
    """Was: `rq recv --listen '[::1]:PORT' --transport tcp` failed with 'Address family for
    hostname not supported' (exit 6); QUIC worked."""
    src = tmp_path / "w.bin"
    src.write_bytes(os.urandom(300_000))
    extra = ("--quic-backend", "aioquic") if transport == "quic" else ()
    recv = Recv(tmp_path / "dst", tmp_path / "cert", transport, "--once", *extra, host="[::1]").start()
    try:
        assert recv.info["address"].startswith("[::1]:")
        proc = rq_send([src], recv, *extra)
        assert proc.returncode == 0, proc.stderr.decode()
        assert recv.wait()[0] == 0
    finally:
        recv.stop()
    assert (tmp_path / "dst" / "w.bin").read_bytes() == src.read_bytes()


# -- 4/8. entries that are not sent are said, not dropped (or fatal) -------------------------------


def test_a_broken_symlink_in_a_source_dir_is_skipped_and_reported(tmp_path: Path) -> None:
    """Was: one dangling symlink aborted the whole send as 'source not found' (exit 3), and
    FIFOs, symlinked and empty directories were dropped without a word."""
    ckpt = tmp_path / "src" / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "sub" / "w.bin").write_bytes(os.urandom(100_000))
    (ckpt / "gone").symlink_to(tmp_path / "nowhere")
    os.mkfifo(ckpt / "pipe")
    (ckpt / "linkdir").symlink_to(ckpt / "sub", target_is_directory=True)
    (ckpt / "empty" / "deeper").mkdir(parents=True)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    try:
        proc = rq_send([ckpt], recv)
        assert proc.returncode == 0, proc.stderr.decode()
        assert recv.wait()[0] == 0
    finally:
        recv.stop()
    s = summary(proc)
    lines = [json.loads(x) for x in proc.stdout.decode().splitlines()]
    reasons = {Path(x["path"]).name: x["reason"] for x in lines if x.get("event") == "skipped"}
    # empty directories are sent now (manifest dirs, test_resume_gaps.py), not skipped
    assert reasons.keys() == {"gone", "pipe", "linkdir"}, reasons
    assert reasons["gone"] == "broken symlink" and "FIFO" in reasons["pipe"]
    assert s["skipped"] == 3 and s["files"] == 1 and s["dirs"] == 2
    assert (tmp_path / "dst" / "ckpt" / "empty" / "deeper").is_dir()
    err = proc.stderr.decode()
    assert "not sending" in err and "gone: broken symlink" in err
    assert (tmp_path / "dst" / "ckpt" / "sub" / "w.bin").read_bytes() == (ckpt / "sub" / "w.bin").read_bytes()


def test_a_broken_symlink_given_as_source_is_still_not_found(tmp_path: Path) -> None:
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    try:
        proc = rq_send([tmp_path / "gone"], recv)
    finally:
        recv.stop()
    assert proc.returncode == 3 and "source not found" in proc.stderr.decode()


# -- 5. re-sending after a file of a finished transfer was deleted on the receiver ------------------


def test_resend_after_a_file_was_deleted_on_the_receiver_says_what_to_do(tmp_path: Path) -> None:
    """Was: exit 9 'ckpt/… already exists in the destination' with the generic hint, although the
    existing files are this very transfer's. Now the refusal says so and what to do; --overwrite
    brings the deleted file back. Since placed records are kept (test_resume_gaps.py), such a
    re-run simply sends the missing file; this refusal remains for a destination whose transfer
    finished under an rq that kept no placed records (simulated by removing them)."""
    ckpt = make_tree(tmp_path / "src", 200_000, 50_000)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    try:
        assert rq_send([ckpt], recv).returncode == 0
        for rec in (tmp_path / "dst" / ".rq-partial").glob("*.placed"):
            rec.unlink()
        (tmp_path / "dst" / "ckpt" / "shards" / "rand.bin").unlink()
        proc = rq_send([ckpt], recv)
    finally:
        recv.stop()
    err = proc.stderr.decode()
    assert proc.returncode == 9, err
    assert "this transfer completed here before" in err and "rand.bin" in err and "--overwrite" in err
    again = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--overwrite", "--once").start()
    try:
        assert rq_send([ckpt], again).returncode == 0
        assert again.wait()[0] == 0
    finally:
        again.stop()
    assert tree_digest(tmp_path / "dst" / "ckpt") == tree_digest(ckpt)


# -- 6. a second transfer naming a file an in-flight one writes ------------------------------------


def _second_send_while_first_runs(
    tmp_path: Path, first: list[Path], second: list[Path]
) -> tuple[BaseException | None, dict[str, Any]]:
    """Sends `first` with a window of one chunk; at its first chunk, sends `second` to the same
    receiver. Returns what the second send raised (None: it succeeded) and the first's result."""
    seen: list[BaseException | None] = []
    with receiver(tmp_path, "tcp") as (_rc, copts):
        tcp = get_transport("tcp")

        def on_event(ev: Event) -> None:
            if isinstance(ev, ChunkMoved) and not seen:  # the first is mid-flight: the second comes in now
                try:
                    send(second, tcp, copts, TOKEN, SendOptions(chunk_size=1 << 20, retry_for=1))
                    seen.append(None)
                except Exception as exc:
                    seen.append(exc)

        result = send(first, tcp, copts, TOKEN, SendOptions(chunk_size=1 << 20, window=1), on_event)
    return seen[0], result


@pytest.mark.timeout(60)
def test_a_transfer_naming_a_file_another_live_transfer_writes_is_refused(tmp_path: Path) -> None:
    """Was: the newcomer took the running transfer's manifest for a stale version and deleted its
    partial files: the first sender failed ('receiver cannot write ckpt/c'). Now the newcomer is
    refused (BusyError, exit 9) while the other runs, and the first one completes."""
    a, b = tmp_path / "a" / "ckpt", tmp_path / "b" / "ckpt"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    (a / "c").write_bytes(os.urandom(6 << 20))
    (b / "c").write_bytes(os.urandom(2 << 20))
    refused, result = _second_send_while_first_runs(tmp_path, [a], [b])
    assert isinstance(refused, BusyError), refused
    assert "ckpt/c" in str(refused) and "another transfer" in str(refused)
    assert result["verified"]
    assert (tmp_path / "dst" / "ckpt" / "c").read_bytes() == (a / "c").read_bytes()


@pytest.mark.timeout(60)
def test_a_transfer_naming_the_same_version_of_a_file_a_live_transfer_writes_is_refused(
    tmp_path: Path,
) -> None:
    """Was: only a file sent in another version (another key) was refused; a second transfer of
    the very same file (same key: here the same source file with another file beside it) took the
    running transfer's state over as stale: it deleted the first one's .live, .owner and manifest,
    shared its .part and committed it, and the first sender failed ('receiver cannot write
    shared.bin'), leaving its other file orphaned. Found by a reviewer with two `rq send`s."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "shared.bin").write_bytes(os.urandom(6 << 20))
    (src / "other.bin").write_bytes(os.urandom(1 << 20))
    refused, result = _second_send_while_first_runs(
        tmp_path, [src / "shared.bin", src / "other.bin"], [src / "shared.bin"]
    )
    assert isinstance(refused, BusyError), refused
    assert "shared.bin" in str(refused) and "another transfer" in str(refused)
    assert result["verified"]
    for name in ("shared.bin", "other.bin"):
        assert (tmp_path / "dst" / name).read_bytes() == (src / name).read_bytes()


def test_a_stale_transfer_naming_the_same_file_is_still_dropped(tmp_path: Path) -> None:
    """A transfer that is not running (its sender gone, the receiver's plan closed) is stale: a
    newcomer naming its file restarts it, as before."""
    a, b = tmp_path / "a" / "ckpt", tmp_path / "b" / "ckpt"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    (a / "c").write_bytes(os.urandom(3 << 20))
    (b / "c").write_bytes(os.urandom(2 << 20))
    with receiver(tmp_path, "tcp") as (_rc, copts):
        tcp = get_transport("tcp")

        def stop(ev: Event) -> None:
            if isinstance(ev, ChunkMoved):
                raise KeyboardInterrupt  # the first sender dies mid-flight

        with pytest.raises(KeyboardInterrupt):
            send([a], tcp, copts, TOKEN, SendOptions(chunk_size=1 << 20), stop)
        assert wait_for(lambda: not _rc._plans, 10)  # its channels closed: not running any more
        send([b], tcp, copts, TOKEN, SendOptions(chunk_size=1 << 20))
    assert (tmp_path / "dst" / "ckpt" / "c").read_bytes() == (b / "c").read_bytes()


# -- 7. small ones: messages and exit codes ------------------------------------------------------


def _rq(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(rq_cmd(*args), env=rq_env(), capture_output=True, timeout=timeout, check=False)


def test_recv_names_the_path_it_cannot_create(tmp_path: Path) -> None:
    """Was: 'cannot listen on 127.0.0.1:0: Not a directory' for a DEST under a regular file. A file
    where a directory must be is a usage error (2), as for a DEST that is a file itself."""
    (tmp_path / "file").write_bytes(b"x")
    proc = _rq(
        "recv", str(tmp_path / "file" / "dest"), "--listen", "127.0.0.1:0", "--cert-dir", str(tmp_path / "c")
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "cannot listen" not in err and "file/dest" in err and "Not a directory" in err


def test_recv_once_stopped_by_sigterm_before_a_transfer_exits_interrupted(tmp_path: Path) -> None:
    """Was: exit 0, as if the one transfer had been received."""
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    rc, _out, err = recv.stop()  # SIGTERM
    assert rc == 130, err
    assert "SIGTERM" in err


def test_a_non_utf8_file_name_is_called_that(tmp_path: Path) -> None:
    """Was: 'control character in file name'."""
    src = tmp_path / "src"
    src.mkdir()
    with open(os.path.join(os.fsencode(src), b"bad\xff.bin"), "wb") as fh:
        fh.write(b"x")
    # named as the SOURCE it is refused; inside a directory it is skipped (test_review_edges.py)
    proc = _rq(
        "send",
        os.fsdecode(os.path.join(os.fsencode(src), b"bad\xff.bin")),
        "rq://127.0.0.1:9",
        "--transport",
        "tcp",
    )
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "not valid UTF-8" in err, err


def test_overwrite_does_not_blame_a_missing_flag_for_a_directory_in_the_way(tmp_path: Path) -> None:
    """Was: with --overwrite given, a directory in the way still said 'pass --overwrite'."""
    (tmp_path / "dst" / "w.bin").mkdir(parents=True)
    src = tmp_path / "w.bin"
    src.write_bytes(b"weights")
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--overwrite").start()
    try:
        proc = rq_send([src], recv)
    finally:
        recv.stop()
    err = proc.stderr.decode()
    assert proc.returncode == 9, err
    assert "replaces files, not directories" in err and "pass --overwrite" not in err
