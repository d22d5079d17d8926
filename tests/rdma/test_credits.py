"""Credit accounting: the writer never holds more than the reader's ring; the reader catches cheats."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transfer.rdma.credits import (
    COUNT_MODULUS,
    ReadCredits,
    StagingPool,
    WriteCredits,
    data_imm,
    split_data_imm,
)
from transfer.rdma.errors import CreditError


def test_imm_packs_slot_and_sequence() -> None:
    assert split_data_imm(data_imm(4095, 70000)) == (4095, 70000 & 0xFFFF)


def test_writer_walks_the_ring_and_stops_when_full() -> None:
    w = WriteCredits(3)
    assert [w.take() for _ in range(3)] == [(0, 0), (1, 1), (2, 2)]
    assert w.available == 0
    with pytest.raises(CreditError):
        w.take()
    assert w.grant(2) == 2
    assert w.take() == (0, 3)


def test_credit_for_more_than_outstanding_is_refused() -> None:
    w = WriteCredits(4)
    w.take()
    with pytest.raises(CreditError, match="out of step"):
        w.grant(2)


def test_repeated_credit_message_is_harmless() -> None:
    w = WriteCredits(4)
    w.take()
    w.take()
    assert w.grant(2) == 2
    assert w.grant(2) == 0  # cumulative: a duplicate frees nothing
    assert w.available == 4


def test_reader_refuses_out_of_order_duplicate_and_uncredited_writes() -> None:
    r = ReadCredits(2, batch=1)
    with pytest.raises(CreditError, match="expected slot 0"):
        r.arrive(data_imm(1, 1))
    assert r.arrive(data_imm(0, 0)) == 0
    with pytest.raises(CreditError):
        r.arrive(data_imm(0, 0))  # the same write again
    assert r.arrive(data_imm(1, 1)) == 1
    with pytest.raises(CreditError, match="more slots than it held credits"):
        r.arrive(data_imm(0, 2))  # nothing was given back yet


def test_reader_batches_credit_and_flushes_when_idle() -> None:
    r = ReadCredits(8)  # batch = 2
    r.arrive(data_imm(0, 0))
    r.consume()
    assert r.credit_due(idle=False) is None
    assert r.credit_due(idle=True) == 1
    assert r.credit_due(idle=True) is None
    for s in (1, 2):
        r.arrive(data_imm(s, s))
        r.consume()
    assert r.credit_due(idle=False) == 3


def test_consume_before_arrival_is_a_bug() -> None:
    with pytest.raises(ValueError):
        ReadCredits(2).consume()


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 9),
    steps=st.lists(st.tuples(st.booleans(), st.integers(1, 5)), min_size=1, max_size=200),
)
def test_honest_peers_never_overrun_and_always_agree(count: int, steps: list[tuple[bool, int]]) -> None:
    """A writer and a reader driven in any interleaving: every write is accepted, none overruns."""
    w, r = WriteCredits(count), ReadCredits(count, batch=max(1, count // 3))
    in_ring = 0
    for write, n in steps:
        for _ in range(n):
            if write and w.available:
                slot, seq = w.take()
                assert r.arrive(data_imm(slot, seq)) == slot
                in_ring += 1
                assert in_ring <= count
            elif not write and r.consumed < r.arrived:
                r.consume()
                in_ring -= 1
                due = r.credit_due(idle=r.consumed == r.arrived)
                if due is not None:
                    w.grant(due)
    assert w.written == r.arrived


def test_counts_survive_wraparound() -> None:
    w, r = WriteCredits(3), ReadCredits(3, batch=1)
    w.written = w.returned = r.arrived = r.consumed = r.reported = COUNT_MODULUS - 2
    for _ in range(10):
        slot, seq = w.take()
        r.arrive(data_imm(slot, seq))
        r.consume()
        due = r.credit_due(idle=True)
        assert due is not None
        assert w.grant(due) == 1


def test_staging_pool_reuses_buffers_after_completion() -> None:
    p = StagingPool(2)
    assert p.take() == (0, 0)
    assert p.take() == (1, 1)
    with pytest.raises(CreditError):
        p.take()
    p.complete_through(1)  # completions are in order: 1 done means 0 done
    assert p.available == 2
    with pytest.raises(ValueError):
        p.complete_through(1)
