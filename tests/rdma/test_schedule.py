"""Chunk-to-slot scheduling: the bytes of a send cut into slot-sized fills, in order, nothing lost."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transfer.rdma.schedule import Piece, plan_slots, slots_needed


def test_a_chunk_frame_spans_slots_and_its_header_rides_in_the_first() -> None:
    fills = list(plan_slots([28, 10_000], 4096))
    assert fills[0] == [Piece(0, 0, 28), Piece(1, 0, 4068)]
    assert fills[1] == [Piece(1, 4068, 4096)]
    assert fills[2] == [Piece(1, 8164, 1836)]


def test_empty_send_posts_nothing() -> None:
    assert list(plan_slots([], 4096)) == []
    assert list(plan_slots([0, 0], 4096)) == []


def test_bad_slot_size() -> None:
    with pytest.raises(ValueError):
        list(plan_slots([1], 0))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 20_000), max_size=20), st.integers(1, 5000))
def test_fills_rebuild_the_stream(lengths: list[int], slot: int) -> None:
    parts = [bytes([i % 251]) * n for i, n in enumerate(lengths)]
    fills = list(plan_slots(lengths, slot))
    out = b"".join(parts[p.part][p.start : p.start + p.length] for fill in fills for p in fill)
    assert out == b"".join(parts)
    sizes = [sum(p.length for p in fill) for fill in fills]
    assert all(0 < s <= slot for s in sizes)
    assert all(s == slot for s in sizes[:-1])  # only the last fill of a send may be partial
    assert len(fills) == slots_needed(sum(lengths), slot)
