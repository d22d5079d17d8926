"""verbs.QueuePair's own logic against a recording stand-in for pyverbs: which memory it registers,
what it posts, how completions are read, and the teardown order. Real mmaps and addresses; no device.
(The structs themselves are checked against the real pyverbs in test_verbs_structs.py.)"""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import pytest

from transfer.rdma import conninfo, verbs
from transfer.rdma.conninfo import ConnInfo, Ring
from transfer.rdma.errors import RdmaDeviceError
from transfer.rdma.pipe import WrKind, wr_id

E = SimpleNamespace(
    IBV_ACCESS_LOCAL_WRITE=1, IBV_ACCESS_REMOTE_WRITE=2, IBV_QPT_RC=2, IBV_WR_RDMA_WRITE_WITH_IMM=1,
    IBV_WR_SEND_WITH_IMM=3, IBV_SEND_SIGNALED=2, IBV_WC_RECV_RDMA_WITH_IMM=129, IBV_QPS_ERR=6, IBV_QP_STATE=1,
)  # fmt: skip


class VerbsError(Exception):
    pass


class Log:
    def __init__(self) -> None:
        self.events: list[str] = []


def fake_pyverbs(log: Log, fail_qp: bool = False) -> Any:
    class MR:
        def __init__(self, pd: Any, length: int, access: int, address: int):
            self.length, self.access, self.address = length, access, address
            self.lkey, self.rkey = 0x100 + length % 97, 0x200 + length % 89
            log.events.append(f"reg {length}")

        def close(self) -> None:
            log.events.append(f"dereg {self.length}")

    class CQ:
        def __init__(self, ctx: Any, cqe: int):
            self.cqe = cqe
            self.wcs: list[Any] = []

        def poll(self, n: int) -> tuple[int, list[Any]]:
            out, self.wcs = self.wcs[:n], self.wcs[n:]
            return len(out), out

        def close(self) -> None:
            log.events.append("destroy cq")

    class QP:
        def __init__(self, pd: Any, init: Any, attr: Any):
            if fail_qp:
                raise VerbsError("no more QPs")
            self.qp_num, self.init, self.attr = 0x77, init, attr
            self.sent: list[Any] = []
            self.recvs: list[Any] = []

        def to_rts(self, attr: Any) -> None:
            self.rts = attr

        def post_send(self, wr: Any) -> None:
            self.sent.append(wr)

        def post_recv(self, wr: Any) -> None:
            self.recvs.append(wr)

        def modify(self, attr: Any, mask: int) -> None:
            log.events.append(f"modify state {attr.qp_state}")

        def close(self) -> None:
            log.events.append("destroy qp")

    class SendWR(SimpleNamespace):
        def set_wr_rdma(self, rkey: int, addr: int) -> None:
            self.rkey, self.remote = rkey, addr

    return SimpleNamespace(
        e=E, PyverbsError=VerbsError,
        cq=SimpleNamespace(CQ=CQ), mr=SimpleNamespace(MR=MR),
        qp=SimpleNamespace(QPCap=SimpleNamespace, QPInitAttr=SimpleNamespace, QPAttr=SimpleNamespace, QP=QP),
        wr=SimpleNamespace(SGE=lambda a, n, k: (a, n, k), SendWR=SendWR, RecvWR=SimpleNamespace),
        addr=SimpleNamespace(GID=lambda t: t, GlobalRoute=SimpleNamespace, AHAttr=SimpleNamespace),
    )  # fmt: skip


DEV = verbs.OpenDevice(
    "rxe0", 1, 1, "ctx", "pd", conninfo.LINK_ETHERNET, 0, 3, conninfo.gid_from_text("::ffff:10.0.0.2")
)
PEER = ConnInfo(0x99, 5, 0, 1, 1, conninfo.gid_from_text("::ffff:10.0.0.3"), conninfo.LINK_ETHERNET, 3,
                Ring(0x7000_0000, 0xABC, 8192, 4))  # fmt: skip


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> Log:
    log = Log()
    monkeypatch.setattr(verbs, "load", lambda: fake_pyverbs(log))
    return log


