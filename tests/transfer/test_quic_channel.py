"""QuicChannel.send on real QUIC over loopback (aioquic and qh3).

A chunk is handed to the QUIC library by the event-loop thread straight from the caller's buffer,
so send() must not return before that copy happened (the sender reuses one read buffer for every
chunk), and must not wait for ever, nor let the loop read the buffer later, once the loop is gone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from xfer_kit import wait_for

from transfer.credentials import load_identity
from transfer.errors import PeerUnreachableError, TransferError
from transfer.frames import FrameType, header
from transfer.quic import COPY_BELOW, QuicChannel, QuicConnection, QuicListener
from transfer.transport import Channel, ConnectOptions, ListenOptions

pytestmark = pytest.mark.integration

BACKENDS = [b for b in ("aioquic", "qh3") if importlib.util.find_spec(b) is not None]


class Collector:
    """A listener handler that lifts the pre-auth frame limit and keeps every frame body."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.closed = threading.Event()

    def __call__(self, ch: Channel) -> None:
        assert isinstance(ch, QuicChannel)
        ch.frame_limit = None
        try:
            while (frame := ch.recv(timeout=20)) is not None:
                self.bodies.append(bytes(frame.body))
        except (TimeoutError, TransferError):
            pass  # the peer went away (the test that stops the sender's loop)
        finally:
            self.closed.set()


@contextlib.contextmanager
def quic_pair(tmp_path: Path, backend: str, handler: Collector) -> Iterator[QuicConnection]:
    ident = load_identity(tmp_path / "cert")
    extra = {"quic_backend": backend}
    lst = QuicListener(ListenOptions("127.0.0.1", 0, ident, extra=extra), handler)
    try:
        host, port = lst.address
        conn = QuicConnection(ConnectOptions(host, port, ident.fingerprint, extra=extra))
        try:
            yield conn
        finally:
            conn.close()
    finally:
        lst.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_caller_may_reuse_its_buffer_as_soon_as_send_returns(tmp_path: Path, backend: str) -> None:
    size = 1 << 20
    assert size > COPY_BELOW  # the path that does not copy in the caller's thread
    buf = bytearray(size)
    view = memoryview(buf)
    sent: list[bytes] = []
    got = Collector()
    with quic_pair(tmp_path, backend, got) as conn:
        ch = conn.open_channel()
        for i in range(12):
            buf[:] = bytes([i]) * size  # what a reader does with its one buffer for the next chunk
            ch.send(header(FrameType.CHUNK, size), view)
            sent.append(bytes(buf))
        ch.send(header(FrameType.FLUSH, 0))  # a small frame: copied, no waiting
        ch.close()
        assert got.closed.wait(30)
    assert got.bodies[:-1] == sent
    assert got.bodies[-1] == b""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_send_after_the_loop_stopped_fails_and_never_reads_the_buffer(tmp_path: Path, backend: str) -> None:
    got = Collector()
    with quic_pair(tmp_path, backend, got) as conn:
        ch = conn.open_channel()
        ch.send(header(FrameType.FLUSH, 0))
        assert wait_for(lambda: bool(got.bodies), 10)
        conn._lt.stop()  # the connection's event loop is gone (what a crashed loop thread looks like)
        big = bytearray(b"\x01" * (1 << 20))
        start = time.monotonic()
        with pytest.raises(PeerUnreachableError, match="closed"):
            ch.send(header(FrameType.CHUNK, len(big)), big)
        assert time.monotonic() - start < 5
        big[:] = b"\x02" * len(big)  # reusable at once: nothing will read it any more
