"""pipe.Pipe over an in-memory loopback (tests/rdma/fakeport.py): flow control, ordering, errors.

Pure logic: the fake stands in for the adapter only; the end-to-end proof is test_e2e.py (marker rdma).
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from fakeport import FakePort

from transfer.errors import PeerUnreachableError, ProtocolError
from transfer.frames import FrameType, header
from transfer.rdma.credits import data_imm
from transfer.rdma.errors import CreditError, PeerLostError, RemoteAccessError
from transfer.rdma.pipe import Completion, PeerClosed, Pipe, WrKind, post_receives, recv_depth, wr_id


def make_pair(
    a_slots: int = 4, b_slots: int = 4, slot: int = 4096, staging: int = 4, batch: int | None = None
) -> tuple[Pipe, Pipe, FakePort, FakePort]:
    pa = FakePort(a_slots, slot, staging, slot)
    pb = FakePort(b_slots, slot, staging, slot)
    pa.connect(pb)
    a = Pipe(pa, a_slots, slot, b_slots, slot, staging, max_frame=1 << 22, credit_batch=batch)
    b = Pipe(pb, b_slots, slot, a_slots, slot, staging, max_frame=1 << 22, credit_batch=batch)
    post_receives(pa, recv_depth(a_slots, staging))
    post_receives(pb, recv_depth(b_slots, staging))
    return a, b, pa, pb


def frame(kind: FrameType, body: bytes) -> bytes:
    return header(kind, len(body)) + body


def soon(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


def test_frames_cross_in_order_both_ways_without_overrun() -> None:
    a, b, pa, pb = make_pair(a_slots=3, b_slots=5, staging=3)
    rng = random.Random(7)
    bodies = [rng.randbytes(rng.choice([0, 1, 100, 4095, 4096, 9000, 30000])) for _ in range(150)]
    acks = [rng.randbytes(8 * rng.randint(1, 20)) for _ in range(40)]
    got_b: list[bytes] = []
    got_a: list[bytes] = []
    errors: list[BaseException] = []

    def reader_b() -> None:
        try:
            for i in range(len(bodies)):
                f = b.recv(soon())
                assert f.type is FrameType.CHUNK
                got_b.append(bytes(f.body))
                if i < len(acks):
                    b.send((frame(FrameType.ACK, acks[i]),), soon())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=reader_b)
    t.start()
    for body in bodies:
        a.send((header(FrameType.CHUNK, len(body)), body), soon())  # two parts, like the sender glue
    for _ in acks:
        got_a.append(bytes(a.recv(soon()).body))
    t.join(20)
    assert not errors, errors
    assert got_b == bodies
    assert got_a == acks
    assert pa.violations == [] and pb.violations == []  # never a write into a slot not given back
    assert pb.credits < pa.writes  # credits went back in batches, not one message per slot


def test_writer_stops_at_the_readers_ring_size() -> None:
    a, _b, pa, _pb = make_pair(b_slots=2, staging=8)
    with pytest.raises(PeerUnreachableError):
        a.send((frame(FrameType.CHUNK, bytes(3 * 4096)),), time.monotonic() + 0.2)  # B never reads
    assert pa.writes == 2  # exactly the two credits it had
    with pytest.raises(PeerUnreachableError):  # and the stream is dead: half a frame went out
        a.send((frame(FrameType.ACK, b""),), soon())


def test_failed_write_completion_breaks_the_pipe_with_a_typed_error() -> None:
    a, _b, pa, _pb = make_pair()
    pa.fail_next_write = 12  # RETRY_EXC_ERR: the peer stopped answering
    a.send((frame(FrameType.ACK, b"12345678"),), soon())
    with pytest.raises(PeerLostError) as caught:
        a.recv(soon(1))
    assert isinstance(caught.value, PeerUnreachableError)  # the sender's glue reconnects and resumes
    assert "RETRY_EXC_ERR" in str(caught.value) and "write" in str(caught.value)
    with pytest.raises(PeerLostError):
        a.send((frame(FrameType.ACK, b""),), soon())


def test_remote_access_error_is_a_protocol_error() -> None:
    a, _b, pa, _pb = make_pair()
    pa.fail_next_write = 10  # REM_ACCESS_ERR
    a.send((frame(FrameType.ACK, b""),), soon())
    with pytest.raises(RemoteAccessError) as caught:
        a.recv(soon(1))
    assert isinstance(caught.value, ProtocolError)


def test_write_into_the_wrong_slot_is_refused() -> None:
    _a, b, _pa, pb = make_pair()
    pb.cq.append(Completion(wr_id(WrKind.RECV, 0), 0, byte_len=8, imm=data_imm(1, 1), data_write=True))
    with pytest.raises(CreditError):
        b.recv(soon(1))


def test_write_longer_than_a_slot_is_refused() -> None:
    _a, b, _pa, pb = make_pair()
    pb.cq.append(Completion(wr_id(WrKind.RECV, 0), 0, byte_len=4097, imm=data_imm(0, 0), data_write=True))
    with pytest.raises(CreditError):
        b.recv(soon(1))


def test_credit_for_slots_never_written_is_refused() -> None:
    a, _b, pa, _pb = make_pair()
    pa.cq.append(Completion(wr_id(WrKind.RECV, 0), 0, imm=3))
    with pytest.raises(CreditError):
        a.recv(soon(1))


def test_unknown_wr_id_is_an_error() -> None:
    a, _b, pa, _pb = make_pair()
    pa.cq.append(Completion(7 << 60, 0))
    with pytest.raises(Exception, match="unknown wr_id"):
        a.recv(soon(1))


def test_recv_timeout_leaves_the_pipe_usable() -> None:
    a, b, _pa, _pb = make_pair()
    with pytest.raises(TimeoutError):
        b.recv(time.monotonic() + 0.05)
    a.send((frame(FrameType.FLUSH, b""),), soon())
    assert b.recv(soon()).type is FrameType.FLUSH


def test_frames_written_before_goodbye_are_delivered_first() -> None:
    a, b, _pa, _pb = make_pair()
    said_bye = threading.Event()

    def liveness() -> None:
        if said_bye.is_set():
            raise PeerClosed("bye")

    b.liveness = liveness
    for i in range(3):
        a.send((frame(FrameType.ACK, bytes([i]) * 8),), soon())
    said_bye.set()
    assert [bytes(b.recv(soon()).body)[0] for _ in range(3)] == [0, 1, 2]
    with pytest.raises(PeerClosed):
        b.recv(soon())
    assert b.take_ready() is None


def test_drain_waits_for_write_completions() -> None:
    a, _b, _pa, _pb = make_pair()
    a.send((frame(FrameType.ACK, b""),), soon())
    assert a.drain(soon())
    assert a.stage.completed == a.stage.posted == 1


def test_wr_ids_keep_their_kind() -> None:
    from transfer.rdma.pipe import split_wr_id

    for kind in WrKind:
        assert split_wr_id(wr_id(kind, 12345)) == (kind, 12345)


def test_shut_wakes_a_blocked_reader_before_the_queue_pair_goes() -> None:
    _, b, _, pb = make_pair()
    outcome: list[BaseException] = []
    polls_after_release: list[int] = []
    released = threading.Event()

    def reader() -> None:
        try:
            b.recv(soon())
        except BaseException as exc:
            outcome.append(exc)

    real_poll = pb.poll

    def guarded_poll(n: int) -> list[Completion]:
        if released.is_set():
            polls_after_release.append(n)  # would be a poll of a destroyed CQ
        return real_poll(n)

    pb.poll = guarded_poll  # type: ignore[method-assign,assignment]
    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.05)  # the reader is polling and sleeping by now
    b.shut(PeerUnreachableError("closed"), released.set)
    t.join(30)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], PeerUnreachableError)
    assert polls_after_release == []
