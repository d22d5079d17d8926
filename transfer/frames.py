"""Frames on the wire (docs/protocol.md): an 8-byte header, then a body of the stated length.

    header = b"RQ" | version u8 | type u8 | body length u32 (big-endian)

FrameDecoder turns any byte stream (a TCP socket, a QUIC stream) into frames without doing I/O
itself; it refuses a frame longer than its cap before buffering it, so a peer cannot make the
receiver allocate more than one chunk plus header.
"""

from __future__ import annotations

import enum
import struct
import threading
from dataclasses import dataclass
from typing import Any

import orjson

from transfer import aligned
from transfer.errors import ProtocolError

MAGIC = b"RQ"
WIRE_VERSION = 1
HEADER = struct.Struct("!2sBBI")
CHUNK = struct.Struct("!IIIB16s")  # file index, chunk index, raw length, codec, xxh3-128 digest
PAIR = struct.Struct("!II")  # (file index, chunk index) in ACK and NACK bodies
CONTROL_MAX = 64 * 1024 * 1024  # manifests and ACCEPT bodies; the receiver's own limit is lower


class FrameType(enum.IntEnum):
    HELLO = 1  # sender → receiver: JSON {role, transfer_id, nonce}
    CHALLENGE = 2  # receiver → sender: JSON {nonce}
    AUTH = 3  # sender → receiver: JSON {mac} (+ the manifest follows on the control channel)
    MANIFEST = 4  # sender → receiver: JSON manifest (control channel only)
    ACCEPT = 5  # receiver → sender: JSON {have: {file index: [[chunk, digest hex], ...]}}
    READY = 6  # receiver → sender: a data channel may send chunks
    CHUNK = 7  # sender → receiver: CHUNK header + payload
    ACK = 8  # receiver → sender: pairs that are verified and durable
    NACK = 9  # receiver → sender: pairs that failed verification; send them again
    FLUSH = 10  # sender → receiver: make everything durable and ACK it now
    COMMIT = 11  # sender → receiver: JSON {roots: [hex per file]} (control channel only)
    DONE = 12  # receiver → sender: JSON summary; files are in place
    # receiver → sender, control channel, only to a sender whose HELLO listed "progress": the
    # commit is still being worked on (JSON {"seconds": float}); an older sender refuses type 13
    PROGRESS = 13
    ERROR = 15  # either way: JSON {code, message}; the channel closes after it


@dataclass(frozen=True)
class ChunkHeader:
    file: int
    index: int
    raw_len: int
    codec: int
    digest: bytes


@dataclass
class Frame:
    type: FrameType
    body: memoryview
    lease: memoryview | None = None  # the BodyPool buffer behind body, to give back when done

    def json(self) -> Any:
        try:
            return orjson.loads(bytes(self.body))
        except orjson.JSONDecodeError:
            raise ProtocolError(f"{self.type.name} body is not JSON") from None

    def json_object(self) -> dict[str, Any]:
        """The body as a JSON object: anything else from a peer is a protocol error, not a crash."""
        obj = self.json()
        if not isinstance(obj, dict):
            raise ProtocolError(f"{self.type.name} body is not a JSON object")
        return obj


def header(ftype: FrameType, body_len: int) -> bytes:
    return HEADER.pack(MAGIC, WIRE_VERSION, ftype, body_len)


PRE_AUTH_LIMIT = 64 * 1024  # what a peer may make us buffer before it proved it knows the token


def parse_header(
    data: bytes | bytearray | memoryview, max_body: int, limit: int | None = None
) -> tuple[FrameType, int]:
    magic, version, ftype, length = HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError("not an rq peer (bad frame magic)")
    if version != WIRE_VERSION:
        raise ProtocolError(f"peer speaks wire version {version}, this rq speaks {WIRE_VERSION}")
    try:
        kind = FrameType(ftype)
    except ValueError:
        raise ProtocolError(f"unknown frame type {ftype}") from None
    cap = max_body if kind is FrameType.CHUNK else CONTROL_MAX
    if limit is not None:
        cap = min(cap, limit)
    if length > cap:
        raise ProtocolError(f"{kind.name} frame of {length} bytes is over the {cap} allowed")
    return kind, length


def control(ftype: FrameType, obj: Any) -> bytes:
    body = orjson.dumps(obj)
    return header(ftype, len(body)) + body


def chunk_frame_header(h: ChunkHeader, payload_len: int) -> bytes:
    return header(FrameType.CHUNK, CHUNK.size + payload_len) + CHUNK.pack(
        h.file, h.index, h.raw_len, h.codec, h.digest
    )


