"""RdmaChannel offers the channel capabilities the receiver and sender look for (docs/transfer.md):
frame_limit / release_slot (passed to the TCP bootstrap channel, where the frames before the switch
travel and whose listener slot it holds), readable() and progress(); under the loopback harness.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_driver_loopback import TOKEN, LoopbackQueuePair, loopback  # noqa: F401

from transfer.credentials import load_identity
from transfer.events import ChunkMoved
from transfer.frames import PRE_AUTH_LIMIT
from transfer.rdma import driver
from transfer.rdma.driver import Geometry, RdmaSettings, RdmaTransport
from transfer.receiver import Receiver
from transfer.sender import SendOptions
from transfer.sender import send as do_send
from transfer.transport import ConnectOptions, ListenOptions

# Small rings keep the loopback fast (the production receiver registers 32 MiB per channel).
SMALL_RECEIVER = Geometry(ring_slots=4, slot_size=1 << 20, staging=2, staging_size=64 << 10)


@pytest.fixture
def small_rings(monkeypatch: pytest.MonkeyPatch, loopback: type[LoopbackQueuePair]) -> None:  # noqa: F811
    import test_driver_loopback as harness

    monkeypatch.setattr(driver, "RECEIVER", SMALL_RECEIVER)
    monkeypatch.setattr(harness, "RECEIVER", SMALL_RECEIVER)  # how the fake tells the receiver's QP
    monkeypatch.setattr(
        RdmaSettings, "from_extra", classmethod(lambda cls, extra: cls(receiver=SMALL_RECEIVER))
    )


class Served:
    def __init__(self, tmp_path: Path):
        self.events: list[Any] = []
        self.held_at_chunk: list[int] = []
        identity = load_identity(tmp_path / "certs")
        self.recv = Receiver(tmp_path / "dest", TOKEN, on_event=self._on_event)
        self.listener = RdmaTransport().listen(
            ListenOptions("127.0.0.1", 0, identity, tls=True), self.recv.handle_channel
        )
        self.thread = threading.Thread(target=self.listener.serve_forever, daemon=True)
        self.thread.start()
        host, port = self.listener.address
        self.opts = ConnectOptions(host, port, identity.fingerprint, tls=True, timeout=5)

    def _on_event(self, ev: Any) -> None:
        self.events.append(ev)
        if isinstance(ev, ChunkMoved):
            # in the handler of an authenticated data channel: it must no longer count as unauthenticated
            self.held_at_chunk.append(self.listener.inner._slots.held())

    def close(self) -> None:
        self.listener.close()
        self.thread.join(5)
        self.recv.close()


@pytest.fixture
def served(tmp_path: Path, small_rings: None) -> Iterator[Served]:
    s = Served(tmp_path)
    yield s
    s.close()


def test_a_manifest_over_the_pre_auth_limit_is_accepted(tmp_path: Path, served: Served) -> None:
    # Old code: "receiver refused: MANIFEST frame of ... bytes is over the 65536 allowed" (the
    # receiver's lifted limit never reached the TCP channel the MANIFEST travels on).
    root = tmp_path / "ckpt"
    root.mkdir()
    name = "n" * 200
    count = PRE_AUTH_LIMIT // 200 + 50  # the names alone are over the pre-auth limit
    for i in range(count):
        (root / f"{name}-{i:04d}").write_bytes(b"x")
    opts = SendOptions(connections=1, streams=1, chunk_size=1 << 20, compress="none", retry_for=2)
    summary = do_send([root], RdmaTransport(), served.opts, TOKEN, opts)
    assert summary["complete"]
    assert len(os.listdir(tmp_path / "dest" / "ckpt")) == count


def test_an_authenticated_channel_gives_its_pre_auth_slot_back(tmp_path: Path, served: Served) -> None:
    # Old code: every RDMA channel held its unauthenticated slot until it closed (held() was 2 here:
    # the control and the data channel), so a few big RDMA senders locked everyone else out.
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "a.bin").write_bytes(os.urandom(3 << 20))
    opts = SendOptions(connections=1, streams=1, chunk_size=1 << 20, compress="none", retry_for=2)
    summary = do_send([root], RdmaTransport(), served.opts, TOKEN, opts)
    assert summary["complete"]
    assert served.held_at_chunk and max(served.held_at_chunk) == 0
