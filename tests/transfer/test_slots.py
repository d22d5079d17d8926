"""PreAuthSlots: the listener-wide and per-address caps on peers that have not authenticated."""

from __future__ import annotations

from transfer.slots import PreAuthSlots


def test_one_address_gets_its_share_and_no_more() -> None:
    slots = PreAuthSlots(total=5, per_peer=2)
    a1, a2 = slots.acquire("10.0.0.1"), slots.acquire("10.0.0.1")
    assert a1 is not None and a2 is not None
    assert slots.acquire("10.0.0.1") is None  # its share is used up
    b = slots.acquire("10.0.0.2")
    assert b is not None  # another address still gets in
    assert slots.held() == 3 and slots.held("10.0.0.1") == 2
    a1()
    assert slots.acquire("10.0.0.1") is not None  # a slot given back is free again


def test_the_listener_cap_binds_across_addresses() -> None:
    slots = PreAuthSlots(total=3, per_peer=2)
    got = [slots.acquire(f"10.0.0.{i}") for i in range(4)]
    assert [g is not None for g in got] == [True, True, True, False]


def test_giving_back_twice_counts_once() -> None:
    slots = PreAuthSlots(total=2, per_peer=2)
    release = slots.acquire("p")
    other = slots.acquire("p")
    assert release is not None and other is not None
    release()
    release()  # the channel's callback and an error path may both call it
    assert slots.held() == 1 and slots.held("p") == 1
    assert slots.acquire("p") is not None
    assert slots.acquire("p") is None


def test_per_peer_never_exceeds_the_total() -> None:
    slots = PreAuthSlots(total=2, per_peer=10)
    assert slots.per_peer == 2