def test_registers_ring_staging_and_scratch_and_describes_itself(log: Log) -> None:
    qp = verbs.QueuePair(DEV, ring_slots=4, ring_slot_size=8192, staging=2, staging_size=4096, recv_depth=16)
    assert log.events == [f"reg {4 * 8192}", f"reg {2 * 4096}", f"reg {verbs.QueuePair.SCRATCH}"]
    assert (
        qp.ring.mr.access == E.IBV_ACCESS_LOCAL_WRITE | E.IBV_ACCESS_REMOTE_WRITE
    )  # only the ring is writable
    assert qp.stage.mr.access == E.IBV_ACCESS_LOCAL_WRITE
    assert qp.ring.mr.address == qp.ring.addr  # the MR covers the mmap Python reads from
    qp.ring_slot(1)[:3] = b"abc"
    assert bytes(qp.ring.view[8192 : 8192 + 3]) == b"abc"
    info = qp.local_info()
    assert (info.qp_num, info.ring.addr, info.ring.rkey, info.ring.slot_size, info.ring.count) == (
        0x77, qp.ring.addr, qp.ring.mr.rkey, 8192, 4,
    )  # fmt: skip
    assert conninfo.decode(info.encode()) == info  # what we send passes the peer's checks
    assert qp.qp.init.cap.max_recv_wr == 16 and qp.qp.init.sq_sig_all == 0
    qp.close()


def test_posts_what_the_pipe_asks_for(log: Log) -> None:
    qp = verbs.QueuePair(DEV, 4, 8192, 2, 4096, 16)
    qp.connect(PEER, 3)
    assert qp.qp.rts.dest_qp_num == 0x99 and qp.qp.rts.rq_psn == 5
    qp.post_write(1, 1000, 2, 0x20007, wr_id(WrKind.WRITE, 7))
    wr = qp.qp.sent[-1]
    assert wr.sg == [(qp.stage.addr + 4096, 1000, qp.stage.mr.lkey)]
    assert (wr.rkey, wr.remote) == (0xABC, 0x7000_0000 + 2 * 8192)
    assert wr.imm_data == socket.htonl(0x20007) and wr.opcode == E.IBV_WR_RDMA_WRITE_WITH_IMM
    qp.post_credit(12, wr_id(WrKind.CREDIT, 0))
    assert qp.qp.sent[-1].opcode == E.IBV_WR_SEND_WITH_IMM and qp.qp.sent[-1].imm_data == socket.htonl(12)
    qp.post_recv(wr_id(WrKind.RECV, 3))
    assert qp.qp.recvs[-1].wr_id == wr_id(WrKind.RECV, 3)
    qp.close()


def test_reads_completions_in_host_order_and_ignores_opcode_of_failures(log: Log) -> None:
    qp = verbs.QueuePair(DEV, 4, 8192, 2, 4096, 16)
    wc = SimpleNamespace
    qp.cq.wcs = [
        wc(wr_id=1, status=0, vendor_err=0, byte_len=77, imm_data=socket.htonl(0x10001), opcode=129),
        wc(wr_id=2, status=0, vendor_err=0, byte_len=0, imm_data=socket.htonl(9), opcode=128),
        wc(
            wr_id=3, status=12, vendor_err=0x81, byte_len=0, imm_data=123, opcode=129
        ),  # opcode undefined here
    ]
    a, b, c = qp.poll(8)
    assert (a.imm, a.data_write, a.byte_len) == (0x10001, True, 77)
    assert (b.imm, b.data_write) == (9, False)
    assert (c.status, c.vendor_err, c.data_write, c.imm) == (12, 0x81, False, 0)
    qp.close()


def test_teardown_order_and_idempotence(log: Log) -> None:
    qp = verbs.QueuePair(DEV, 4, 8192, 2, 4096, 16)
    ring_map = qp.ring.map
    log.events.clear()
    qp.close()
    assert log.events[0] == f"modify state {E.IBV_QPS_ERR}"  # flush outstanding work first
    assert (
        log.events.index("destroy qp")
        < log.events.index(f"dereg {4 * 8192}")
        < log.events.index("destroy cq")
    )
    assert ring_map.closed
    qp.close()  # twice is harmless


def test_failed_setup_releases_what_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log()
    monkeypatch.setattr(verbs, "load", lambda: fake_pyverbs(log, fail_qp=True))
    with pytest.raises(RdmaDeviceError, match="no more QPs"):
        verbs.QueuePair(DEV, 4, 8192, 2, 4096, 16)
    assert sorted(e for e in log.events if e.startswith("dereg")) == sorted(
        e.replace("reg", "dereg") for e in log.events if e.startswith("reg")
    )
    assert "destroy cq" in log.events
