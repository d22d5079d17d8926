"""The work requests and QP attributes rq builds, checked against the real pyverbs (no device needed:
these are plain structs). Skipped where pyverbs is not installed or does not load."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from transfer.rdma import conninfo, verbs
from transfer.rdma.conninfo import ConnInfo, Ring
from transfer.rdma.credits import data_imm
from transfer.rdma.errors import RdmaUnavailable
from transfer.rdma.pipe import WrKind, wr_id


@pytest.fixture(scope="module")
def v() -> Any:
    try:
        return verbs.load()
    except RdmaUnavailable as exc:
        pytest.skip(f"pyverbs unavailable: {exc.reason}")


PEER = ConnInfo(
    qp_num=0x4321, psn=77, lid=0, port=1, gid_index=3, gid=conninfo.gid_from_text("::ffff:10.0.0.9"),
    link_layer=conninfo.LINK_ETHERNET, mtu=3, ring=Ring(0x7F00_0000_0000, 0xBEEF, 1 << 20, 32),
)  # fmt: skip


def test_write_with_immediate(v: Any) -> None:
    wr = verbs.write_wr(v, wr_id(WrKind.WRITE, 9), 0x1000, 4096, 0x55, PEER.ring, 3, data_imm(3, 9))
    assert wr.opcode == v.e.IBV_WR_RDMA_WRITE_WITH_IMM
    assert wr.wr_id == wr_id(WrKind.WRITE, 9)
    assert wr.imm_data == socket.htonl(data_imm(3, 9))  # network order on the wire
    assert wr.send_flags & v.e.IBV_SEND_SIGNALED


def test_credit_and_receive(v: Any) -> None:
    wr = verbs.credit_wr(v, wr_id(WrKind.CREDIT, 0), 0x2000, 0x66, 12345)
    assert wr.opcode == v.e.IBV_WR_SEND_WITH_IMM and wr.imm_data == socket.htonl(12345)
    rwr = verbs.recv_wr(v, wr_id(WrKind.RECV, 4), 0x2020, 32, 0x66)
    assert rwr.wr_id == wr_id(WrKind.RECV, 4)


def test_rts_attributes_for_roce(v: Any) -> None:
    attr = verbs.rts_attr(v, port=1, gid_index=3, peer=PEER, psn=99, mtu=3)
    assert (attr.dest_qp_num, attr.rq_psn, attr.sq_psn, attr.path_mtu) == (0x4321, 77, 99, 3)
    assert (attr.retry_cnt, attr.rnr_retry) == (7, 7)
    assert attr.ah_attr.is_global == 1
    assert attr.ah_attr.dgid == PEER.gid_text
    assert attr.ah_attr.sgid_index == 3


def test_rts_attributes_for_infiniband_by_lid(v: Any) -> None:
    peer = ConnInfo(0x99, 1, 17, 1, 0, bytes(16), conninfo.LINK_INFINIBAND, 5, PEER.ring, global_route=False)
    attr = verbs.rts_attr(v, port=1, gid_index=-1, peer=peer, psn=1, mtu=5)
    assert attr.ah_attr.is_global == 0 and attr.ah_attr.dlid == 17
