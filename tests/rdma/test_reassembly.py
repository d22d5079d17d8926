"""Frames rebuilt from slot contents however they were cut, checked before any buffer is sized."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transfer.errors import ProtocolError
from transfer.frames import FrameDecoder, FrameType, header
from transfer.rdma.reassembly import Reassembler


def _stream(bodies: list[bytes]) -> bytes:
    kinds = [FrameType.CHUNK, FrameType.ACK, FrameType.FLUSH, FrameType.DONE]
    return b"".join(header(kinds[i % 4], len(b)) + b for i, b in enumerate(bodies))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.binary(max_size=3000), max_size=12),
    st.lists(st.integers(1, 5000), min_size=1, max_size=30),
)
def test_same_frames_as_the_stream_decoder_for_any_cut(bodies: list[bytes], cuts: list[int]) -> None:
    stream = _stream(bodies)
    want = [(f.type, bytes(f.body)) for f in FrameDecoder(1 << 20).feed(stream)]
    r = Reassembler(1 << 20)
    got = []
    pos, i = 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        for frame, buf in r.feed(memoryview(stream)[pos : pos + step]):
            got.append((frame.type, bytes(frame.body)))
            r.recycle(buf)  # the caller is done with it: the next frame may reuse the memory
        pos += step
        i += 1
    assert got == want
    assert r.pending == 0


def test_oversized_chunk_is_refused_from_its_header() -> None:
    r = Reassembler(1000)
    with pytest.raises(ProtocolError):
        r.feed(memoryview(header(FrameType.CHUNK, 1001)))
    with pytest.raises(ProtocolError, match="magic"):
        Reassembler(1000).feed(memoryview(b"XX" + bytes(6)))


def test_buffers_are_reused_after_recycle() -> None:
    r = Reassembler(1 << 20)
    ((_f1, b1),) = r.feed(memoryview(header(FrameType.CHUNK, 10) + bytes(10)))
    r.recycle(b1)
    ((f2, b2),) = r.feed(memoryview(header(FrameType.CHUNK, 20) + b"x" * 20))
    assert b2 is b1 and bytes(f2.body) == b"x" * 20
