"""Records -> output bytes: `json` lines, `raw` values, or a template. Whole batches at a time, so
the per-record work is one orjson call and a list append (see FIELD-NOTES: orjson 2.7M rec/s)."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from topics.errors import SpecError
from topics.paths import MISSING, Path, get_path, parse_path, project
from topics.record import Headers, Record

Decoded = tuple[Any, str]  # (value as JSON-able, "json" | "text" | "base64")


def decode(value: bytes) -> Decoded:
    try:
        return orjson.loads(value), "json"
    except orjson.JSONDecodeError:
        pass
    try:
        return value.decode("utf-8"), "text"
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii"), "base64"


def _text_or_b64(data: bytes) -> tuple[str, bool]:
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), True


def headers_json(headers: Headers) -> dict[str, Any]:
    """Header values as text, or {"base64": ...} when binary; repeated names become lists."""
    out: dict[str, Any] = {}
    for name, raw in headers:
        text, b64 = _text_or_b64(raw)
        item: Any = {"base64": text} if b64 else text
        if name in out:
            prev = out[name]
            out[name] = [*prev, item] if isinstance(prev, list) else [prev, item]
        else:
            out[name] = item
    return out


def record_json(rec: Record, decoded: Decoded | None, fields: list[Path] | None) -> dict[str, Any]:
    offset, ts, key, headers, value = rec
    dv, enc = decoded if decoded is not None else decode(value)
    if fields is not None and enc == "json":
        dv = project(dv, fields)
    obj: dict[str, Any] = {"offset": offset, "timestamp": ts}
    if key is None:
        obj["key"] = None
    else:
        text, b64 = _text_or_b64(key)
        obj["key"] = text
        if b64:
            obj["key_encoding"] = "base64"
    obj["headers"] = headers_json(headers) if headers else {}
    if enc == "json" and fields is None:
        # The value as stored: what orjson parsed may not write back the same (-0, 1e2, integers
        # past 64 bits become floats). Raw line breaks in JSON can only be whitespace.
        obj["value"] = orjson.Fragment(bytes(value).replace(b"\n", b" ").replace(b"\r", b" "))
    else:
        obj["value"] = dv
    obj["value_encoding"] = enc
    return obj


class JsonRenderer:
    """One JSON object per line. Without --fields a JSON value is embedded as the bytes it already
    is (orjson.Fragment) once orjson has validated it: no re-serialisation of the value."""

    def __init__(self, fields: list[Path] | None):
        self.fields = fields

    def render(self, records: Sequence[Record], decoded: Sequence[Decoded] | None) -> list[bytes]:
        dumps = orjson.dumps
        nl = orjson.OPT_APPEND_NEWLINE
        fields = self.fields
        if decoded is not None or fields is not None:
            dec = decoded if decoded is not None else [decode(r[4]) for r in records]
            return [dumps(record_json(r, d, fields), option=nl) for r, d in zip(records, dec, strict=True)]
        loads, bad = orjson.loads, orjson.JSONDecodeError
        line = b'{"offset":%d,"timestamp":%d,"key":%b,"headers":%b,"value":%b,"value_encoding":"json"}\n'
        out: list[bytes] = []
        append = out.append
        for r in records:
            offset, ts, key, headers, value = r
            # The common case, formatted directly: a JSON value orjson has validated is copied
            # verbatim (unless a line break in it would break the one-line framing), a text key.
            try:
                loads(value)
                plain = b"\n" not in value and b"\r" not in value
                k = b"null" if key is None else dumps(key.decode("utf-8"))
            except (bad, UnicodeDecodeError):
                plain = False
            if plain:
                append(line % (offset, ts, k, dumps(headers_json(headers)) if headers else b"{}", value))
            else:
                append(dumps(record_json(r, decode(value), None), option=nl))
        return out


class RawRenderer:
    """The value bytes, each followed by the separator. With --fields, the projected JSON."""

    def __init__(self, sep: bytes, fields: list[Path] | None):
        self.sep = sep
        self.fields = fields

    def render(self, records: Sequence[Record], decoded: Sequence[Decoded] | None) -> bytes:
        if self.fields is None:
            values = [r[4] for r in records]
        else:
            dec = decoded if decoded is not None else [decode(r[4]) for r in records]
            values = [
                orjson.dumps(project(d[0], self.fields)) if d[1] == "json" else r[4]
                for r, d in zip(records, dec, strict=True)
            ]
        values.append(b"")
        return self.sep.join(values)


_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
# Control characters in a record's fields, shown as \xNN: an ESC from a record must not drive the
# terminal, and a line break must not split a record's line (C1 too: 0x9b is a CSI on some terminals).
# Bidi overrides and isolates, shown as \uNNNN (as table output shows them): they make what follows
# read backwards, in this record's line and on the terminal after it.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
}


class TemplateRenderer:
    """`'{offset} {key} {value.metadata.source}'`: names in braces, `{{`/`}}` for literal braces.

    Names: offset, timestamp, time (RFC 3339), key, value, value_encoding, headers.NAME, value.PATH.
    Control characters in what they give are escaped (\\x1b), as table and json output do.
    """

    def __init__(self, template: str, fields: list[Path] | None):
        self.fields = fields
        self.parts: list[str | Callable[[Record, Decoded], str]] = []
        pos = 0
        for m in _FIELD.finditer(template):
            self.parts.append(template[pos : m.start()])
            if m.group(0) in ("{{", "}}"):
                self.parts.append(m.group(0)[0])
            else:
                self.parts.append(_escaped(self._getter(m.group(1).strip())))
            pos = m.end()
        tail = template[pos:]
        if "{" in tail or "}" in tail:
            raise SpecError(f"bad template {template!r}: unbalanced brace")
        self.parts.append(tail)
        self.parts = [p for p in self.parts if p != ""]
        self.needs_value = any(callable(p) for p in self.parts)

    def _getter(self, name: str) -> Callable[[Record, Decoded], str]:
        if name == "offset":
            return lambda r, d: str(r[0])
        if name == "timestamp":
            return lambda r, d: str(r[1])
        if name == "time":
            return lambda r, d: datetime.fromtimestamp(r[1] / 1000, UTC).isoformat(timespec="milliseconds")
        if name == "key":
            return lambda r, d: "" if r[2] is None else _text_or_b64(r[2])[0]
        if name == "value_encoding":
            return lambda r, d: d[1]
        if name == "value":
            fields = self.fields
            return lambda r, d: _show(project(d[0], fields) if fields and d[1] == "json" else d[0])
        if name.startswith("headers."):
            hname = name[len("headers.") :]
            return lambda r, d: next((_text_or_b64(v)[0] for k, v in r[3] if k == hname), "")
        if name.startswith("value."):
            path = parse_path(name[len("value.") :])

            def get(r: Record, d: Decoded) -> str:
                v = get_path(d[0], path) if d[1] == "json" else MISSING
                return "" if v is MISSING else _show(v)

            return get
        raise SpecError(
            f"unknown template field {{{name}}}: use offset, timestamp, time, key, value, "
            "value.PATH, headers.NAME, value_encoding"
        )

    def render(self, records: Sequence[Record], decoded: Sequence[Decoded] | None) -> bytes:
        dec = decoded if decoded is not None else [decode(r[4]) for r in records]
        out = []
        for r, d in zip(records, dec, strict=True):
            out.append("".join(p if isinstance(p, str) else p(r, d) for p in self.parts))
        out.append("")
        return "\n".join(out).encode("utf-8", "surrogateescape")


def _escaped(get: Callable[[Record, Decoded], str]) -> Callable[[Record, Decoded], str]:
    return lambda r, d: get(r, d).translate(_CONTROL)


def _show(v: Any) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return "null"
    return orjson.dumps(v).decode()


Renderer = JsonRenderer | RawRenderer | TemplateRenderer


def make_renderer(fmt: str, fields: list[Path] | None, sep: bytes = b"\n") -> Renderer:
    if fmt == "json":
        return JsonRenderer(fields)
    if fmt == "raw":
        return RawRenderer(sep, fields)
    if "{" in fmt:
        return TemplateRenderer(fmt, fields)
    raise SpecError(
        f"unknown --format {fmt!r}: use json, raw, table or a template like '{{offset}} {{value}}'"
    )
