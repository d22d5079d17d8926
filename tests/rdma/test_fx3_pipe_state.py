"""A completion out of step with what the pipe posted is a protocol error that breaks the pipe
(pipe.broken set, every later call raises it), not an unexpected ValueError escaping _pump."""

from __future__ import annotations

import time

import pytest
from fakeport import FakePort

from transfer.errors import ProtocolError
from transfer.frames import FrameType, header
from transfer.rdma.credits import ReadCredits
from transfer.rdma.pipe import Completion, Pipe, WrKind, post_receives, recv_depth, wr_id


def _pair() -> tuple[Pipe, Pipe, FakePort]:
    pa, pb = FakePort(4, 4096, 4, 4096), FakePort(4, 4096, 4, 4096)
    pa.connect(pb)
    a = Pipe(pa, 4, 4096, 4, 4096, 4, max_frame=1 << 20)
    b = Pipe(pb, 4, 4096, 4, 4096, 4, max_frame=1 << 20)
    post_receives(pa, recv_depth(4, 4))
    post_receives(pb, recv_depth(4, 4))
    return a, b, pa


def test_a_write_completion_never_posted_breaks_the_pipe() -> None:
    # Old code: ValueError('completion for write 7, posted 0, completed 0') out of recv, pipe.broken None.
    a, _b, pa = _pair()
    with pa.lock:
        pa.cq.append(Completion(wr_id(WrKind.WRITE, 7), 0))
    with pytest.raises(ProtocolError, match="completion for write 7"):
        a.recv(time.monotonic() + 10)
    assert isinstance(a.broken, ProtocolError)
    with pytest.raises(ProtocolError):  # the channel is done: sends fail at once, with the same error
        a.send((header(FrameType.ACK, 0),))


def test_a_completion_repeated_breaks_the_pipe() -> None:
    a, b, pa = _pair()
    a.send((header(FrameType.ACK, 0),), time.monotonic() + 10)
    assert b.recv(time.monotonic() + 10).type is FrameType.ACK
    assert a.drain(time.monotonic() + 10)  # write 0 completed
    with pa.lock:
        pa.cq.append(Completion(wr_id(WrKind.WRITE, 0), 0))  # and completes again
    with pytest.raises(ProtocolError, match="completion for write 0"):
        a.recv(time.monotonic() + 10)
    assert a.broken is not None


def test_consuming_a_slot_that_never_arrived_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        ReadCredits(2).consume()
