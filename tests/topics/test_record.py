"""Cutting a JSON value out of a `rq tail --format json` line as written (produce --format json)."""

from __future__ import annotations

import orjson
import pytest

from topics.record import json_value_bytes

LINES = [
    b'{"offset":0,"timestamp":1,"key":null,"headers":{},"value":-0,"value_encoding":"json"}',
    b'{"offset":0,"timestamp":1,"key":",\\"value\\":","headers":{"value":"x"},"value":{"a": 1e2},"value_encoding":"json"}',
    b'{"offset":0,"timestamp":1,"key":null,"headers":{"a":"b","value":"1"},"value":{"value": [1.50]},"value_encoding":"json"}\r\n',
    b'{ "value" : 123456789012345678901234567890 , "headers": {"value": 1} }',
    # orjson writes these values back the same: compared in place, at the end of the line
    b'{"offset":0,"timestamp":1,"key":null,"headers":{},"value":{"a":1},"value_encoding":"json"}',
    b'{"offset":0,"timestamp":1,"key":null,"headers":{},"value":{"a":1},"value_encoding":"json"} \r',
    # the same bytes end the line, but they are another member's, not the value's
    b'{"value":7,"x":1,"value_encoding":"json"}',
    b'{"value":[1.0],"x":{"a":1},"y":{"a":1},"value_encoding":"json"}',
]
WANT = [
    b"-0",
    b'{"a": 1e2}',
    b'{"value": [1.50]}',
    b"123456789012345678901234567890",
    b'{"a":1}',
    b'{"a":1}',
    b"7",
    b"[1.0]",
]


@pytest.mark.parametrize(("line", "want"), list(zip(LINES, WANT, strict=True)))
def test_the_value_is_cut_out_as_written(line: bytes, want: bytes) -> None:
    assert json_value_bytes(line, orjson.loads(line)["value"]) == want
