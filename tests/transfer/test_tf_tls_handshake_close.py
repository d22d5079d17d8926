"""TcpListener.close() ends a connection still in its TLS handshake too, as it ends connected
channels (d0cd086). Before, a peer that connected, began a handshake (its first byte, a TLS
record's 0x16) and sent nothing more kept its handler thread in ssl's handshake, where close()
could not reach it (the socket it cut was the one wrap_socket had emptied): close() waited out its
CLOSE_GRACE + CLOSE_LIMIT and returned with the thread still there until the handshake's own 10 s
timeout. A peer that sends nothing at all is ended too."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
from xfer_kit import wait_for

from transfer.credentials import load_identity
from transfer.tcp import TcpListener
from transfer.transport import Channel, ListenOptions


def _handlers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive() and "_serve_one" in t.name}


def _read_to_end(peer: socket.socket) -> None:
    """Returns once the receiver's end is closed (what it sent first, a TLS alert, is read past);
    a connection left open raises TimeoutError after the peer's 10 s."""
    try:
        while peer.recv(4096):
            pass
    except ConnectionResetError:
        pass


@pytest.mark.parametrize(
    "first", [b"", b"\x16", b"\x16\x03\x01\x00"], ids=["nothing", "tls-byte", "tls-header"]
)
def test_close_ends_a_connection_in_its_tls_handshake(tmp_path: Path, first: bytes) -> None:
    handled: list[Channel] = []
    listener = TcpListener(
        ListenOptions("127.0.0.1", 0, load_identity(tmp_path / "cert"), tls=True), handled.append
    )
    server = threading.Thread(target=listener.serve_forever, name="tf-serve", daemon=True)
    before = _handlers()
    server.start()
    peer = socket.create_connection(("127.0.0.1", listener.address[1]), timeout=10)
    try:
        if first:
            peer.sendall(first)
        assert wait_for(lambda: len(_handlers() - before) == 1, 10)
        listener.close()
        # close() returned: the handler that was in the handshake has ended, and nothing was handled
        assert sorted(t.name for t in _handlers() - before) == []
        assert handled == []
        peer.settimeout(10)
        _read_to_end(peer)  # the connection was closed, not left open
    finally:
        peer.close()
        listener.close()
        server.join(10)
