"""A sender killed hard leaves its channels open on the receiver until they time out (QUIC's idle
timeout, ~10 s; a TCP peer whose host died: IDLE_TIMEOUT, 300 s). Meanwhile its transfer's plan stays
in Receiver._plans. A re-run of the same send must get what is on disk *now*: the old plan's view
(every chunk present, a file placed) made a re-send after the user deleted the received files fail
with exit 5 ("N chunks still missing at commit") with 0 chunks sent, for as long as the dead
channels lingered, and a file deleted while its transfer was open was placed as zeros."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from transfer.receiver import Receiver
from transfer.sender import SendOptions, handshake, send
from transfer.session import CONTROL, SenderChannel
from transfer.source import scan
from transfer.tcp import TcpTransport
from transfer.transport import Connection, ConnectOptions, Identity, ListenOptions

TOKEN = b"fix2-token-" + b"x" * 21
CS = 64 * 1024
OPTS = SendOptions(streams=1, chunk_size=CS, compress="none", retry_for=5.0)


@contextmanager
def _receiver(dest: Path) -> Iterator[tuple[Receiver, int]]:
    receiver = Receiver(dest, TOKEN)
    listener = TcpTransport().listen(
        ListenOptions("127.0.0.1", 0, Identity(b"", b"", ""), tls=False), receiver.handle_channel
    )
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    try:
        yield receiver, listener.address[1]
    finally:
        listener.close()
        receiver.close()


def _copts(port: int) -> ConnectOptions:
    return ConnectOptions("127.0.0.1", port, None, tls=False)


def _linger(port: int, sources: list[Path]) -> Connection:
    """A sender that planned the transfer (its MANIFEST accepted) and then went silent, its
    connection still open: what a killed sender's channels are to the receiver until they time out."""
    manifest, _ = scan(sources, CS, [])
    conn = TcpTransport().connect(_copts(port))
    ch = conn.open_channel()
    handshake(ch, SenderChannel(TOKEN, CONTROL, manifest, os.urandom(16)), 10.0)
    return conn


def _tree(root: Path) -> Path:
    src = root / "bigsrc"
    src.mkdir()
    (src / "part1").write_bytes(os.urandom(80 * CS + 123))  # journal kept after placing (> 64 chunks)
    (src / "part2").write_bytes(os.urandom(3 * CS))  # digests folded into its placed record
    return src


def test_resend_after_deleting_the_files_while_a_dead_senders_channel_lingers(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    dest = tmp_path / "dst"
    with _receiver(dest) as (_, port):
        dead = _linger(port, [src])  # the killed sender's control channel, not timed out yet
        try:
            first = send([src], TcpTransport(), _copts(port), TOKEN, OPTS)
            assert first["verified"] and first["chunks_sent"] == 84
            for name in ("part1", "part2"):
                os.unlink(dest / "bigsrc" / name)
            again = send([src], TcpTransport(), _copts(port), TOKEN, OPTS)  # old: VerifyError
            assert again["verified"] and again["chunks_sent"] == 84, again
            for name in ("part1", "part2"):
                assert (dest / "bigsrc" / name).read_bytes() == (src / name).read_bytes()
            # and once more with the files in place: nothing to send, "complete"
            third = send([src], TcpTransport(), _copts(port), TOKEN, OPTS)
            assert third["verified"] and third["chunks_sent"] == 0
        finally:
            dead.close()
    left = sorted(os.listdir(dest / ".rq-partial"))
    assert not [n for n in left if n.endswith((".live", ".owner", ".manifest.json", ".part"))], left


def test_a_placed_file_deleted_while_its_transfer_is_open_is_sent_again_not_placed_as_zeros(
    tmp_path: Path,
) -> None:
    src = _tree(tmp_path)
    dest = tmp_path / "dst"
    with _receiver(dest) as (_, port):
        send([src], TcpTransport(), _copts(port), TOKEN, OPTS)
        (src / "part3").write_bytes(os.urandom(2 * CS))  # a new shard: a new transfer, 1 and 2 in place
        dead = _linger(port, [src])  # its sender planned it and died
        try:
            os.unlink(dest / "bigsrc" / "part2")  # deleted on the receiver meanwhile
            got = send([src], TcpTransport(), _copts(port), TOKEN, OPTS)
            assert got["verified"]
            assert got["chunks_sent"] == 3 + 2, got  # old: 2 (part2 was taken as still there)
        finally:
            dead.close()
    for name in ("part1", "part2", "part3"):
        assert (dest / "bigsrc" / name).read_bytes() == (src / name).read_bytes(), name


def test_a_worker_process_takes_the_new_plan_of_a_transfer_it_still_holds_open(tmp_path: Path) -> None:
    """rq recv --workers: data channels go to other processes, which join the plan the control
    channel's process made. A killed sender's data channels kept a worker's plan open with a file
    'placed, every chunk present'; the new sender's MANIFEST, planned again in the first process
    after that file was deleted, was told it has none of it, but the worker ACKed its chunks
    unwritten (Plan.has) and the commit found them missing (exit 5). Two Stores with one owner
    stand for the two processes; a Receiver for the worker."""
    from transfer import codec
    from transfer.manifest import FileEntry, file_key, make_manifest
    from transfer.store import Store

    def entry(name: str, size: int, inode: int) -> FileEntry:
        return FileEntry(name, size, 0o644, file_key(name, size, 1, inode, CS))

    dest = tmp_path / "dst"
    a, b = os.urandom(2 * CS), os.urandom(CS)
    control = Store(dest, owner="one-receiver")
    first = make_manifest(CS, [entry("a.bin", len(a), 1)])
    plan = control.plan(first)
    plan.write(0, 0, a[:CS])
    plan.write(0, 1, a[CS:])
    plan.make_durable([(0, k, codec.digest(a[k * CS : (k + 1) * CS])) for k in range(2)])
    plan.finalize([codec.root_digest([codec.digest(a[:CS]), codec.digest(a[CS:])]).hex()], False)

    second = make_manifest(CS, [entry("a.bin", len(a), 1), entry("b.bin", len(b), 2)])
    control.plan(second).close()  # the sender that was then killed planned it...
    worker = Receiver(dest, TOKEN, owner="one-receiver")
    held = worker._acquire(second.transfer_id, None)  # ...and its data channel still holds it here
    assert held.plan.has(0, 0)  # a.bin: in place, every chunk present
    os.unlink(dest / "a.bin")
    control.plan(second).close()  # a new sender: planned again, a.bin to be sent again
    joined = worker._acquire(second.transfer_id, None)  # its data channel in the worker
    assert joined is held
    assert not joined.plan.has(0, 0), "the worker would ACK a.bin's chunks without writing them"
    worker._release(second.transfer_id, joined)
    worker._release(second.transfer_id, held)
    worker.close()
    control.close()
