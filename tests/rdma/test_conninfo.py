"""Connection-info wire format: round trip, and hostile or garbled info refused with ConnInfoError."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transfer.errors import ProtocolError
from transfer.rdma import conninfo
from transfer.rdma.conninfo import FORMAT, ConnInfo, Ring, check_compatible, decode, gid_from_text
from transfer.rdma.errors import ConnInfoError

ROCE_GID = gid_from_text("0000:0000:0000:0000:0000:ffff:0a00:0002")


def good(**changes: object) -> ConnInfo:
    info = ConnInfo(
        qp_num=0x1234,
        psn=0xABCDE,
        lid=0,
        port=1,
        gid_index=1,
        gid=ROCE_GID,
        link_layer=conninfo.LINK_ETHERNET,
        mtu=3,
        ring=Ring(addr=0x7F00_0000_0000, rkey=0xDEAD, slot_size=1 << 20, count=32),
        global_route=True,
    )
    return dataclasses.replace(info, **changes)  # type: ignore[arg-type]


def raw(**fields: object) -> bytes:
    """Encodes the good info with some wire fields overwritten (to build what a peer could send)."""
    names = ["magic", "version", "flags", "link", "mtu", "qpn", "psn", "lid", "port", "gid_index", "gid",
             "addr", "rkey", "slot_size", "count"]  # fmt: skip
    values = dict(zip(names, FORMAT.unpack(good().encode()), strict=True))
    values.update(fields)
    return FORMAT.pack(*(values[n] for n in names))


def test_round_trip() -> None:
    info = good()
    assert decode(info.encode()) == info
    assert len(info.encode()) == conninfo.SIZE


def test_infiniband_by_lid_round_trip() -> None:
    info = good(link_layer=conninfo.LINK_INFINIBAND, global_route=False, lid=7, gid=bytes(16))
    assert decode(info.encode()) == info


def test_gid_text_matches_pyverbs_spelling() -> None:
    assert good().gid_text == "0000:0000:0000:0000:0000:ffff:0a00:0002"
    assert gid_from_text(good().gid_text) == ROCE_GID
    with pytest.raises(ConnInfoError):
        gid_from_text("not-a-gid")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "bytes, expected"),
        (raw()[:-1], "bytes, expected"),
        (raw() + b"\0", "bytes, expected"),
        (raw(magic=b"HTTP"), "magic"),
        (raw(version=2), "version 2"),
        (raw(flags=0x80), "unknown flags"),
        (raw(link=3), "link layer"),
        (raw(mtu=0), "MTU"),
        (raw(mtu=6), "MTU"),
        (raw(qpn=0), "queue pair number"),
        (raw(qpn=1), "queue pair number"),
        (raw(qpn=1 << 24), "queue pair number"),
        (raw(psn=1 << 24), "24 bits"),
        (raw(port=0), "port"),
        (raw(flags=0), "RoCE needs a global route"),
        (raw(gid=bytes(16)), "all zeros"),
        (raw(gid=b"\xff" + bytes(15)), "multicast"),
        (raw(link=1, flags=0, lid=0), "LID"),
        (raw(link=1, flags=0, lid=0xC000), "LID"),
        (raw(slot_size=1024), "slot size"),
        (raw(slot_size=(64 << 20) + 64), "slot size"),
        (raw(slot_size=4096 + 1), "multiple of 64"),
        (raw(count=0), "slot count"),
        (raw(count=5000), "slot count"),
        (raw(slot_size=64 << 20, count=17), "over the"),
        (raw(addr=0), "null"),
        (raw(addr=(1 << 64) - 4096), "wraps"),
    ],
)
def test_hostile_or_garbled_info_is_refused(data: bytes, match: str) -> None:
    with pytest.raises(ConnInfoError, match=match) as caught:
        decode(data)
    assert isinstance(caught.value, ProtocolError)  # the transfer library treats it as a protocol error


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=80))
def test_any_bytes_either_decode_cleanly_or_raise_conninfo_error(data: bytes) -> None:
    try:
        info = decode(data)
    except ConnInfoError:
        return
    assert info.encode() == data  # whatever is accepted means exactly what it says


@settings(max_examples=200, deadline=None)
@given(st.integers(0, conninfo.SIZE - 1), st.integers(0, 255))
def test_single_byte_corruption_never_crashes(pos: int, value: int) -> None:
    data = bytearray(good().encode())
    data[pos] = value
    try:
        decode(bytes(data))
    except ConnInfoError:
        pass


def test_ring_slot_addresses() -> None:
    ring = good().ring
    assert ring.slot_addr(0) == ring.addr
    assert ring.slot_addr(31) == ring.addr + 31 * (1 << 20)
    with pytest.raises(IndexError):
        ring.slot_addr(32)


def test_compatibility() -> None:
    assert check_compatible(good(mtu=5), good(mtu=3)) == 3
    with pytest.raises(ConnInfoError, match="link layers differ"):
        check_compatible(good(), good(link_layer=conninfo.LINK_INFINIBAND))
    ib_lid = good(link_layer=conninfo.LINK_INFINIBAND, global_route=False, lid=3)
    ib_gid = good(link_layer=conninfo.LINK_INFINIBAND)
    with pytest.raises(ConnInfoError, match="--gid-index"):
        check_compatible(ib_lid, ib_gid)


def test_format_is_what_docs_say() -> None:
    assert struct.calcsize("!4sBBBBIIHBB16sQIII") == conninfo.SIZE == 56
