"""Closing a listener, then its Receiver, while a sender is connected mid-transfer and has stopped
sending (paused: SIGSTOP, a stalled host) leaves no rq thread behind, and that sender is told the
receiver shut down (retried as a lost peer), not "receiver refused: transfer already finished".

Before, the listener only stopped accepting: the channel's handler (`_serve_one`) and its writer
thread (`rq-recv-write`) stayed alive until the sender acted again, and then refused it for good.
The sender here is a pair of channels that planned a transfer and sent a chunk through the sender's
own handshake, then send nothing more (the gate: they act only when the test says), so nothing
depends on timing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import assert_told_shut_down, receiver_threads, serving_receiver
from xfer_kit import TOKEN, wait_for

from transfer import codec, receiver
from transfer.errors import PeerUnreachableError
from transfer.frames import (
    HEADER,
    ChunkHeader,
    Frame,
    chunk_frame_header,
    parse_header,
)
from transfer.manifest import FileEntry, Limits, file_key, make_manifest
from transfer.receiver import Receiver
from transfer.sender import handshake
from transfer.session import Accepted, Ready, ReceiverChannel, SenderChannel
from transfer.tcp import TcpListener
from transfer.transport import get_transport

CHUNK = 1 << 20  # past receiver.INLINE_BELOW: written by the channel's writer thread


@pytest.fixture(params=["tcp", "quic"])
def served(request: Any, tmp_path: Path) -> Iterator[tuple[Receiver, Any, Any]]:
    """A receiver and its listener in this process, and how a sender connects to it."""
    rx = Receiver(tmp_path / "dst", TOKEN.encode(), keep_partial=None)
    transport = get_transport(request.param)
    with serving_receiver(rx, transport, tmp_path / "cert", tls=request.param == "quic") as (listener, conn):
        yield rx, listener, conn


def _planned(conn: Any) -> tuple[Any, Any]:
    """A sender that planned a 3-chunk transfer, sent its first chunk on a data channel and went
    quiet (the gate: it acts again only when the test says): its control and data channels,
    through the sender's own handshake."""
    data = bytes(range(256)) * (3 * CHUNK // 256)
    entry = FileEntry(name="w.bin", size=len(data), mode=0o644, key=file_key("w.bin", len(data), 1, 7, CHUNK))
    m = make_manifest(CHUNK, [entry])
    ctl = conn.open_channel()
    assert isinstance(
        handshake(ctl, SenderChannel(TOKEN.encode(), "control", m, os.urandom(16)), 10), Accepted
    )
    dch = conn.open_channel()
    assert isinstance(handshake(dch, SenderChannel(TOKEN.encode(), "data", m, os.urandom(16)), 10), Ready)
    first = data[:CHUNK]
    kind, payload = codec.encode(first, "none", 1)
    dch.send(chunk_frame_header(ChunkHeader(0, 0, CHUNK, kind, codec.digest(first)), len(payload)), payload)
    return ctl, dch


def test_close_ends_the_handlers_of_a_paused_sender(served: tuple[Receiver, Any, Any]) -> None:
    rx, listener, conn = served
    before = receiver_threads()
    ctl, dch = _planned(conn)
    # both channels' handlers are up, and over TCP the data channel's writer (its chunk went to it)
    up = 3 if isinstance(listener, TcpListener) else 2
    assert wait_for(lambda: len(receiver_threads() - before) >= up, 10), receiver_threads()
    assert wait_for(lambda: bool(rx.in_flight()), 10)
    listener.close()
    rx.close()
    # close() returned: nothing of the receiving side is left running
    assert sorted(t.name for t in receiver_threads() - before) == []
    # the sender, acting again, reads why its channels ended: the receiver shut down
    assert_told_shut_down((ctl, dch))


def test_sender_reads_the_shut_down_as_a_lost_peer_not_a_refusal() -> None:
    """What a sender's core makes of that ERROR: a PeerUnreachableError (retried like a lost
    connection; a re-run resumes), worded "receiver: …", not "receiver refused: …"."""
    m = make_manifest(CHUNK, [])
    rx_core = ReceiverChannel(TOKEN.encode(), b"n" * 16, Limits())
    rx_core.fail(PeerUnreachableError(receiver.SHUT_DOWN))
    raw = memoryview(rx_core.outbox[0])
    kind, length = parse_header(raw[: HEADER.size], 1 << 20)
    frame = Frame(kind, raw[HEADER.size : HEADER.size + length])
    assert frame.json()["code"] == PeerUnreachableError.code
    core = SenderChannel(TOKEN.encode(), "control", m, b"c" * 16)
    with pytest.raises(PeerUnreachableError) as got:
        core.handle(frame)
    assert str(got.value) == f"receiver: {receiver.SHUT_DOWN}"
