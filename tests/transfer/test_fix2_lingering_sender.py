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
