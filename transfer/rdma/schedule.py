"""Which bytes of an outgoing stream go into which ring slot.

A channel carries the transfer core's frames as one ordered byte stream (a 4 MiB CHUNK frame spans
several slots; several small ACK frames share one). `plan_slots` cuts the pieces of one `send()` into
slot-sized fills without copying anything; the driver then copies each fill into a staging buffer and
posts one RDMA WRITE WITH IMMEDIATE per fill. Every fill but the last of a send is full; the last is
posted at once rather than held back, so a frame never waits for later bytes (latency over packing).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    part: int  # index into the parts of the send
    start: int  # offset inside that part
    length: int


def plan_slots(lengths: Sequence[int], slot_size: int) -> Iterator[list[Piece]]:
    """Yields, per slot, the pieces (in stream order) that fill it; never more than `slot_size` bytes."""
    if slot_size <= 0:
        raise ValueError("slot size must be positive")
    fill: list[Piece] = []
    room = slot_size
    for part, length in enumerate(lengths):
        if length < 0:
            raise ValueError("negative length")
        start = 0
        while start < length:
            take = min(room, length - start)
            fill.append(Piece(part, start, take))
            start += take
            room -= take
            if room == 0:
                yield fill
                fill, room = [], slot_size
    if fill:
        yield fill


def slots_needed(total: int, slot_size: int) -> int:
    return -(-total // slot_size)