def parse_chunk(body: memoryview) -> tuple[ChunkHeader, memoryview]:
    if len(body) < CHUNK.size:
        raise ProtocolError("CHUNK frame shorter than its header")
    f, k, raw_len, codec, dig = CHUNK.unpack_from(body)
    return ChunkHeader(f, k, raw_len, codec, dig), body[CHUNK.size :]


def pairs_frame(ftype: FrameType, pairs: list[tuple[int, int]]) -> bytes:
    body = b"".join(PAIR.pack(f, k) for f, k in pairs)
    return header(ftype, len(body)) + body


def parse_pairs(body: memoryview) -> list[tuple[int, int]]:
    if len(body) % PAIR.size:
        raise ProtocolError("ACK/NACK body is not a whole number of pairs")
    return [PAIR.unpack_from(body, i) for i in range(0, len(body), PAIR.size)]


def error_frame(code: str, message: str, details: dict[str, Any] | None = None) -> bytes:
    return control(FrameType.ERROR, {**(details or {}), "code": code, "message": message})


class BodyPool:
    """Reusable CHUNK body buffers: page-aligned so the payload after the chunk header starts on a
    page (the store can write it with O_DIRECT), and reused so a body never lands in fresh memory,
    which this kind of VM is slow to touch. Thread-safe: one thread takes, another gives back."""

    POOL_MIN = 64 * 1024  # smaller bodies are cheap as plain bytearrays

    def __init__(self, keep: int = 8):
        self._free: list[memoryview] = []
        self._keep = keep
        self._lock = threading.Lock()

    def take(self, length: int) -> memoryview:
        """The smallest kept buffer that holds `length` bytes (big ones stay for big chunks), or a
        new one."""
        with self._lock:
            fits = [i for i, buf in enumerate(self._free) if len(buf) >= length]
            if fits:
                return self._free.pop(min(fits, key=lambda i: len(self._free[i])))
        return aligned.buffer(length, lead=CHUNK.size)

    def give(self, buf: memoryview) -> None:
        """Keeps `buf` for a later take; when full, the smallest buffer is the one let go, so a run
        of short (compressed, last) chunks cannot crowd out the full-size ones."""
        with self._lock:
            self._free.append(buf)
            if len(self._free) > self._keep:
                self._free.remove(min(self._free, key=len))

    def clear(self) -> None:
        """Lets every kept buffer go (freed at once unless a frame still holds it)."""
        with self._lock:
            self._free.clear()


class FrameDecoder:
    """Bytes in, frames out. Feed whatever arrived; complete frames come back from `feed`.

    A body is copied once, straight into a buffer of its announced size (after the header passed
    the size check), so a 4 MiB chunk arriving as 300 datagrams costs one copy, not three. With a
    `pool`, big CHUNK bodies go into its buffers and each such frame carries its `lease`: the
    consumer gives it back once it is done with the body."""

    def __init__(self, max_chunk_body: int, pool: BodyPool | None = None):
        self._max = max_chunk_body
        self._pool = pool
        self.limit: int | None = None  # a tighter cap while the peer is not authenticated
        self._head = bytearray()
        self._need: tuple[FrameType, int] | None = None
        self._body: bytearray | memoryview = bytearray()
        self._lease: memoryview | None = None
        self._filled = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        view = memoryview(data).cast("B")
        out: list[Frame] = []
        while view:
            if self._need is None:
                take = min(HEADER.size - len(self._head), len(view))
                self._head += view[:take]
                view = view[take:]
                if len(self._head) < HEADER.size:
                    break
                kind, length = parse_header(self._head, self._max, self.limit)
                self._head = bytearray()
                self._need, self._body, self._filled = (kind, length), self._new_body(kind, length), 0
                if length:
                    continue
            else:
                kind, length = self._need
                take = min(length - self._filled, len(view))
                self._body[self._filled : self._filled + take] = view[:take]
                self._filled += take
                view = view[take:]
            kind, length = self._need
            if self._filled == length:
                out.append(Frame(kind, memoryview(self._body), self._lease))
                self._need, self._body, self._lease, self._filled = None, bytearray(), None, 0
        return out

    def _new_body(self, kind: FrameType, length: int) -> bytearray | memoryview:
        if self._pool is None or kind is not FrameType.CHUNK or length < BodyPool.POOL_MIN:
            return bytearray(length)
        self._lease = self._pool.take(length)
        return self._lease[:length]

    def drop_partial(self) -> None:
        """Forgets a frame half received (the stream is closed: it will never complete)."""
        self._head, self._need, self._body, self._lease, self._filled = (
            bytearray(),
            None,
            bytearray(),
            None,
            0,
        )

    @property
    def pending(self) -> int:
        return len(self._head) + self._filled
