"""Frames rebuilt from RDMA slot contents however they were cut: the pipe's FrameDecoder with a body
pool gives the same frames as the plain stream decoder, reusing each buffer once it is given back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from transfer.frames import BodyPool, FrameDecoder, FrameType, header


def _stream(bodies: list[bytes]) -> bytes:
    kinds = [FrameType.CHUNK, FrameType.ACK, FrameType.FLUSH, FrameType.DONE]
    return b"".join(header(kinds[i % 4], len(b)) + b for i, b in enumerate(bodies))


@settings(max_examples=100, deadline=None)
@given(
    # sizes around BodyPool.POOL_MIN, so CHUNK bodies go both ways (pooled and plain)
    st.lists(st.integers(0, 3 * BodyPool.POOL_MIN), max_size=10),
    st.lists(st.integers(1, 100_000), min_size=1, max_size=30),
)
def test_same_frames_as_the_stream_decoder_for_any_cut(sizes: list[int], cuts: list[int]) -> None:
    bodies = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    stream = _stream(bodies)
    want = [(f.type, bytes(f.body)) for f in FrameDecoder(1 << 20).feed(stream)]
    pool = BodyPool()
    dec = FrameDecoder(1 << 20, pool)
    got = []
    pos, i = 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        for frame in dec.feed(memoryview(stream)[pos : pos + step]):
            got.append((frame.type, bytes(frame.body)))
            pooled = frame.type is FrameType.CHUNK and len(frame.body) >= BodyPool.POOL_MIN
            assert (frame.lease is not None) == pooled
            if frame.lease is not None:
                pool.give(frame.lease)  # the caller is done with it: the next frame may reuse it
        pos += step
        i += 1
    assert got == want
    assert dec.pending == 0
