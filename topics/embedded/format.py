"""Byte layout of the embedded log's segments and indexes (documented in docs/topics.md).

A segment `<base offset, 20 digits>.log` is a sequence of batches. Little-endian throughout.

    batch   := BATCH_HEADER records
    BATCH_HEADER (44 bytes):
        magic 'RQB1' | base_offset u64 | count u32 | payload_len u32 | first_ts i64 | max_ts i64
        | payload_crc u32 (CRC-32 of the records bytes) | header_crc u32 (CRC-32 of the 40 bytes before it)
    record  := RECORD_HEADER key headers value
    RECORD_HEADER (36 bytes):
        length u32 (bytes after this field) | crc u32 (CRC-32 of the bytes after this field)
        | offset u64 | timestamp_ms i64 | key_len i32 (-1: no key) | headers_len u32 | value_len u32
    headers := count u16, then per header: name_len u16, name UTF-8, value_len u32, value

The batch CRC lets a reader check a whole batch with one C call; the record CRC pins a corruption to
one offset and lets `--skip-corrupt` keep the good records of a damaged batch.

An index `<base>.idx` holds 24-byte entries `offset u64 | position u64 | first_ts i64`, one per batch
that starts at least INDEX_INTERVAL bytes after the previous entry. Timestamps in a topic never
decrease (the writer clamps them), so the same entries serve offset and time seeks by bisection.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

from topics.errors import SpecError
from topics.record import NO_HEADERS, Headers, Record

MAGIC = b"RQB1"
BATCH = struct.Struct("<4sQIIqqII")
BATCH_SIZE = BATCH.size  # 44
RECORD = struct.Struct("<IIQqiII")
RECORD_SIZE = RECORD.size  # 36
RECORD_BODY = struct.Struct("<Qqi" + "II")  # the header fields covered by the record CRC
LEN_CRC = struct.Struct("<II")
INDEX = struct.Struct("<QQq")
INDEX_SIZE = INDEX.size  # 24
INDEX_INTERVAL = 64 * 1024
MAX_BATCH_PAYLOAD = 256 * 1024 * 1024  # a header claiming more is corrupt
HEADER_COUNT = struct.Struct("<H")
HEADER_NAME = struct.Struct("<H")
HEADER_VALUE = struct.Struct("<I")

# (timestamp or None, key, headers, value) — what a writer appends.
Pending = tuple[int | None, bytes | None, Headers, bytes]


def segment_name(base: int) -> str:
    return f"{base:020d}.log"


def index_name(base: int) -> str:
    return f"{base:020d}.idx"


def encode_headers(headers: Headers) -> bytes:
    if not headers:
        return b""
    parts = [HEADER_COUNT.pack(len(headers))]
    for name, value in headers:
        if not name:
            # stored, it could not be read back in: `rq produce --format json` refuses a nameless header
            raise SpecError("a record has a header with an empty name: give every header a name")
        raw = name.encode("utf-8")
        parts += [HEADER_NAME.pack(len(raw)), raw, HEADER_VALUE.pack(len(value)), value]
    return b"".join(parts)


def record_size(key: bytes | None, headers: Headers, value: bytes) -> int:
    """Bytes one record takes in a batch payload."""
    return RECORD_SIZE + (len(key) if key is not None else 0) + len(encode_headers(headers)) + len(value)


def decode_headers(buf: bytes | memoryview, pos: int, length: int) -> Headers:
    end = pos + length
    (count,) = HEADER_COUNT.unpack_from(buf, pos)
    pos += 2
    out = []
    for _ in range(count):
        (nlen,) = HEADER_NAME.unpack_from(buf, pos)
        pos += 2
        name = bytes(buf[pos : pos + nlen]).decode("utf-8", "replace")
        pos += nlen
        (vlen,) = HEADER_VALUE.unpack_from(buf, pos)
        pos += 4
        out.append((name, bytes(buf[pos : pos + vlen])))
        pos += vlen
    if pos != end:
        raise ValueError("headers length mismatch")
    return tuple(out)


def encode_batch(base_offset: int, records: Sequence[Pending], ts: Sequence[int]) -> bytes:
    """One batch: header + records. `ts` holds the (already clamped) timestamp of each record."""
    body_pack = RECORD_BODY.pack
    lencrc = LEN_CRC.pack
    crc32 = zlib.crc32
    parts: list[bytes] = []
    append = parts.append
    offset = base_offset
    for (_, key, headers, value), stamp in zip(records, ts, strict=True):
        hdr = encode_headers(headers) if headers else b""
        if key is None:
            body = body_pack(offset, stamp, -1, len(hdr), len(value))
            crc = crc32(value, crc32(hdr, crc32(body)))
            append(lencrc(4 + len(body) + len(hdr) + len(value), crc))
            append(body)
        else:
            body = body_pack(offset, stamp, len(key), len(hdr), len(value))
            crc = crc32(value, crc32(hdr, crc32(key, crc32(body))))
            append(lencrc(4 + len(body) + len(key) + len(hdr) + len(value), crc))
            append(body)
            append(key)
        if hdr:
            append(hdr)
        append(value)
        offset += 1
    payload = b"".join(parts)
    head = struct.pack(
        "<4sQIIqqI", MAGIC, base_offset, len(records), len(payload), ts[0], ts[-1], zlib.crc32(payload)
    )
    return head + struct.pack("<I", zlib.crc32(head)) + payload


class BatchHeader:
    __slots__ = ("base", "count", "first_ts", "max_ts", "payload_crc", "payload_len")

    def __init__(self, base: int, count: int, payload_len: int, first_ts: int, max_ts: int, crc: int):
        self.base = base
        self.count = count
        self.payload_len = payload_len
        self.first_ts = first_ts
        self.max_ts = max_ts
        self.payload_crc = crc

    @property
    def end(self) -> int:
        return self.base + self.count


def read_batch_header(buf: bytes | memoryview, pos: int) -> BatchHeader | None:
    """The batch header at pos, or None when it is not a valid header (wrong magic or CRC)."""
    if len(buf) - pos < BATCH_SIZE:
        return None
    magic, base, count, plen, first_ts, max_ts, pcrc, hcrc = BATCH.unpack_from(buf, pos)
    if magic != MAGIC or zlib.crc32(buf[pos : pos + BATCH_SIZE - 4]) != hcrc:
        return None
    if plen > MAX_BATCH_PAYLOAD or count == 0:
        return None
    return BatchHeader(base, count, plen, first_ts, max_ts, pcrc)


def decode_records(buf: bytes | memoryview, pos: int, end: int) -> list[Record]:
    """All records in buf[pos:end] (a batch payload whose CRC already passed)."""
    unpack = RECORD.unpack_from
    out: list[Record] = []
    append = out.append
    none_headers = NO_HEADERS
    while pos < end:
        length, _crc, offset, ts, klen, hlen, vlen = unpack(buf, pos)
        p = pos + RECORD_SIZE
        if klen >= 0:
            key: bytes | None = buf[p : p + klen]  # type: ignore[assignment]
            p += klen
        else:
            key = None
        if hlen:
            headers = decode_headers(buf, p, hlen)
            p += hlen
        else:
            headers = none_headers
        append((offset, ts, key, headers, buf[p : p + vlen]))  # type: ignore[arg-type]
        pos += 4 + length
    return out


def decode_values(buf: bytes | memoryview, pos: int, end: int, first: int, stop: int) -> list[bytes]:
    """Only the values of records with first <= offset < stop: the `--format raw` fast path."""
    unpack = RECORD.unpack_from
    out: list[bytes] = []
    append = out.append
    while pos < end:
        length, _crc, offset, _ts, klen, hlen, vlen = unpack(buf, pos)
        if first <= offset < stop:
            p = pos + RECORD_SIZE + (klen if klen > 0 else 0) + hlen
            append(buf[p : p + vlen])  # type: ignore[arg-type]
        pos += 4 + length
    return out


def check_records(buf: bytes | memoryview, pos: int, end: int) -> tuple[list[Record], list[tuple[int, int]]]:
    """A batch whose CRC failed, record by record: (good records, [(offset or -1, position) bad])."""
    good: list[Record] = []
    bad: list[tuple[int, int]] = []
    while pos < end:
        if end - pos < RECORD_SIZE:
            bad.append((-1, pos))
            break
        length, crc, offset, _ts, klen, hlen, vlen = RECORD.unpack_from(buf, pos)
        rec_end = pos + 4 + length
        sane = (
            length >= RECORD_SIZE - 4
            and rec_end <= end
            and klen >= -1
            and RECORD_SIZE + max(klen, 0) + hlen + vlen == 4 + length
        )
        if not sane:
            bad.append((offset if sane else -1, pos))
            break  # the length field itself is damaged: the rest of the batch cannot be framed
        if zlib.crc32(buf[pos + 8 : rec_end]) != crc:
            bad.append((offset, pos))
        else:
            try:
                good.extend(decode_records(buf, pos, rec_end))
            except (ValueError, struct.error, UnicodeDecodeError):
                bad.append((offset, pos))
        pos = rec_end
    return good, bad
