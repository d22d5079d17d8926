"""A pair of in-memory queue-pair ports for pure unit tests of pipe.py's logic (no device, no verbs).

It behaves like a reliable-connected QP pair where it matters to the logic: writes land in the peer's
ring slot and complete in order; a write or credit needs a posted receive on the other side (it waits
otherwise, as receiver-not-ready retries would); completions are polled in batches. It also checks
the one promise flow control makes: a writer never writes into a slot the reader has not given back.
"""

from __future__ import annotations

import collections
import threading

from transfer.rdma.credits import split_data_imm
from transfer.rdma.pipe import Completion


class FakePort:
    def __init__(self, ring_slots: int, ring_slot_size: int, staging: int, staging_size: int):
        self.ring = bytearray(ring_slots * ring_slot_size)
        self.ring_slots = ring_slots
        self.ring_slot_size = ring_slot_size
        self.stage = bytearray(staging * staging_size)
        self.staging_size = staging_size
        self.peer: FakePort | None = None
        self.cq: collections.deque[Completion] = collections.deque()
        self.recvs: collections.deque[int] = collections.deque()
        self.waiting: collections.deque[tuple[str, int, bytes, int]] = collections.deque()  # no receive yet
        self.lock = threading.Lock()
        self.held = [False] * ring_slots  # written by the peer and not yet credited back
        self.given_back = 0
        self.violations: list[str] = []
        self.writes = 0
        self.bytes_written = 0
        self.credits = 0
        self.fail_next_write: int | None = None  # a WC status to complete the next write with
        self.dead = False
        self.max_batch_seen = 0

    def connect(self, other: FakePort) -> None:
        self.peer, other.peer = other, self

    # -- Port --------------------------------------------------------------------------------------

    def staging(self, index: int) -> memoryview:
        return memoryview(self.stage)[index * self.staging_size : (index + 1) * self.staging_size]

    def ring_slot(self, slot: int) -> memoryview:
        return memoryview(self.ring)[slot * self.ring_slot_size : (slot + 1) * self.ring_slot_size]

    def post_write(self, staging: int, length: int, slot: int, imm: int, wr_id: int) -> None:
        assert self.peer is not None
        assert length <= self.staging_size
        self.writes += 1
        if self.dead or self.peer.dead or self.fail_next_write is not None:
            status = self.fail_next_write or 12
            self.fail_next_write = None
            with self.lock:
                self.cq.append(Completion(wr_id, status, vendor_err=0x81))
            return
        data = bytes(self.staging(staging)[:length])
        self.bytes_written += length
        self.peer._deliver(("write", imm, data, slot))
        with self.lock:
            self.cq.append(Completion(wr_id, 0))

    def post_credit(self, cumulative: int, wr_id: int) -> None:
        assert self.peer is not None
        self.credits += 1
        if self.dead or self.peer.dead:
            with self.lock:
                self.cq.append(Completion(wr_id, 12))
            return
        self.peer._deliver(("credit", cumulative, b"", 0))
        with self.lock:
            self.cq.append(Completion(wr_id, 0))
        # Slots up to `cumulative` are the writer's again.
        while self.given_back < cumulative:
            self.held[self.given_back % self.ring_slots] = False
            self.given_back += 1

    def post_recv(self, wr_id: int) -> None:
        with self.lock:
            self.recvs.append(wr_id)
        self._flush_waiting()

    def poll(self, max_entries: int) -> list[Completion]:
        self._flush_waiting()
        with self.lock:
            out = [self.cq.popleft() for _ in range(min(max_entries, len(self.cq)))]
        self.max_batch_seen = max(self.max_batch_seen, len(out))
        return out

    # -- the wire ----------------------------------------------------------------------------------

    def _deliver(self, item: tuple[str, int, bytes, int]) -> None:
        with self.lock:
            self.waiting.append(item)
        self._flush_waiting()

    def _flush_waiting(self) -> None:
        with self.lock:
            while self.waiting and self.recvs:
                kind, imm, data, slot = self.waiting.popleft()
                wr = self.recvs.popleft()
                if kind == "write":
                    if self.held[slot]:
                        self.violations.append(f"write into slot {slot} before it was given back")
                    self.held[slot] = True
                    self.ring_slot(slot)[: len(data)] = data
                    self.cq.append(Completion(wr, 0, byte_len=len(data), imm=imm, data_write=True))
                else:
                    self.cq.append(Completion(wr, 0, imm=imm))


def slot_of(imm: int) -> int:
    return split_data_imm(imm)[0]
