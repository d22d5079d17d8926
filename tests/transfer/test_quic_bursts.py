"""The QUIC driver's burst reader, on real UDP sockets and a real selector loop.

aioquic's protocol transmits after every datagram it takes in; rq's reader drains what waits on
the socket in one loop callback and has each connection that took datagrams in transmit once.
The endpoint here is a stand-in for aioquic's QuicServer or connection protocol: it records what
reached it and marks a connection touched, as rq's protocol class does inside a burst.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from transfer.quic import BURST, _Burst, _read_bursts


class Conn:
    def __init__(self) -> None:
        self.transmits = 0

    def transmit(self) -> None:
        self.transmits += 1


class Endpoint:
    def __init__(self, burst: _Burst, conns: dict[bytes, Conn]) -> None:
        self.burst, self.conns = burst, conns
        self.got: list[bytes] = []
        self.errors: list[OSError] = []
        self.open_while_receiving: list[bool] = []

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.got.append(data)
        self.open_while_receiving.append(self.burst.open)
        self.burst.touched.add(self.conns[data[:1]])

    def error_received(self, exc: OSError) -> None:
        self.errors.append(exc)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def _pair() -> tuple[socket.socket, socket.socket]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(rx.getsockname())
    return rx, tx


def _turns(loop: asyncio.AbstractEventLoop, n: int) -> None:
    """Runs n iterations of the loop (each runs the reader once if the socket is readable)."""
    for _ in range(n):
        loop.run_until_complete(asyncio.sleep(0))


def test_one_callback_drains_the_socket_and_each_connection_transmits_once(
    loop: asyncio.AbstractEventLoop,
) -> None:
    rx, tx = _pair()
    try:
        conns = {b"a": Conn(), b"b": Conn()}
        burst = _Burst()
        ep = Endpoint(burst, conns)
        _read_bursts(loop, rx, ep, burst)
        sent = [(b"a" if i % 3 else b"b") + i.to_bytes(4, "big") for i in range(20)]
        for d in sent:
            tx.send(d)
        _turns(loop, 1)
        assert ep.got == sent  # every datagram, in order, in one callback
        assert all(ep.open_while_receiving) and not burst.open
        assert conns[b"a"].transmits == 1 and conns[b"b"].transmits == 1
        assert not burst.touched
        _turns(loop, 3)  # nothing new arrived: nobody transmits again
        assert conns[b"a"].transmits == 1 and conns[b"b"].transmits == 1
    finally:
        rx.close()
        tx.close()


def test_a_flood_is_read_a_burst_at_a_time(loop: asyncio.AbstractEventLoop) -> None:
    rx, tx = _pair()
    try:
        conn = Conn()
        burst = _Burst()
        ep = Endpoint(burst, {b"a": conn})
        _read_bursts(loop, rx, ep, burst)
        for i in range(BURST + 10):
            tx.send(b"a" + i.to_bytes(4, "big"))
        seen: list[int] = []
        conn.transmit = lambda: seen.append(len(ep.got))  # type: ignore[method-assign]
        _turns(loop, 3)
        # a callback stops after BURST datagrams (the loop gets its turn back); the next takes the rest
        assert seen == [BURST, BURST + 10]
    finally:
        rx.close()
        tx.close()


def test_a_refused_peer_reaches_error_received(loop: asyncio.AbstractEventLoop) -> None:
    """A connected socket whose peer port is closed gets ICMP port unreachable: the driver's
    client gives up on the receiver at once on it, so the reader must pass it on."""
    rx, tx = _pair()
    gone = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    gone.bind(("127.0.0.1", 0))
    dead = gone.getsockname()
    gone.close()
    try:
        burst = _Burst()
        ep = Endpoint(burst, {b"a": Conn()})
        rx.connect(dead)
        _read_bursts(loop, rx, ep, burst)
        rx.send(b"a-to-nobody")
        for _ in range(50):
            _turns(loop, 1)
            if ep.errors:
                break
        assert ep.errors and isinstance(ep.errors[0], ConnectionRefusedError)
        assert not burst.open and not burst.touched
    finally:
        rx.close()
        tx.close()
