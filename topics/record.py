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


def decode_value(value: bytes) -> tuple[Any, str]:
    """(decoded, encoding): JSON when the bytes are JSON, UTF-8 text when text, base64 otherwise."""
    try:
        return orjson.loads(value), "json"
    except orjson.JSONDecodeError:
        pass
    try:
        return value.decode("utf-8"), "text"
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii"), "base64"


def decode_bytes_field(data: bytes | None) -> tuple[str | None, str]:
    """Key and header values: UTF-8 text when they are text, else base64 (and said which)."""
    if data is None:
        return None, "text"
    try:
        return data.decode("utf-8"), "text"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def encode_value(value: Any, encoding: str) -> bytes:
    """The inverse of decode_value: bytes from a JSON line written by `rq tail --format json`."""
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
