"""One direction-pair of frames over a queue pair: the logic of the data path, without pyverbs.

The pipe turns `send(parts)` into RDMA WRITE WITH IMMEDIATE into the peer's ring (schedule.py cuts
the bytes into slot fills, credits.py keeps us inside the peer's free slots) and turns arriving
writes back into the transfer core's frames (transfer.frames.FrameDecoder, each byte copied once
out of the ring into a reused BodyPool buffer; the core verifies every
chunk's digest as on any transport). It talks to the adapter through a `Port` — verbs.QueuePair on
real hardware, a loopback in the unit tests — so flow control, ordering checks, error mapping and
teardown are tested here without a device.

Completions are polled in batches (up to POLL_BATCH at a time) by whichever caller needs progress:
a sender waiting for a credit or a staging buffer, or a reader waiting for a frame. Credits go back
in batches (credits.ReadCredits) and at once when the reader goes idle.
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from transfer.errors import PeerUnreachableError, TransferError
from transfer.frames import BodyPool, Frame, FrameDecoder
from transfer.rdma.credits import ReadCredits, StagingPool, WriteCredits, data_imm
from transfer.rdma.errors import CreditError, completion_error
from transfer.rdma.schedule import plan_slots

POLL_BATCH = 32
CREDITS_IN_FLIGHT = 16  # credit SENDs posted but not completed; beyond that they wait (they are cumulative)
RECV_SPARE = 8
SPIN_YIELDS = 20  # empty polls answered with a bare yield before sleeping


class WrKind(enum.IntEnum):
    """Top bits of a wr_id: error completions carry no opcode, so the wr_id must say what it was."""

    WRITE = 1
    CREDIT = 2
    RECV = 3


KIND_SHIFT = 60
_WHAT = {int(WrKind.WRITE): "write", int(WrKind.CREDIT): "credit send", int(WrKind.RECV): "receive"}


def wr_id(kind: WrKind, n: int) -> int:
    return (int(kind) << KIND_SHIFT) | n


def split_wr_id(value: int) -> tuple[int, int]:
    return value >> KIND_SHIFT, value & ((1 << KIND_SHIFT) - 1)


@dataclass(frozen=True)
class Completion:
    wr_id: int
    status: int
    vendor_err: int = 0
    byte_len: int = 0
    imm: int = 0
    data_write: bool = False  # a RECV completion for an RDMA WRITE WITH IMM (else a SEND: a credit)


class Port(Protocol):
    def staging(self, index: int) -> memoryview: ...
    def ring_slot(self, slot: int) -> memoryview: ...
    def post_write(self, staging: int, length: int, slot: int, imm: int, wr_id: int) -> None: ...
    def post_credit(self, cumulative: int, wr_id: int) -> None: ...
    def post_recv(self, wr_id: int) -> None: ...
    def poll(self, max_entries: int) -> list[Completion]: ...


def recv_depth(local_slots: int, staging: int) -> int:
    """Receives to keep posted: every slot of our ring may arrive, plus credit messages for what we
    wrote (at most about one per staging buffer between two polls). Running short only stalls the
    peer briefly (receiver-not-ready retries are unlimited), never fails."""
    return local_slots + staging + CREDITS_IN_FLIGHT + RECV_SPARE


def post_receives(port: Port, depth: int) -> None:
    """Posts every receive before the queue pair connects, so no write ever finds none."""
    for i in range(depth):
        port.post_recv(wr_id(WrKind.RECV, i))


class Pipe:
    """Frames both ways over one queue pair. Thread-safe: one lock guards the state and the CQ."""

    def __init__(
        self,
        port: Port,
        local_slots: int,
        local_slot_size: int,
        peer_slots: int,
        peer_slot_size: int,
        staging: int,
        max_frame: int,
        credit_batch: int | None = None,
        liveness: Callable[[], None] | None = None,
    ):
        self.port = port
        self.local_slot_size = local_slot_size
        self.peer_slot_size = peer_slot_size
        self.out = WriteCredits(peer_slots)
        self.stage = StagingPool(staging)
        self.inn = ReadCredits(local_slots, credit_batch)
        # The ring slot is written again as soon as it is read, so frames are copied out of it once,
        # into pooled body buffers (fresh memory is slow to touch here)
        self.pool = BodyPool()
        self.decoder = FrameDecoder(max_frame, self.pool)
        self.frames: collections.deque[Frame] = collections.deque()
        self._lent: memoryview | None = None  # the pool buffer of the frame recv() returned last
        self.credits_in_flight = 0
        self.broken: TransferError | None = None
        self.liveness = liveness  # raises when the peer is gone (the bootstrap connection closed)
        self.lock = threading.RLock()
        self.bytes_out = 0
        self.bytes_in = 0
        # bytes of the writes that completed: the peer's adapter acknowledged them, so they are in
        # its ring (what TCP's progress counts as the bytes the peer's kernel acknowledged)
        self.bytes_done = 0
        self._ends = [0] * staging  # bytes_out just after the write in flight from each staging buffer

    # -- sending ---------------------------------------------------------------------------------

    def send(self, parts: tuple[bytes | bytearray | memoryview, ...], deadline: float | None = None) -> None:
        views = [memoryview(p).cast("B") for p in parts]
        with self.lock:
            self._check()
            for fill in plan_slots([len(v) for v in views], self.peer_slot_size):
                try:
                    self._wait(self._can_write, deadline, "a free slot")
                except TimeoutError:
                    # Part of a frame may be out already: the stream cannot go on after this.
                    self.broken = PeerUnreachableError(
                        "the peer stopped taking data (no credit before the deadline)"
                    )
                    raise self.broken from None
                index, seq = self.stage.take()
                slot, wseq = self.out.take()
                buf = self.port.staging(index)
                pos = 0
                for piece in fill:
                    buf[pos : pos + piece.length] = views[piece.part][
                        piece.start : piece.start + piece.length
                    ]
                    pos += piece.length
                self.port.post_write(index, pos, slot, data_imm(slot, wseq), wr_id(WrKind.WRITE, seq))
                self.bytes_out += pos
                self._ends[index] = self.bytes_out  # read when its completion is polled, under the lock

    def _can_write(self) -> bool:
        return self.out.available > 0 and self.stage.available > 0

    # -- receiving -------------------------------------------------------------------------------

    def recv(self, deadline: float | None) -> Frame:
        """The next frame; TimeoutError at `deadline`; the pipe's error if it broke."""
        with self.lock:
            self._wait(lambda: bool(self.frames), deadline, "a frame")
            return self._hand_out()

    def _hand_out(self) -> Frame:
        # The previous frame's body is the caller's no longer (valid until the next recv): reuse it.
        if self._lent is not None:
            self.pool.give(self._lent)
        frame = self.frames.popleft()
        self._lent = frame.lease
        return frame

    def take_ready(self) -> Frame | None:
        """A frame already received, without waiting: after the peer said goodbye or vanished,
        what it wrote before still counts. Never raises."""
        with self.lock:
            try:
                while not self.frames and self._pump():
                    pass
            except TransferError:
                pass
            return self._hand_out() if self.frames else None

    def ready(self) -> bool:
        """Whether recv would return at once: a frame is waiting, once the completions already in
        the CQ are applied (without waiting for more), or the pipe broke (recv raises)."""
        with self.lock:
            try:
                while not self.frames and self.broken is None and self._pump():
                    pass
            except TransferError:
                pass
            return bool(self.frames) or self.broken is not None

    # -- progress --------------------------------------------------------------------------------

    def _check(self) -> None:
        if self.broken is not None:
            raise self.broken

    def _wait(self, ready: Callable[[], bool], deadline: float | None, what: str) -> None:
        spins = 0
        while True:
            self._check()
            if ready():
                return
            if self._pump():
                spins = 0
                continue
            spins += 1
            if spins % 16 == 0 and self.liveness is not None:
                self._guard(self.liveness)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            # Nothing new: let the channel's other thread in (a reply reader and a sender share the
            # CQ), first with a bare yield, then backing off to sleeps of up to 1 ms so an idle
            # channel does not hold a core or the GIL. Completions wait in the CQ meanwhile.
            self.lock.release()
            try:
                time.sleep(0 if spins < SPIN_YIELDS else min(0.001, 0.00005 * (spins - SPIN_YIELDS + 1)))
            finally:
                self.lock.acquire()

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Interrupted:
            raise  # the waiter is woken; the pipe stays whole for a last word
        except TransferError as exc:
            self.broken = exc
            raise

    def _pump(self) -> int:
        """Polls one batch and applies it; returns how many completions it handled."""
        try:
            done = self.port.poll(POLL_BATCH)
            for c in done:
                self._apply(c)
            self._give_credit(idle=len(done) < POLL_BATCH)
        except TransferError as exc:
            self.broken = exc
            raise
        return len(done)

    def _apply(self, c: Completion) -> None:
        kind, n = split_wr_id(c.wr_id)
        if c.status != 0:
            what = _WHAT.get(kind, "request")
            raise completion_error(c.status, c.wr_id, c.vendor_err, what)
        if kind == WrKind.WRITE:
            self.stage.complete_through(n)
            self.bytes_done = self._ends[n % self.stage.count]
        elif kind == WrKind.CREDIT:
            self.credits_in_flight -= 1
        elif kind == WrKind.RECV:
            self.port.post_recv(c.wr_id)  # the same receive goes straight back
            if c.data_write:
                self._arrived(c)
            else:
                self.out.grant(c.imm)
        else:
            raise TransferError(f"completion with an unknown wr_id {c.wr_id:#x}")

    def _arrived(self, c: Completion) -> None:
        slot = self.inn.arrive(c.imm)
        if c.byte_len > self.local_slot_size:
            raise CreditError(f"peer wrote {c.byte_len} bytes into a {self.local_slot_size}-byte slot")
        self.frames.extend(self.decoder.feed(self.port.ring_slot(slot)[: c.byte_len]))
        self.bytes_in += c.byte_len
        self.inn.consume()  # the decoder copied the bytes out: the slot may be written again

    def _give_credit(self, idle: bool) -> None:
        if self.credits_in_flight >= CREDITS_IN_FLIGHT:
            return
        due = self.inn.credit_due(idle)
        if due is not None:
            self.credits_in_flight += 1
            self.port.post_credit(due, wr_id(WrKind.CREDIT, 0))

    # -- closing ---------------------------------------------------------------------------------

    def drain(self, deadline: float) -> bool:
        """Waits until every write we posted has completed (the peer's adapter has the bytes)."""
        with self.lock:
            try:
                self._wait(lambda: self.stage.completed == self.stage.posted, deadline, "writes to complete")
            except (TimeoutError, TransferError):
                return False
            return True

    def shut(self, exc: TransferError, release: Callable[[], None]) -> None:
        """Marks the pipe broken and runs `release` (destroy the QP, free its memory) under the lock,
        so a thread blocked in send/recv never polls a destroyed CQ: it wakes, sees `broken`, raises."""
        with self.lock:
            if self.broken is None:
                self.broken = exc
            release()


class Interrupted(PeerUnreachableError):
    """The channel's liveness check woke its waiter because this side is shutting down (the
    listener's close() shut the bootstrap connection's read side). Unlike the peer going away it
    does not break the pipe: the receiver can still tell the sender why (an ERROR) before closing."""


class PeerClosed(PeerUnreachableError):
    """The peer said goodbye on the bootstrap connection after its last write completed."""
