"""The record shape shared by every source, and how a value is shown as JSON.

A record is a plain tuple in the hot path (constructing a NamedTuple per record costs ~4x a tuple):
`(offset, timestamp_ms, key, headers, value)` with `key` bytes or None, `headers` a tuple of
`(name, value-bytes)` pairs and `value` bytes.
"""

from __future__ import annotations

import base64
import json
import re
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


_TAIL_END = b',"value_encoding":"json"}'
_TAIL_LEN = len(_TAIL_END)
_WS = re.compile(r"[ \t\n\r]*")
_SCAN = json.JSONDecoder()


def json_value_bytes(line: bytes, parsed: Any) -> bytes:
    """The bytes of the "value" member of a JSON line (already parsed whole, so valid JSON), as
    written: re-serialising what orjson parsed would turn -0 into 0, 1e2 into 100.0 and an integer
    past 64 bits into a float. The common case (a value orjson writes back the same, at the end of
    a line as `rq tail --format json` prints it) costs one dumps; others are cut out of the line."""
    dumped = orjson.dumps(parsed)
    # Compared in place (an end index, not a slice): no copy of the line.
    if line.endswith(dumped + _TAIL_END) and line.endswith(
        b'"value":', 0, len(line) - _TAIL_LEN - len(dumped)
    ):
        return dumped
    return _cut_value(line.rstrip(), parsed, dumped)


def _cut_value(line: bytes, parsed: Any, dumped: bytes) -> bytes:
    """The value's bytes cut out of a line where orjson would not write it back the same."""
    if line.endswith(_TAIL_END):
        # The value ends where the line's last member begins. It starts after the leftmost
        # `,"value":` from which the rest parses: such bytes cannot sit inside a string (the quotes
        # would be escaped), and one inside the headers leaves their closing brace unbalanced.
        stop = len(line) - len(_TAIL_END)
        at = line.find(b',"value":')
        while 0 <= at < stop:
            cut = line[at + 9 : stop]
            try:
                if orjson.loads(cut) == parsed:
                    return cut
            except orjson.JSONDecodeError:
                pass
            at = line.find(b',"value":', at + 1)
    text = line.decode("utf-8")
    raw = None
    i = _WS.match(text, 0).end() + 1  # type: ignore[union-attr]  # after the '{'
    while True:
        i = _WS.match(text, i).end()  # type: ignore[union-attr]
        if text[i] == "}":
            break
        name, i = _SCAN.raw_decode(text, i)
        i = _WS.match(text, i).end() + 1  # type: ignore[union-attr]  # after the ':'
        i = _WS.match(text, i).end()  # type: ignore[union-attr]
        _, end = _SCAN.raw_decode(text, i)
        if name == "value":
            raw = text[i:end]  # the last one wins, as in orjson
        i = _WS.match(text, end).end()  # type: ignore[union-attr]
        if text[i] == ",":
            i += 1
    return dumped if raw is None else raw.encode("utf-8")
