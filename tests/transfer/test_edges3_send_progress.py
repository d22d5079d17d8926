"""The sender's progress never goes back after a reconnect.

A link that drops mid-transfer loses the chunks in flight: the receiver's ACCEPT on the reconnect
lists fewer bytes than were sent, and rq send's bar, set to TransferPlanned.have_bytes and advanced
by each ChunkMoved, jumped back (40% -> 24% was seen). SendProgress, the figure the bar shows now,
stays where it was until the transfer passes it again, and ends at the total."""

from __future__ import annotations

import io
import os
import socket
import threading
from pathlib import Path

from xfer_kit import TOKEN, BarSpy, Recv, Relay

from transfer.events import ChunkMoved, Event, SendProgress, TransferPlanned
from transfer.sender import SendOptions, send
from transfer.transport import ConnectOptions, get_transport

CHUNK = 64 * 1024
CHUNKS = 12


class Drop(Relay):
    """Each connection made before `cut()` carries only its first `keep` bytes to the receiver
    (the rest is lost on the way, as over a link going down); `cut()` breaks them all, and the
    connections made after it carry everything."""

    def __init__(self, target_port: int, keep: int):
        super().__init__(target_port)
        self.keep = keep
        self.before: list[socket.socket] = []
        self.done = False
        self.local = threading.local()

    def accepted(self, client: socket.socket) -> None:
        if not self.done:
            self.before.append(client)

    def _pump(self, src: socket.socket, dst: socket.socket, outbound: bool) -> None:
        self.local.lossy = outbound and src in self.before
        super()._pump(src, dst, outbound)

    def carry(self, data: bytes, seen: int) -> bytes:
        return data[: max(0, self.keep - seen)] if self.local.lossy else data

    def cut(self) -> None:
        self.done = True
        for c in self.before:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def test_progress_does_not_go_back_when_the_link_drops(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    data = os.urandom(CHUNKS * CHUNK)
    src.write_bytes(data)
    recv = Recv(tmp_path / "dest", tmp_path / "certs", "tcp", "--once").start()
    # the handshake and about the first chunk reach the receiver over each connection, no more
    relay = Drop(recv.port, keep=CHUNK + 4096)
    events: list[Event] = []
    lock = threading.Lock()

    def on_event(ev: Event) -> None:
        with lock:
            events.append(ev)
            moved = sum(isinstance(e, ChunkMoved) for e in events)
        if isinstance(ev, ChunkMoved) and moved == 6 and not relay.done:
            relay.cut()  # 6 chunks sent, fewer arrived: the link goes down

    try:
        copts = ConnectOptions("127.0.0.1", relay.port, None, tls=False)
        opts = SendOptions(chunk_size=CHUNK, window=8, streams=1, compress="none")
        summary = send([src], get_transport("tcp"), copts, TOKEN.encode(), opts, on_event)
        assert summary["verified"], summary
        assert recv.wait(30)[0] == 0
    finally:
        relay.close()
        recv.stop()
    assert (tmp_path / "dest" / "a.bin").read_bytes() == data
    plans = [i for i, e in enumerate(events) if isinstance(e, TransferPlanned)]
    assert len(plans) >= 2, plans  # it reconnected
    sent = sum(e.raw_bytes for e in events[: plans[1]] if isinstance(e, ChunkMoved))
    again = events[plans[1]]
    assert isinstance(again, TransferPlanned)
    assert again.have_bytes < sent, (again, sent)  # to a receiver holding less than was sent
    done = [e.done_bytes for e in events if isinstance(e, SendProgress)]
    assert done == sorted(done), done  # never back
    assert done[-1] == CHUNKS * CHUNK and max(done) == CHUNKS * CHUNK, done
    assert all(e.total_bytes == CHUNKS * CHUNK for e in events if isinstance(e, SendProgress))

    # what rq send's bar shows for the same events: never back either
    bar = BarSpy()
    from rqcli.commands.transfer import _send_progress
    from rqcli.output import Output

    show = _send_progress(Output(stdout=io.StringIO(), stderr=io.StringIO()), bar)
    for ev in events:
        show(ev)
    assert bar.shown == sorted(bar.shown) and bar.shown[-1] == CHUNKS * CHUNK, bar.shown
