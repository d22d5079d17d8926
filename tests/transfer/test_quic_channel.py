"""QuicChannel on real QUIC over loopback (aioquic and qh3), and the decoder's body pool.

A chunk is handed to the QUIC library by the event-loop thread straight from the caller's buffer,
so send() must not return before that copy happened (the sender reuses one read buffer for every
chunk), and must not wait for ever, nor let the loop read the buffer later, once the loop is gone.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib.util
import os
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from xfer_kit import Recv, require_o_direct, resident_pages, send, wait_for

from transfer import codec
from transfer.aligned import is_aligned
from transfer.credentials import load_identity
from transfer.errors import PeerUnreachableError, TransferError
from transfer.frames import (
    BodyPool,
    ChunkHeader,
    FrameDecoder,
    FrameType,
    chunk_frame_header,
    header,
    parse_chunk,
)
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
        failed: list[BaseException] = []

        def try_send() -> None:
            try:
                ch.send(header(FrameType.CHUNK, len(big)), big)
            except BaseException as exc:
                failed.append(exc)

        # in a thread, so that a send waiting for ever on the dead loop fails the test (after a
        # deadline a slow machine cannot reach: the send checks the loop every 0.5 s)
        sender = threading.Thread(target=try_send, daemon=True)
        sender.start()
        sender.join(30)
        assert not sender.is_alive(), "send still waits on a loop that stopped"
        assert len(failed) == 1 and isinstance(failed[0], PeerUnreachableError), failed
        assert "closed" in str(failed[0])
        big[:] = b"\x02" * len(big)  # reusable at once: nothing will read it any more


# -- CHUNK bodies in reused, page-aligned buffers -----------------------------------------------


def _chunk(i: int, size: int) -> tuple[bytes, bytes]:
    payload = bytes([i % 251]) * size
    head = ChunkHeader(0, i, size, 0, codec.digest(payload))
    return chunk_frame_header(head, size), payload


def test_decoder_puts_big_chunk_bodies_in_pool_buffers_aligned_for_o_direct() -> None:
    pool = BodyPool()
    dec = FrameDecoder(8 << 20, pool)
    size = 1 << 20
    first, second = _chunk(1, size), _chunk(2, size)
    stream = b"".join([*first, header(FrameType.FLUSH, 0), *second])
    frames = []
    for i in range(0, len(stream), 16383):  # as datagrams deliver it
        frames += dec.feed(stream[i : i + 16383])
    chunk1, flush, chunk2 = frames
    assert flush.type is FrameType.FLUSH and flush.lease is None  # small frames: plain buffers
    for frame, (_, payload) in ((chunk1, first), (chunk2, second)):
        _, got = parse_chunk(frame.body)
        assert bytes(got) == payload and frame.lease is not None
        assert is_aligned(got)  # what lets the store write it around the page cache
    assert chunk1.lease is not chunk2.lease  # both were lent at once: two buffers


def test_a_given_back_buffer_takes_the_next_chunk() -> None:
    pool = BodyPool()
    dec = FrameDecoder(8 << 20, pool)
    (a,) = dec.feed(b"".join(_chunk(1, 1 << 20)))
    assert a.lease is not None
    lease = a.lease
    pool.give(lease)
    (b,) = dec.feed(b"".join(_chunk(2, (1 << 20) - 4096)))  # a shorter last chunk fits it too
    assert b.lease is lease
    assert bytes(parse_chunk(b.body)[1]) == bytes([2]) * ((1 << 20) - 4096)


@pytest.mark.parametrize("backend", BACKENDS)
def test_quic_receiver_writes_chunks_around_the_page_cache(tmp_path: Path, backend: str) -> None:
    """A disk destination gets the chunks with O_DIRECT from the pool's aligned buffers: after the
    transfer the file is whole and (but for its unaligned tail) not in the page cache. Buffered
    writes left all of it there, and cost this VM seconds of system time per GiB."""
    require_o_direct(tmp_path)
    src = tmp_path / "src.bin"
    data = os.urandom((24 << 20) + 5000)
    src.write_bytes(data)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", "--once", "--quic-backend", backend).start()
    try:
        proc = send([src], recv, "--quic-backend", backend, "--chunk-size", "4MiB", "--compress", "none")
        assert proc.returncode == 0, proc.stderr.decode()
        rc, _, err = recv.wait()
    finally:
        recv.stop()
    assert rc == 0, err
    out = tmp_path / "dst" / "src.bin"
    cached = resident_pages(out)
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert cached <= 2, f"{cached} pages of the received file went through the page cache"


def test_a_full_pool_lets_the_smallest_buffer_go_and_takes_the_best_fit() -> None:
    pool = BodyPool(keep=2)
    big, mid, small = pool.take(4 << 20), pool.take(1 << 20), pool.take(100_000)
    for buf in (big, small, mid):
        pool.give(buf)
    # full at two: the small one went, so short chunks cannot crowd out full-size ones
    assert pool.take(3 << 20) is big
    assert pool.take(100_000) is mid  # the smallest that fits, not the first
    pool.give(big)
    pool.clear()
    assert pool.take(64 << 10) is not big


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_closed_channel_lets_its_buffers_go_without_the_garbage_collector(
    tmp_path: Path, backend: str
) -> None:
    """A channel and its connection's protocol refer to each other, so only the cyclic collector
    frees them; the pool's chunk-sized buffers must not wait for it (a long-running `rq recv`
    grew by up to 8 of them per finished stream)."""
    buffers: list[weakref.ref[object]] = []
    distinct: set[int] = set()  # buffers alive at once while the chunks were read
    done = threading.Event()

    def handler(ch: Channel) -> None:
        assert isinstance(ch, QuicChannel)
        ch.frame_limit = None
        # let several chunks queue up, each in a buffer of its own (a fixed pause was not always
        # enough on a loaded machine: one chunk queued, read, its buffer reused: distinct 1)
        wait_for(lambda: ch.frames.qsize() >= 2, 30)
        try:
            while (frame := ch.recv(timeout=20)) is not None:
                if frame.lease is not None:
                    buffers.append(weakref.ref(frame.lease.obj))
                    distinct.add(id(frame.lease.obj))
                del frame
        finally:
            ch.close()
            done.set()

    size = 1 << 20
    gc.disable()
    try:
        with quic_pair(tmp_path, backend, handler) as conn:  # type: ignore[arg-type]
            ch = conn.open_channel()
            payload = bytearray(size)
            for _ in range(6):
                ch.send(header(FrameType.CHUNK, size), payload)
            ch.close()
            assert done.wait(30)
        assert len(buffers) == 6 and len(distinct) >= 2
        assert wait_for(lambda: all(r() is None for r in buffers), 30), "pool buffers outlived their channel"
    finally:
        gc.enable()


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_gives_the_port_back(tmp_path: Path, backend: str) -> None:
    """close() stopped the loop before the transport's own close ran: the UDP port stayed bound,
    and listening on it again in the same process failed with EADDRINUSE."""
    ident = load_identity(tmp_path / "cert")
    extra = {"quic_backend": backend}
    lst = QuicListener(ListenOptions("127.0.0.1", 0, ident, extra=extra), Collector())
    port = lst.address[1]
    for _ in range(5):
        lst.close()
        lst = QuicListener(ListenOptions("127.0.0.1", port, ident, extra=extra), Collector())
    lst.close()
