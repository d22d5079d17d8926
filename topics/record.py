"""The record shape shared by every source, and how a value is shown as JSON.

A record is a plain tuple in the hot path (constructing a NamedTuple per record costs ~4x a tuple):
`(offset, timestamp_ms, key, headers, value)` with `key` bytes or None, `headers` a tuple of
`(name, value-bytes)` pairs and `value` bytes.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

Headers = tuple[tuple[str, bytes], ...]
Record = tuple[int, int, "bytes | None", Headers, bytes]

OFFSET, TIMESTAMP, KEY, HEADERS, VALUE = range(5)
NO_HEADERS: Headers = ()


def encode_value(value: Any, encoding: str) -> bytes:
    """The inverse of render.decode: bytes from a JSON line written by `rq tail --format json`."""
    if encoding == "base64":
        if not isinstance(value, str):
            raise ValueError("a base64 value must be a string")
        return base64.b64decode(value, validate=True)
    if encoding == "text":
        if not isinstance(value, str):
            raise ValueError("a text value must be a string")
        return value.encode("utf-8")
    if encoding == "json":
        return orjson.dumps(value)
    raise ValueError(f"unknown value encoding {encoding!r} (json, text or base64)")


def encode_bytes_field(value: str | None, encoding: str) -> bytes | None:
    if value is None:
        return None
    if encoding == "base64":
        return base64.b64decode(value, validate=True)
    return value.encode("utf-8")
