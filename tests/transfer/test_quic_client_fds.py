"""A process that sends many checkpoints through the library (a training job) keeps no UDP socket
per QUIC connection it closed or failed to make: QuicConnection.close() only closed the QUIC
connection and left the datagram socket to the garbage collector, as did a connect refused for a
wrong pin; QuicListener.close() left its transport unclosed too (ResourceWarning)."""

from __future__ import annotations

import gc
import importlib.util
import os
import warnings
from pathlib import Path

import pytest

from transfer.credentials import load_identity
from transfer.errors import AuthError
from transfer.quic import QuicConnection, QuicListener
from transfer.transport import Channel, ConnectOptions, ListenOptions

BACKENDS = [b for b in ("aioquic", "qh3") if importlib.util.find_spec(b) is not None]


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _ignore(ch: Channel) -> None:
    ch.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_closed_and_refused_connections_give_their_sockets_back(tmp_path: Path, backend: str) -> None:
    ident = load_identity(tmp_path / "cert")
    extra = {"quic_backend": backend}
    gc.collect()
    gc.disable()  # the leak hid behind the cyclic collector
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            lst = QuicListener(ListenOptions("127.0.0.1", 0, ident, extra=extra), _ignore)
            host, port = lst.address
            before = _fds()
            for _ in range(3):
                QuicConnection(ConnectOptions(host, port, ident.fingerprint, extra=extra)).close()
            wrong = "sha256:" + "00" * 32
            with pytest.raises(AuthError):
                QuicConnection(ConnectOptions(host, port, wrong, extra=extra, timeout=3))
            after = _fds()
            lst.close()
            gc.enable()
            gc.collect()
        assert after == before, f"{after - before} descriptors left by 4 connections"  # (old code: 4)
        leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert not leaks, leaks
    finally:
        gc.enable()
