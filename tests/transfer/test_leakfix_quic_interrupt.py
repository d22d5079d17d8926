"""A KeyboardInterrupt (Ctrl-C in a process using rq as a library) that lands while a QUIC connect
or close waits on the loop thread went on up, and left that loop thread (`rq-quic-client`), its
executor thread and the socket behind for good: __init__ only cleaned up after TransferError and
OSError, close() only after Exception. A sender's reply reader blocked in QuicChannel.recv on a
channel already closed was never woken once the connection's loop stopped."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from transfer.credentials import load_identity
from transfer.quic import QuicConnection, QuicListener
from transfer.transport import Channel, ConnectOptions, ListenOptions

BACKENDS = [b for b in ("aioquic", "qh3") if importlib.util.find_spec(b) is not None]


def _state() -> tuple[int, int]:
    quic = [t for t in threading.enumerate() if t.name.startswith(("rq-quic-client", "asyncio_"))]
    return len(quic), len(os.listdir("/proc/self/fd"))


def _settled(before: tuple[int, int]) -> tuple[int, int]:
    for _ in range(50):  # an executor thread ends just after the loop closes
        now = _state()
        if now == before:
            break
        threading.Event().wait(0.02)
    return now


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()  # sockets left behind must not be closed by the cyclic collector meanwhile
    try:
        yield
    finally:
        gc.enable()


def _interrupt(monkeypatch: pytest.MonkeyPatch, which: str, ready: Callable[[], bool]) -> None:
    """The wait on the loop thread for coroutine `which` raises KeyboardInterrupt once ready()."""
    real = asyncio.run_coroutine_threadsafe

    def hooked(coro: Any, loop: asyncio.AbstractEventLoop) -> Any:
        fut = real(coro, loop)
        if getattr(coro, "__name__", "") == which:

            def result(timeout: float | None = None) -> Any:
                for _ in range(250):
                    if ready():
                        break
                    threading.Event().wait(0.02)
                raise KeyboardInterrupt

            fut.result = result  # type: ignore[method-assign]
        return fut

    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", hooked)


@pytest.mark.parametrize("backend", BACKENDS)
def test_interrupted_connect_leaves_no_thread_or_socket(
    monkeypatch: pytest.MonkeyPatch, no_gc: None, backend: str
) -> None:
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # takes the handshake, never answers
    silent.bind(("127.0.0.1", 0))
    heard = threading.Event()
    real_handshake = QuicConnection._handshake

    async def handshake(self: QuicConnection, *args: Any) -> None:
        heard.set()
        await real_handshake(self, *args)

    monkeypatch.setattr(QuicConnection, "_handshake", handshake)
    _interrupt(monkeypatch, "_connect", heard.is_set)
    opts = ConnectOptions("127.0.0.1", silent.getsockname()[1], "sha256:" + "00" * 32, timeout=5)
    opts.extra.update(quic_backend=backend, datagram_size=1200)
    try:
        before = _state()
        for _ in range(3):
            heard.clear()
            with pytest.raises(KeyboardInterrupt):
                QuicConnection(opts)
        after = _settled(before)
    finally:
        silent.close()
    # old code: 6 more threads (3 loop threads, 3 executor threads), 9 more descriptors
    assert after == before, f"(threads, fds) {before} -> {after}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_interrupted_close_ends_the_loop_and_wakes_a_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_gc: None, backend: str
) -> None:
    ident = load_identity(tmp_path / "cert")
    extra = {"quic_backend": backend}
    hold = threading.Event()

    def handler(ch: Channel) -> None:  # keeps its stream open: no FIN reaches the client
        hold.wait(5)
        ch.close()

    lst = QuicListener(ListenOptions("127.0.0.1", 0, ident, extra=extra), handler)
    try:
        host, port = lst.address
        before = _state()
        readers = []
        for i in range(2):
            conn = QuicConnection(ConnectOptions(host, port, ident.fingerprint, extra=extra))
            ch = conn.open_channel()
            ch.send(b"x" * 16)
            reader = threading.Thread(target=lambda c=ch: c.recv(None), daemon=True)
            reader.start()
            readers.append(reader)
            ch.close()  # as the sender's run_connection does before its connection goes
            if i == 0:
                conn.close()
                continue
            with monkeypatch.context() as m:
                _interrupt(m, "_close", lambda: True)
                with pytest.raises(KeyboardInterrupt):
                    conn.close()
        for reader in readers:
            reader.join(2)
        # old code: the interrupted close's loop thread stayed (and its socket); both readers blocked
        assert [r.is_alive() for r in readers] == [False, False]
        assert _settled(before) == before
    finally:
        hold.set()
        lst.close()
