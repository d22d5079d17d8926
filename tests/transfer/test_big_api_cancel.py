"""A training job cancels an in-process send by raising from its on_event callback: the send
ends with that exception, whatever the transport and --connections. Over QUIC with connections > 1
(transfer/procs.py) connection 0's thread turned the caller's exception into a
PeerUnreachableError, which the sender retried: the "cancelled" send went on and completed."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import pytest

from transfer.credentials import load_identity
from transfer.events import ChunkMoved, Event
from transfer.receiver import Receiver
from transfer.sender import SendOptions, send
from transfer.transport import ConnectOptions, ListenOptions, get_transport


class Cancelled(Exception):
    pass


@pytest.mark.parametrize("name,connections", [("quic", 2), ("quic", 1), ("tcp", 2)])
def test_an_exception_from_on_event_ends_the_send(tmp_path: Path, name: str, connections: int) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(100_000))  # 2 chunks of 64 KiB
    ident = load_identity(tmp_path / "cert")
    rx = Receiver(tmp_path / "dest", token=b"secret")
    transport = get_transport(name)
    lst = transport.listen(ListenOptions("127.0.0.1", 0, ident), rx.handle_channel)
    serving = threading.Thread(target=lst.serve_forever, daemon=True)
    serving.start()
    moved: list[Event] = []

    def cancel(ev: Event) -> None:
        if isinstance(ev, ChunkMoved):
            moved.append(ev)
            raise Cancelled  # every time: a job that cancelled stays cancelled

    copts = ConnectOptions("127.0.0.1", lst.address[1], pin=ident.fingerprint, timeout=10)
    opts = SendOptions(connections=connections, chunk_size=64 << 10, retry_for=5)
    try:
        with pytest.raises(Cancelled):
            send([src], transport, copts, b"secret", opts, on_event=cancel)
    finally:
        lst.close()
        serving.join(10)
        rx.close()
    assert moved, "no chunk was moved before the cancel"
    assert not (tmp_path / "dest" / "ckpt" / "w.bin").exists()  # (old code: placed, send returned)
    assert multiprocessing.active_children() == []
