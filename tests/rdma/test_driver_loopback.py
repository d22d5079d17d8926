"""The whole RDMA driver — TLS bootstrap, token check, connection-info exchange, switch to the queue
pair, goodbye — under the real transfer glue, with the adapter replaced by an in-memory loopback.

A logic test: it shows the driver and the glue fit together and that setup failures tear down
cleanly. The proof that bytes move over real RDMA is test_e2e.py (marker rdma).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fakeport import FakePort

from transfer.credentials import load_identity
from transfer.errors import AuthError, ProtocolError
from transfer.rdma import conninfo, verbs
from transfer.rdma.conninfo import ConnInfo, Ring
from transfer.rdma.driver import RECEIVER, RdmaTransport
from transfer.receiver import Receiver
from transfer.sender import SendOptions
from transfer.sender import send as do_send
from transfer.transport import ConnectOptions, ListenOptions

GID = conninfo.gid_from_text("::ffff:10.0.0.2")
TOKEN = b"loopback-token"


class LoopbackQueuePair:
    """verbs.QueuePair's surface over a FakePort; connect() wires it to the peer's by QP number."""

    registry: ClassVar[dict[int, LoopbackQueuePair]] = {}
    numbers = itertools.count(100)
    hostile = False  # the receiver side offers a ring no one may accept

    def __init__(
        self, dev: Any, ring_slots: int, ring_slot_size: int, staging: int, staging_size: int, depth: int
    ):
        self.port = FakePort(ring_slots, ring_slot_size, staging, staging_size)
        self.qpn = next(self.numbers)
        self.registry[self.qpn] = self
        self.slots, self.slot_size = ring_slots, ring_slot_size
        self.closed = False
        self.acceptor = ring_slot_size == RECEIVER.slot_size  # the receiver's ring takes the bulk

    def local_info(self) -> ConnInfo:
        size = 100 if (self.hostile and self.acceptor) else self.slot_size
        ring = Ring(addr=self.qpn << 32, rkey=self.qpn, slot_size=size, count=self.slots)
        return ConnInfo(self.qpn, 1, 0, 1, 0, GID, conninfo.LINK_ETHERNET, 3, ring)

    def connect(self, peer: ConnInfo, mtu: int) -> None:
        self.port.peer = self.registry[peer.qp_num].port

    def close(self) -> None:
        self.closed = True
        self.port.dead = True

    def __getattr__(self, name: str) -> Any:  # staging, ring_slot, post_*, poll
        return getattr(self.port, name)


@pytest.fixture
def loopback(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[LoopbackQueuePair]]:
    LoopbackQueuePair.registry = {}
    LoopbackQueuePair.hostile = False
    monkeypatch.setattr(verbs, "open_device", lambda *a: "device")
    monkeypatch.setattr(verbs, "QueuePair", LoopbackQueuePair)
    yield LoopbackQueuePair


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[Receiver, ConnectOptions]]:
    identity = load_identity(tmp_path / "certs")
    recv = Receiver(tmp_path / "dest", TOKEN)
    listener = RdmaTransport().listen(ListenOptions("127.0.0.1", 0, identity, tls=False), recv.handle_channel)
    server = threading.Thread(target=listener.serve_forever, daemon=True)
    server.start()
    host, port = listener.address
    # tls=False on both sides: the driver bootstraps over TLS anyway and checks the pin.
    yield recv, ConnectOptions(host, port, identity.fingerprint, tls=False, timeout=5)
    listener.close()
    server.join(5)
    recv.close()


def _checkpoint(root: Path) -> dict[str, bytes]:
    root.mkdir()
    files = {
        "shard-0.bin": os.urandom(5 * (1 << 20) + 3),
        "shard-1.bin": os.urandom(70_000),
        "index.json": b"{}",
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


def test_transfer_moves_chunks_over_the_queue_pair(
    tmp_path: Path, loopback: type[LoopbackQueuePair], receiver: tuple[Receiver, ConnectOptions]
) -> None:
    files = _checkpoint(tmp_path / "ckpt")
    opts = SendOptions(connections=1, streams=2, chunk_size=1 << 20, compress="none")
    summary = do_send([tmp_path / "ckpt"], RdmaTransport(), receiver[1], TOKEN, opts)
    assert summary["bytes_raw"] == sum(len(d) for d in files.values())
    for name, data in files.items():
        assert (tmp_path / "dest" / "ckpt" / name).read_bytes() == data
    qps = list(loopback.registry.values())
    sent = sum(q.port.bytes_written for q in qps if not q.acceptor)
    assert sent >= len(files["shard-0.bin"])  # the chunks went over the queue pairs, not TCP
    assert all(q.port.violations == [] for q in qps)  # and never into a slot not given back
    assert _eventually(lambda: all(q.closed for q in qps))  # every queue pair torn down


def _eventually(check: Callable[[], bool], seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_wrong_token_never_gets_a_queue_pair(
    tmp_path: Path, loopback: type[LoopbackQueuePair], receiver: tuple[Receiver, ConnectOptions]
) -> None:
    _checkpoint(tmp_path / "ckpt")
    with pytest.raises(AuthError):
        do_send([tmp_path / "ckpt"], RdmaTransport(), receiver[1], b"wrong", SendOptions(retry_for=2))
    assert loopback.registry == {}  # authentication happens before any RDMA resource exists
    assert not (tmp_path / "dest" / "ckpt").exists()


def test_wrong_pin_is_refused(
    tmp_path: Path, loopback: type[LoopbackQueuePair], receiver: tuple[Receiver, ConnectOptions]
) -> None:
    _checkpoint(tmp_path / "ckpt")
    host, port = receiver[1].host, receiver[1].port
    bad = ConnectOptions(host, port, "sha256:" + "00" * 32, tls=False, timeout=5)
    with pytest.raises(AuthError):
        do_send([tmp_path / "ckpt"], RdmaTransport(), bad, TOKEN, SendOptions(retry_for=2))
    with pytest.raises(AuthError, match="fingerprint"):
        RdmaTransport().connect(ConnectOptions(host, port, None, tls=False))


def test_hostile_connection_info_is_refused_and_both_sides_tear_down(
    tmp_path: Path, loopback: type[LoopbackQueuePair], receiver: tuple[Receiver, ConnectOptions]
) -> None:
    _checkpoint(tmp_path / "ckpt")
    loopback.hostile = True
    with pytest.raises(ProtocolError, match="slot size"):
        do_send([tmp_path / "ckpt"], RdmaTransport(), receiver[1], TOKEN, SendOptions(retry_for=2))
    qps = list(loopback.registry.values())
    assert qps and _eventually(lambda: all(q.closed for q in qps))  # the receiver read the refusal too
    assert not (tmp_path / "dest" / "ckpt" / "shard-0.bin").exists()


def test_sender_on_rdma_against_a_tcp_receiver_says_so(
    tmp_path: Path, loopback: type[LoopbackQueuePair], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transfer import tcp
    from transfer.rdma import driver

    monkeypatch.setattr(driver, "SETUP_TIMEOUT", 1.0)
    _checkpoint(tmp_path / "ckpt")
    identity = load_identity(tmp_path / "certs")
    recv = Receiver(tmp_path / "dest", TOKEN)
    listener = tcp.TcpTransport().listen(
        ListenOptions("127.0.0.1", 0, identity, tls=True), recv.handle_channel
    )
    server = threading.Thread(target=listener.serve_forever, daemon=True)
    server.start()
    try:
        host, port = listener.address
        opts = ConnectOptions(host, port, identity.fingerprint, tls=True, timeout=5)
        with pytest.raises(ProtocolError, match="--transport rdma"):
            do_send([tmp_path / "ckpt"], RdmaTransport(), opts, TOKEN, SendOptions(retry_for=2))
        assert all(q.closed for q in loopback.registry.values())
    finally:
        listener.close()
        server.join(5)
        recv.close()
