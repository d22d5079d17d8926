"""RdmaListener.close() as TcpListener.close() (d0cd086): closing the listener, then its Receiver,
while a sender is connected mid-transfer and has gone quiet leaves no rq thread behind, and that
sender is told the receiver shut down (an ERROR `unreachable`, retried as a lost peer).

The threads were already joined (RdmaListener closes the TcpListener under it), but the RDMA
channel had no `shutting_down` of its own (the TCP listener set it on the bootstrap channel under
it), and the wake (the bootstrap's read side shut) broke the channel's pipe: the sender was told
nothing, only `the peer went away (its RDMA bootstrap connection broke)`. Runs on the loopback
queue pair of test_driver_loopback (no RDMA device); the sender's channels are driven by the
test, so nothing depends on timing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import assert_told_shut_down, receiver_threads, serving_receiver, wait_until
from test_driver_loopback import TOKEN, LoopbackQueuePair, loopback  # noqa: F401

from transfer import codec
from transfer.frames import ChunkHeader, chunk_frame_header
from transfer.manifest import FileEntry, file_key, make_manifest
from transfer.rdma import driver
from transfer.rdma.driver import Geometry, RdmaListener, RdmaSettings, RdmaTransport
from transfer.receiver import Receiver
from transfer.sender import handshake
from transfer.session import Accepted, Ready, SenderChannel

CHUNK = 1 << 20
SMALL_RECEIVER = Geometry(ring_slots=4, slot_size=1 << 20, staging=2, staging_size=64 << 10)


@pytest.fixture
def served(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loopback: type[LoopbackQueuePair],  # noqa: F811
) -> Iterator[tuple[Receiver, RdmaListener, Any]]:
    import test_driver_loopback as harness

    monkeypatch.setattr(driver, "RECEIVER", SMALL_RECEIVER)
    monkeypatch.setattr(harness, "RECEIVER", SMALL_RECEIVER)
    monkeypatch.setattr(
        RdmaSettings, "from_extra", classmethod(lambda cls, extra: cls(receiver=SMALL_RECEIVER))
    )
    rx = Receiver(tmp_path / "dst", TOKEN, keep_partial=None)
    with serving_receiver(rx, RdmaTransport(), tmp_path / "cert", tls=True) as (listener, conn):
        yield rx, listener, conn


def test_close_ends_the_handlers_of_a_paused_rdma_sender(served: tuple[Receiver, RdmaListener, Any]) -> None:
    rx, listener, conn = served
    before = receiver_threads()
    data = bytes(range(256)) * (3 * CHUNK // 256)
    entry = FileEntry(name="w.bin", size=len(data), mode=0o644, key=file_key("w.bin", len(data), 1, 7, CHUNK))
    m = make_manifest(CHUNK, [entry])
    ctl = conn.open_channel()
    assert isinstance(handshake(ctl, SenderChannel(TOKEN, "control", m, os.urandom(16)), 10), Accepted)
    dch = conn.open_channel()
    assert isinstance(handshake(dch, SenderChannel(TOKEN, "data", m, os.urandom(16)), 10), Ready)
    first = data[:CHUNK]
    kind, payload = codec.encode(first, "none", 1)
    dch.send(chunk_frame_header(ChunkHeader(0, 0, CHUNK, kind, codec.digest(first)), len(payload)), payload)
    # both channels' handlers are up (an RDMA channel's chunks are written inline: no writer thread)
    assert wait_until(lambda: len(receiver_threads() - before) >= 2), receiver_threads()
    assert wait_until(lambda: bool(rx.in_flight()))
    listener.close()
    rx.close()
    assert sorted(t.name for t in receiver_threads() - before) == []
    # the sender, acting again, reads why its channels ended: the receiver shut down
    assert_told_shut_down((ctl, dch))
