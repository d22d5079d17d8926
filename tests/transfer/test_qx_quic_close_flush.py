"""A QUIC sender reads what the receiver sent before it takes an ICMP "port unreachable" for the
receiver's end.

When `rq recv` shut down, its last datagrams (the ERROR "shut down", the FIN, the connection's
close) reached the sender's socket, but a datagram the sender sent meanwhile (an ACK, a keepalive)
met the closed port, and Linux reports that ICMP error from the next send or recvfrom before the
datagrams already queued: the sender failed its channels with "receiver is not listening (ICMP
port unreachable)" and never read the ERROR (test_lst_close_joins failed about 1 run in 6-15 for
QUIC). Now the datagrams queued are read first, then the refusal is told.

Deterministic: a connected UDP socket with a datagram queued and the ICMP answer to its own send
to the closed port pending, read through the QUIC reader and the client protocol."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from transfer import quic
from transfer.errors import PeerUnreachableError


class _Channel:
    def __init__(self, seen: list[Any]) -> None:
        self.seen = seen

    def fail(self, exc: BaseException) -> None:
        self.seen.append(str(exc))


def _peer_of(sock: socket.socket) -> socket.socket:
    """A peer `sock` (bound) is connected to."""
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    sock.connect(peer.getsockname())
    return peer


def _refused_after(sock: socket.socket, peer: socket.socket) -> None:
    """`sock` gets b"last words" queued from its peer, which then closes its port, and an ICMP
    refusal pending for its own send to it."""
    peer.sendto(b"last words", sock.getsockname())
    peer.close()
    sock.send(b"ack")  # to the closed port: loopback answers with ICMP port unreachable


class _Endpoint:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.seen.append(data)

    def error_received(self, exc: Exception) -> None:
        self.seen.append(type(exc))


def _until(loop: asyncio.AbstractEventLoop, seen: list[Any], n: int) -> None:
    async def _wait() -> None:
        while len(seen) < n:
            await asyncio.sleep(0.01)

    loop.run_until_complete(asyncio.wait_for(_wait(), 10))


def test_the_reader_reads_queued_datagrams_before_the_refusal() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    _refused_after(sock, _peer_of(sock))
    sock.setblocking(False)
    loop = asyncio.new_event_loop()
    endpoint = _Endpoint()
    try:
        loop._add_reader(sock.fileno(), lambda: None)  # type: ignore[attr-defined]  # the transport's
        quic._read_bursts(loop, sock, endpoint, quic._Burst())
        _until(loop, endpoint.seen, 2)
        assert endpoint.seen == [b"last words", ConnectionRefusedError]
    finally:
        loop._remove_reader(sock.fileno())  # type: ignore[attr-defined]
        loop.close()
        sock.close()


@pytest.mark.parametrize("backend", ["qh3", "aioquic"])
def test_a_send_refused_reads_what_came_first(backend: str) -> None:
    """The refusal that the client's own send meets (its next ACK or keepalive): what the receiver
    sent before reaches the protocol before its channels fail."""
    try:
        b = quic.pick_backend(backend)
    except Exception as exc:
        pytest.skip(str(exc))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    peer = _peer_of(sock)
    loop = asyncio.new_event_loop()
    seen: list[Any] = []
    try:
        burst = quic._Burst()
        proto_cls = quic._protocol_class(b, lambda _p, _s: None, burst)
        conn = b.connection.QuicConnection(configuration=quic._config(b, True, 1200))

        async def _open() -> Any:
            _, proto = await loop.create_datagram_endpoint(lambda: proto_cls(conn), sock=sock)
            return proto

        proto = loop.run_until_complete(_open())
        quic._read_bursts(loop, sock, proto, burst)
        proto.channels[0] = _Channel(seen)
        proto.datagram_received = lambda data, addr: seen.append(bytes(data))
        _refused_after(sock, peer)
        proto._transport.sendto(b"ack")  # meets the pending ICMP error: error_received
        _until(loop, seen, 2)
        assert seen == [b"last words", "receiver is not listening (ICMP port unreachable)"]
        assert isinstance(PeerUnreachableError(seen[1]), PeerUnreachableError)
    finally:
        for t in asyncio.all_tasks(loop):
            t.cancel()
        loop.close()
        sock.close()
        peer.close()
