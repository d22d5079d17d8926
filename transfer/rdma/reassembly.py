"""Slot contents in, whole frames out, each byte copied once into a reused buffer.

The RDMA ring is reused as soon as a slot is read, so frame bytes must be copied out of it; this
copies them exactly once, straight into the body buffer of the frame they belong to (validated by
transfer.frames.parse_header before any buffer is sized, so a peer cannot make us allocate more than
one chunk). Body buffers are recycled: by the driver contract (docs/transfer.md) a frame's body is
valid until the next recv() on the channel, and fresh memory is slow to touch (FIELD-NOTES).
"""

from __future__ import annotations

from transfer.frames import HEADER, Frame, parse_header

MIN_BUFFER = 64 * 1024


class Reassembler:
    def __init__(self, max_chunk_body: int):
        self._max = max_chunk_body
        self._head = bytearray()
        self._kind: object = None
        self._body: memoryview | None = None
        self._buf: bytearray | None = None
        self._filled = 0
        self._free: list[bytearray] = []

    def feed(self, data: memoryview) -> list[tuple[Frame, bytearray | None]]:
        """Frames completed by `data`, each with the buffer to hand back through `recycle`."""
        out: list[tuple[Frame, bytearray | None]] = []
        pos, n = 0, len(data)
        while pos < n or (self._body is not None and self._filled == len(self._body)):
            if self._body is None:
                take = min(HEADER.size - len(self._head), n - pos)
                self._head += data[pos : pos + take]
                pos += take
                if len(self._head) < HEADER.size:
                    break
                kind, length = parse_header(self._head, self._max)
                self._head.clear()
                self._kind = kind
                self._buf = self._take(length) if length else None
                self._body = memoryview(self._buf)[:length] if self._buf is not None else memoryview(b"")
                self._filled = 0
            take = min(len(self._body) - self._filled, n - pos)
            if take:
                self._body[self._filled : self._filled + take] = data[pos : pos + take]
                self._filled += take
                pos += take
            if self._filled == len(self._body):
                out.append((Frame(self._kind, self._body), self._buf))  # type: ignore[arg-type]
                self._body, self._buf, self._filled = None, None, 0
        return out

    @property
    def pending(self) -> int:
        return len(self._head) + self._filled

    def _take(self, length: int) -> bytearray:
        for i, buf in enumerate(self._free):
            if len(buf) >= length:
                return self._free.pop(i)
        return bytearray(max(length, MIN_BUFFER))

    def recycle(self, buf: bytearray | None) -> None:
        if buf is not None and len(self._free) < 8:
            self._free.append(buf)
