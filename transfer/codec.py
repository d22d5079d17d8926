"""The chunk codec: raw, zstd, or zstd over byte planes (byte grouping) for 2- and 4-byte floats.

Float weights compress badly as they are (bf16 ≈ 0.78 with zstd) because only the exponent byte is
regular; splitting each element into byte planes first puts those bytes together (bf16 ≈ 0.68).
`auto` tries both on a small sample of each chunk and sends the chunk raw when it would not shrink
below RAW_THRESHOLD, so incompressible data costs almost nothing.

Decoding is capped: a payload must declare exactly the raw length its chunk header promises, so a
hostile peer cannot make the receiver inflate more than one chunk's worth of memory.
"""

from __future__ import annotations

import enum
import threading
from typing import Literal

import xxhash
import zstandard

from transfer.errors import VerifyError

RAW_THRESHOLD = 0.95
ZSTD_LEVEL = 1  # level 1 compresses float weights as well as level 3 here, at twice the speed
_SAMPLE_SLICES = 3
_SAMPLE_BYTES = 8192

CompressMode = Literal["auto", "zstd", "none"]


class Codec(enum.IntEnum):
    RAW = 0
    ZSTD = 1
    ZSTD_BG2 = 2  # byte planes of 2-byte elements (bf16, fp16), then zstd
    ZSTD_BG4 = 3  # byte planes of 4-byte elements (fp32), then zstd


_GROUP = {Codec.ZSTD_BG2: 2, Codec.ZSTD_BG4: 4}
_local = threading.local()


def digest(data: bytes | bytearray | memoryview) -> bytes:
    """The chunk digest: xxh3-128, 16 bytes (20–30 GB/s, so hashing everything is free)."""
    return xxhash.xxh3_128_digest(data)


def root_digest(chunk_digests: list[bytes]) -> bytes:
    """A file's root digest: xxh3-128 over its chunk digests in order."""
    return xxhash.xxh3_128_digest(b"".join(chunk_digests))


def _cctx() -> zstandard.ZstdCompressor:
    ctx = getattr(_local, "cctx", None)
    if ctx is None:
        ctx = _local.cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return ctx


def _dctx() -> zstandard.ZstdDecompressor:
    ctx = getattr(_local, "dctx", None)
    if ctx is None:
        ctx = _local.dctx = zstandard.ZstdDecompressor()
    return ctx


def group_bytes(data: bytes | bytearray | memoryview, k: int) -> bytes:
    """Splits k-byte elements into k planes (all first bytes, then all second bytes, …); a tail stays."""
    import numpy as np  # here, not at the top: raw transfers should not pay numpy's import

    view = np.frombuffer(data, dtype=np.uint8)
    n = len(view) // k
    out = np.empty(len(view), dtype=np.uint8)
    body = view[: n * k]
    for i in range(k):  # one strided copy per plane is ~3 GB/s; a transpose copy is much slower
        out[i * n : (i + 1) * n] = body[i::k]
    out[n * k :] = view[n * k :]
    return out.tobytes()


def ungroup_bytes(data: bytes | bytearray | memoryview, k: int) -> bytes:
    """The inverse of group_bytes."""
    import numpy as np

    view = np.frombuffer(data, dtype=np.uint8)
    n = len(view) // k
    out = np.empty(len(view), dtype=np.uint8)
    for i in range(k):
        out[i : n * k : k] = view[i * n : (i + 1) * n]
    out[n * k :] = view[n * k :]
    return out.tobytes()


def _compress(data: bytes | bytearray | memoryview, codec: Codec) -> bytes:
    k = _GROUP.get(codec)
    return _cctx().compress(group_bytes(data, k) if k else data)


def _sample(data: memoryview) -> bytes:
    if len(data) <= _SAMPLE_SLICES * _SAMPLE_BYTES:
        return bytes(data)
    step = len(data) // _SAMPLE_SLICES
    # slices start at multiples of 4 so byte planes line up as they would in the whole chunk
    return b"".join(
        bytes(data[(i * step) & ~3 : ((i * step) & ~3) + _SAMPLE_BYTES]) for i in range(_SAMPLE_SLICES)
    )


def encode(
    data: bytes | bytearray | memoryview, mode: CompressMode, elem_size: int = 2
) -> tuple[Codec, bytes | memoryview]:
    """Chooses a codec for one chunk and returns (codec, payload); the payload may be `data` itself."""
    view = memoryview(data).cast("B")
    if mode == "none" or not view:
        return Codec.RAW, view
    # A few 8 KiB slices tell which layout compresses best (plain, 2- or 4-byte planes) for ~1% of
    # the cost of compressing the chunk; `elem_size` only breaks ties.
    sample = _sample(view)
    order = (
        (Codec.ZSTD_BG4, Codec.ZSTD_BG2, Codec.ZSTD)
        if elem_size == 4
        else (Codec.ZSTD_BG2, Codec.ZSTD_BG4, Codec.ZSTD)
    )
    plain = len(_compress(sample, Codec.ZSTD)) / len(sample)
    if mode == "auto" and plain >= 0.99:
        # Nothing zstd can see at all (random, already compressed): byte planes will not help either
        # (floats give ~0.92 plain), so skip trying them — this keeps `auto` ~free on such data.
        return Codec.RAW, view
    ratios = {c: (plain if c is Codec.ZSTD else len(_compress(sample, c)) / len(sample)) for c in order}
    best = min(order, key=lambda c: ratios[c])
    if mode == "auto" and ratios[best] > RAW_THRESHOLD:
        return Codec.RAW, view
    payload = _compress(view, best)
    if mode == "auto" and len(payload) > RAW_THRESHOLD * len(view):
        return Codec.RAW, view
    return best, payload


def decode(codec: int, payload: bytes | bytearray | memoryview, raw_len: int) -> bytes | memoryview:
    """Decodes one chunk payload to exactly `raw_len` bytes, or raises VerifyError."""
    try:
        kind = Codec(codec)
    except ValueError:
        raise VerifyError(f"unknown codec {codec}") from None
    if kind is Codec.RAW:
        if len(payload) != raw_len:
            raise VerifyError(f"raw chunk is {len(payload)} bytes, header says {raw_len}")
        return memoryview(payload)
    try:
        declared = zstandard.frame_content_size(bytes(payload[:18]))
    except zstandard.ZstdError as exc:
        raise VerifyError(f"bad zstd frame: {exc}") from None
    if declared != raw_len:
        # also refuses frames without a content size: they could inflate without bound
        raise VerifyError(f"compressed chunk declares {declared} bytes, header says {raw_len}")
    try:
        out = _dctx().decompress(payload, max_output_size=raw_len)
    except zstandard.ZstdError as exc:
        raise VerifyError(f"chunk does not decompress: {exc}") from None
    if len(out) != raw_len:
        raise VerifyError(f"chunk decompressed to {len(out)} bytes, header says {raw_len}")
    k = _GROUP.get(kind)
    return ungroup_bytes(out, k) if k else out
