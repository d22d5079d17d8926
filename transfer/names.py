"""Names from the network are data, never paths: the checks a relative file name must pass.

A valid name is a `/`-separated relative path whose every component is a plain, printable name. The
receiver still opens it relative to a directory descriptor without following links (see store.py);
this module only decides whether the text is acceptable at all.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable
from typing import Any

from transfer.errors import NameTooLongError, UnsafeNameError

MAX_NAME_BYTES = 4096
MAX_COMPONENT_BYTES = 255
# The receiver keeps partial files and journals here; a sender may not name anything inside it.
STATE_DIR_NAME = ".rq-partial"
_PLAIN = re.compile(r"[ -\[\]-~]+")  # printable ASCII, no backslash: nothing to check per character


def validate_name(name: str) -> tuple[str, ...]:
    """Returns the components of `name`, or raises UnsafeNameError saying what is wrong with it."""
    if not isinstance(name, str) or not name:
        raise UnsafeNameError("empty file name")
    # most names are printable ASCII without a backslash: one regex match instead of a Python
    # loop over every character (a 100,000-file manifest's names were ~40% of its parse)
    plain = _PLAIN.fullmatch(name) is not None
    if (len(name) if plain else len(name.encode("utf-8", "surrogatepass"))) > MAX_NAME_BYTES:
        raise NameTooLongError(f"file name too long: {display_name(name)[:80]}…")
    if name.startswith("/"):
        raise UnsafeNameError(f"absolute path not allowed: {display_name(name)}")
    if not plain:
        if "\\" in name:
            raise UnsafeNameError(f"backslash not allowed in file name: {display_name(name)}")
        if any("\udc80" <= ch <= "\udcff" for ch in name):  # os.fsdecode's escapes for undecodable bytes
            raise UnsafeNameError(f"file name is not valid UTF-8: {display_name(name)}")
        for ch in name:
            if unicodedata.category(ch) in ("Cc", "Cs") or ch == "\x00":
                raise UnsafeNameError(f"control character in file name: {display_name(name)}")
    parts = tuple(name.split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafeNameError(f"empty, '.' or '..' component not allowed: {display_name(name)}")
        if (len(part) if plain else len(part.encode("utf-8"))) > MAX_COMPONENT_BYTES:
            raise UnsafeNameError(f"file name component too long: {display_name(name)[:80]}…")
    if parts[0] == STATE_DIR_NAME:
        raise UnsafeNameError(f"name inside rq's state directory not allowed: {display_name(name)}")
    return parts


_PLAIN_LINES = re.compile(r"[ -\[\]-~\n]*")  # printable ASCII names (no backslash), joined by newlines


def all_plain_and_valid(names: list[Any]) -> bool:
    """Whether every one of `names` is a printable ASCII name (no backslash) that validate_name
    accepts, found with a few passes of C over them all instead of a call per name: a manifest of
    100,000 files spent ~40% of its parse validating names one by one. False means "check each
    with validate_name" (which says what is wrong), not that one is wrong."""
    if not names:
        return True
    if set(map(type, names)) != {str}:
        return False
    text = "\n".join(names)
    if text.count("\n") != len(names) - 1 or _PLAIN_LINES.fullmatch(text) is None:
        return False  # a name holding a newline, or one not plain ASCII
    if max(map(len, names)) > MAX_NAME_BYTES or text.startswith("/") or "\n/" in text:
        return False  # too long, or absolute
    parts = text.replace("\n", "/").split("/")
    if max(map(len, parts)) > MAX_COMPONENT_BYTES:
        return False
    # an empty, '.' or '..' component; a .rq-partial anywhere (refused only first: see each)
    return not {"", ".", "..", STATE_DIR_NAME} & set(parts)


def descend(fd: int, parts: Iterable[str], flags: int) -> int:
    """A new descriptor of the directory reached from directory `fd` through `parts`, each opened
    relative to the last with `flags` (O_NOFOLLOW in them: never through a link); `fd` stays open."""
    fd = os.dup(fd)
    try:
        for part in parts:
            nfd = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def display_name(name: str) -> str:
    """`name` with control and non-printable characters escaped, safe to show on a terminal."""
    out = []
    for ch in name:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            out.append(f"\\u{ord(ch):04x}" if ord(ch) > 0xFF else f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


SHORT_PATH = 200  # characters of a path a one-line message shows before eliding its middle


def short_path(path: str | os.PathLike[str], limit: int = SHORT_PATH) -> str:
    """`path` for a one-line message: control characters escaped (display_name), and past `limit`
    characters its middle elided (`…`), keeping the start (which SOURCE) and, longer, the end (which
    entry). A directory 3,000 bytes deep that could not be listed printed all of it in the error."""
    text = display_name(os.fsdecode(path))
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    tail = limit - head - 1
    return f"{text[:head]}…{text[-tail:]}"
