"""Typed progress events the library reports through a callback; rqcli turns them into bars and JSON."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Listening:
    address: tuple[str, int]
    fingerprint: str | None
    transport: str


@dataclass(frozen=True)
class TransferPlanned:
    """Both sides: the manifest was accepted. `have_bytes` were already there (resume)."""

    transfer_id: str
    files: int
    total_bytes: int
    total_chunks: int
    have_bytes: int
    restarted: tuple[str, ...] = ()  # (at most the first 1,000 names the receiver sent)
    restarted_count: int = 0  # how many files in all were restarted (0: as many as `restarted`)


@dataclass(frozen=True)
class ChunkMoved:
    raw_bytes: int
    wire_bytes: int
    file: int = -1
    index: int = -1


@dataclass(frozen=True)
class SendProgress:
    """Sender: the figure for a progress bar, after each TransferPlanned and each ChunkMoved that
    moves it: the bytes the receiver held when it last accepted the manifest plus those of the
    chunks sent to it since, each counted once. It never goes down within a send: after a
    reconnect the receiver holds less than was sent (chunks in flight went with the link), and the
    figure stays where it was until the transfer passes it again (TransferPlanned.have_bytes and
    a count of ChunkMoved went back: a bar was seen to jump from 40% to 24%)."""

    done_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class ChunkResent:
    reason: str


@dataclass(frozen=True)
class Retrying:
    attempt: int
    error: str
    delay: float


@dataclass(frozen=True)
class TransferFinished:
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceSkipped:
    """Sender: an entry under a directory SOURCE that is not sent (broken symlink, FIFO, empty dir…)."""

    path: str
    reason: str


@dataclass(frozen=True)
class ChunkSizeAdopted:
    """Sender: the receiver holds verified chunks of these files cut at `chunk_size`, so the
    transfer goes on at that size instead of `asked` (nothing that arrived is sent again)."""

    chunk_size: int
    asked: int


@dataclass(frozen=True)
class DatagramNarrowed:
    """Sender (QUIC): a handshake at the route's datagram size (`tried` bytes) heard nothing back, so
    the path is narrower than the link and says nothing (no ICMP); the transfer goes on at `used`
    bytes (the path MTU the kernel learned, else QUIC's minimum 1200). --datagram-size sets it."""

    tried: int
    used: int


@dataclass(frozen=True)
class PartialExpired:
    """Receiver: a long-running receiver's periodic sweep (at most every SWEEP_EVERY, as a transfer
    is planned) removed the partial state of transfers untouched for `older_than` seconds; the same
    figures as store.Expired, which the receiver reports as it starts."""

    transfers: tuple[str, ...]
    files: int
    bytes: int
    older_than: float | None


@dataclass(frozen=True)
class TransferFailed:
    error: str
    code: str


Event = (
    Listening
    | TransferPlanned
    | ChunkMoved
    | SendProgress
    | ChunkResent
    | Retrying
    | SourceSkipped
    | ChunkSizeAdopted
    | DatagramNarrowed
    | PartialExpired
    | TransferFinished
    | TransferFailed
)
EventCallback = Callable[[Event], None]


def ignore(_event: Event) -> None:
    pass
