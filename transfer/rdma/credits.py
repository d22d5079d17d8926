"""Credit-based flow control over a ring of receive slots, so a writer never overruns its reader.

The reader offers a ring of `count` slots (conninfo.Ring). The writer fills them strictly in ring
order, one RDMA WRITE WITH IMMEDIATE per slot, and may have at most `count` slots written but not yet
given back. The reader consumes slots in the order they arrive (a reliable-connected QP delivers in
order), and gives them back as a *cumulative* count of slots consumed, carried in the immediate of a
small SEND. Cumulative counts make lost or repeated credit messages harmless and let the reader batch
them; counting slots in order means a slot number is never ambiguous.

The immediate of a data write is `slot << 16 | (sequence & 0xffff)`: the reader checks both against
what it expects, so a write that lands out of order, twice, or without credit is caught as a
CreditError instead of silently overwriting data not yet consumed.
"""

from __future__ import annotations

from dataclasses import dataclass

from transfer.rdma.errors import CreditError, OutOfStepError

SEQ_MASK = 0xFFFF
COUNT_MODULUS = 1 << 32  # credit counts travel in a 32-bit immediate


def data_imm(slot: int, seq: int) -> int:
    return (slot << 16) | (seq & SEQ_MASK)


def split_data_imm(imm: int) -> tuple[int, int]:
    return imm >> 16, imm & SEQ_MASK


class WriteCredits:
    """The writer's view of the reader's ring: which slot is next and whether it is free."""

    def __init__(self, count: int):
        if not 1 <= count <= SEQ_MASK:
            raise ValueError(f"ring of {count} slots")
        self.count = count
        self.written = 0  # slots written so far (cumulative)
        self.returned = 0  # slots the reader gave back (cumulative)

    @property
    def available(self) -> int:
        return self.count - (self.written - self.returned)

    @property
    def outstanding(self) -> int:
        return self.written - self.returned

    def take(self) -> tuple[int, int]:
        """The (slot, sequence) of the next write; only when `available`."""
        if self.available <= 0:
            raise CreditError("no credit left: the reader's ring is full")
        seq = self.written
        self.written += 1
        return seq % self.count, seq

    def grant(self, cumulative: int) -> int:
        """Applies a credit message (cumulative slots consumed, mod 2**32); returns slots freed."""
        delta = (cumulative - self.returned) % COUNT_MODULUS
        if delta > self.outstanding:
            raise CreditError(
                f"peer returned {delta} credits but holds only {self.outstanding} slots; it is out of step"
            )
        self.returned += delta
        return delta


class ReadCredits:
    """The reader's side of its own ring: checks each arriving write and decides when to give credit back."""

    def __init__(self, count: int, batch: int | None = None):
        if not 1 <= count <= SEQ_MASK:
            raise ValueError(f"ring of {count} slots")
        self.count = count
        # Give back a quarter of the ring at a time by default: few messages, and the writer still
        # has three quarters to fill meanwhile. When the reader goes idle it gives back whatever it has.
        self.batch = max(1, batch if batch is not None else count // 4)
        self.arrived = 0
        self.consumed = 0
        self.reported = 0

    def arrive(self, imm: int) -> int:
        """A data write completed with immediate `imm`; returns the slot to read. Raises CreditError
        when the writer broke the protocol (wrong slot, wrong sequence, or no credit)."""
        slot, seq = split_data_imm(imm)
        if self.arrived - self.reported >= self.count:
            raise CreditError("peer wrote more slots than it held credits for")
        want = self.arrived % self.count
        if slot != want or seq != self.arrived & SEQ_MASK:
            raise CreditError(
                f"peer wrote slot {slot} (sequence {seq}), expected slot {want} (sequence {self.arrived & SEQ_MASK})"
            )
        self.arrived += 1
        return slot

    def consume(self) -> None:
        """The oldest arrived slot was read out and may be written again."""
        if self.consumed >= self.arrived:
            raise OutOfStepError("consumed a slot that has not arrived")
        self.consumed += 1

    def credit_due(self, idle: bool) -> int | None:
        """The cumulative count to send back now, or None: a batch is ready, or we are idle with some."""
        pending = self.consumed - self.reported
        if pending <= 0 or (pending < self.batch and not idle):
            return None
        self.reported = self.consumed
        return self.consumed % COUNT_MODULUS


@dataclass
class StagingPool:
    """The writer's own registered buffers a write is copied into before it is posted.

    A buffer is reused once its write completed locally (signalled in order, so completion of
    sequence s means every earlier one is done too)."""

    count: int
    posted: int = 0
    completed: int = 0

    @property
    def available(self) -> int:
        return self.count - (self.posted - self.completed)

    def take(self) -> tuple[int, int]:
        """(buffer index, sequence); only when `available`."""
        if self.available <= 0:
            raise CreditError("no staging buffer free")
        seq = self.posted
        self.posted += 1
        return seq % self.count, seq

    def complete_through(self, seq: int) -> None:
        """The write with sequence `seq` (and so all before it) completed."""
        if not self.completed <= seq < self.posted:
            raise OutOfStepError(
                f"completion for write {seq}, posted {self.posted}, completed {self.completed}"
            )
        self.completed = seq + 1
