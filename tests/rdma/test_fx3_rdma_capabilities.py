"""RdmaChannel.readable() (the receiver's group commit of small chunks on idle) and progress() (the
sender's stall watch): on a channel over the pipe's in-memory loopback, then in a whole transfer
under the loopback harness."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakeport import FakePort
from test_driver_loopback import TOKEN, LoopbackQueuePair, loopback, receiver  # noqa: F401

from transfer import receiver as receiver_mod
from transfer.frames import FrameType, header
from transfer.rdma import driver
from transfer.rdma.driver import RdmaChannel, RdmaSettings, RdmaTransport
from transfer.rdma.pipe import Pipe, post_receives, recv_depth
from transfer.receiver import Receiver
from transfer.sender import SendOptions
from transfer.sender import send as do_send
from transfer.transport import ConnectOptions

SLOT = 4096


class _Bootstrap:
    """The TCP channel's surface an RdmaChannel uses after the switch."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def progress(self) -> int:
        return 0

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def pair() -> Iterator[tuple[RdmaChannel, RdmaChannel]]:
    pa, pb = FakePort(2, SLOT, 2, SLOT), FakePort(2, SLOT, 2, SLOT)
    pa.connect(pb)
    s1, s2 = socket.socketpair()
    chans = []
    for port, sock, acceptor in ((pa, s1, False), (pb, s2, True)):
        ch = RdmaChannel(_Bootstrap(sock), acceptor, RdmaSettings(), max_frame=1 << 20)
        post_receives(port, recv_depth(2, 2))
        ch.pipe = Pipe(port, 2, SLOT, 2, SLOT, 2, max_frame=1 << 20)
        chans.append(ch)
    yield chans[0], chans[1]
    for sock in (s1, s2):
        sock.close()


def test_readable_says_whether_a_frame_waits(pair: tuple[RdmaChannel, RdmaChannel]) -> None:
    # Old code: AttributeError (no readable): the receiver grouped small chunks by count alone.
    sender, recv = pair
    assert recv.readable() is False
    body = os.urandom(100)
    sender.send(header(FrameType.CHUNK, len(body)), body)
    assert recv.readable() is True  # the write is in the CQ, not yet polled: readable polls it
    assert recv.readable() is True  # asking again takes nothing away
    frame = recv.recv(timeout=10)
    assert frame is not None and bytes(frame.body) == body
    assert recv.readable() is False


def test_progress_counts_the_bytes_the_peer_has(pair: tuple[RdmaChannel, RdmaChannel]) -> None:
    # Old code: AttributeError (no progress): the sender's stall watch counted only ACKs on RDMA.
    sender, recv = pair
    assert sender.progress() == 0
    body = os.urandom(SLOT + 500)  # two slot fills: the peer's whole ring
    sender.send(header(FrameType.CHUNK, len(body)), body)
    assert sender.pipe is not None and sender.pipe.drain(time.monotonic() + 10)
    sent = len(header(FrameType.CHUNK, len(body))) + len(body)
    assert sender.progress() == sent
    # The peer reads nothing and so gives no slot back: nothing more can go out, progress stands.
    assert sender.pipe.out.available == 0
    assert sender.progress() == sent
    assert recv.recv(timeout=10) is not None


def test_a_transfer_has_readiness_and_progress(
    tmp_path: Path,
    loopback: type[LoopbackQueuePair],  # noqa: F811
    receiver: tuple[Receiver, ConnectOptions],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Old code: the receiver's readiness of every RDMA channel was unknown, the sender's channels had
    # no progress.
    known: list[bool] = []
    real_readiness = receiver_mod._Readiness

    def readiness(ch: Any) -> Any:
        r = real_readiness(ch)
        known.append(r.known)
        return r

    monkeypatch.setattr(receiver_mod, "_Readiness", readiness)
    opened: list[RdmaChannel] = []
    real_open = driver.RdmaConnection.open_channel

    def open_channel(self: Any) -> Any:
        ch = real_open(self)
        opened.append(ch)
        return ch

    monkeypatch.setattr(driver.RdmaConnection, "open_channel", open_channel)
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "a.bin").write_bytes(os.urandom(3 << 20))
    opts = SendOptions(connections=1, streams=1, chunk_size=1 << 20, compress="none", retry_for=2)
    summary = do_send([root], RdmaTransport(), receiver[1], TOKEN, opts)
    assert summary["complete"]
    assert known and all(known)
    assert opened and max(ch.progress() for ch in opened) >= 3 << 20
