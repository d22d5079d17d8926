"""Field paths into JSON values (`metadata.quality_score`, `tags[0]`, `a."odd.name"`) and `--fields`."""

from __future__ import annotations

import re
from typing import Any

from topics.errors import SpecError

Path = tuple[str | int, ...]
MISSING: Any = object()

_PART = re.compile(r'\s*(?:([A-Za-z_$][A-Za-z0-9_\-$]*)|"((?:[^"\\]|\\.)*)"|\[(\d+)\]|\[-(\d+)\])')


def parse_path(text: str) -> Path:
    """`a.b[2]."c d"` -> ("a", "b", 2, "c d"). Dots separate names; [N] indexes lists."""
    parts: list[str | int] = []
    pos, need_name = 0, True
    text = text.strip()
    while pos < len(text):
        if not need_name and text[pos] == ".":
            pos += 1
            need_name = True
            continue
        m = _PART.match(text, pos)
        if m is None or (m.group(3) is None and m.group(4) is None and not need_name):
            raise SpecError(f"bad field path {text!r} near position {pos}")
        if m.group(1) is not None:
            parts.append(m.group(1))
        elif m.group(2) is not None:
            parts.append(m.group(2).replace('\\"', '"').replace("\\\\", "\\"))
        elif m.group(3) is not None:
            parts.append(int(m.group(3)))
        else:
            parts.append(-int(m.group(4)))
        pos, need_name = m.end(), False
    if not parts or need_name:
        raise SpecError(f"bad field path {text!r}")
    return tuple(parts)


def get_path(obj: Any, path: Path) -> Any:
    """The value at path, or MISSING."""
    for part in path:
        if isinstance(part, str):
            if not isinstance(obj, dict):
                return MISSING
            obj = obj.get(part, MISSING)
            if obj is MISSING:
                return MISSING
        else:
            if not isinstance(obj, list) or not -len(obj) <= part < len(obj):
                return MISSING
            obj = obj[part]
    return obj


def parse_fields(text: str) -> list[Path]:
    """`--fields image,metadata.quality_score` -> list of paths (commas outside quotes separate)."""
    out: list[Path] = []
    buf: list[str] = []
    quoted = False
    for ch in text + ",":
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            item = "".join(buf).strip()
            if item:
                out.append(parse_path(item))
            buf = []
        else:
            buf.append(ch)
    if not out:
        raise SpecError("--fields needs at least one field path, e.g. --fields image,metadata.source")
    return out


def project(obj: Any, paths: list[Path]) -> Any:
    """Only the selected fields, nested as they were. Missing fields are left out; list indexes
    select single elements (kept as a one-element list in their place)."""
    out: dict[str, Any] = {}
    for path in paths:
        value = get_path(obj, path)
        if value is MISSING:
            continue
        _put(out, path, value)
    return out


def _put(out: dict[str, Any], path: Path, value: Any) -> None:
    node: Any = out
    for i, part in enumerate(path):
        last = i == len(path) - 1
        key = part if isinstance(part, str) else f"[{part}]"
        if last:
            node[key] = value
        else:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                return
