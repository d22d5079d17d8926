"""The SPEC grammar: where a read starts and stops, by offset or by time.

    SPEC     := POS | RANGE
    RANGE    := [POS] ':' [POS]            # empty side: start / end
    POS      := 'start' | 'end'
              | N                          # absolute offset
              | '+' N                      # N after the first offset still in the topic
              | '-' N                      # N before the end (end = last offset + 1)
              | '@' RFC3339                # 2026-11-22T10:00:00Z, 2026-11-22T10:00:00.250+01:00, 2026-11-22
              | '@' UNIX_MS                # @1795000000000
              | '@' ('-'|'+') DURATION     # @-1h, @-1h30m, @-90s, @-500ms, @-2d, @-5000 (ms; relative to now)
              | '@now'

Time positions resolve to the first offset whose timestamp is >= the time, which makes bounds exact:
`--from @t` yields no record before t and `--to @t` (exclusive) none at or after t.
Offsets as `--to` are exclusive too: `--from 10 --to 20` is offsets 10..19.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

from topics.errors import SpecError

Kind = Literal["offset", "start+", "end-", "time", "ago"]

_DURATION = re.compile(r"([0-9]+)(ms|s|m|h|d|w)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


@dataclass(frozen=True)
class Position:
    """One side of a range. `value` is an offset, a count or milliseconds depending on `kind`."""

    kind: Kind
    value: int
    text: str

    @property
    def is_time(self) -> bool:
        return self.kind in ("time", "ago")


START = Position("start+", 0, "start")
END = Position("end-", 0, "end")


@dataclass(frozen=True)
class Range:
    start: Position
    stop: Position | None  # None: open (follow or read to the current end)


class Bounds(Protocol):
    """What a source tells the resolver: offsets still present and a time lookup."""

    def first_offset(self) -> int: ...

    def end_offset(self) -> int: ...  # last offset + 1

    def offset_for_time(self, ts_ms: int) -> int: ...  # first offset with timestamp >= ts_ms, else end

    def offset_before_end(self, n: int) -> int: ...  # the offset where the last n records start


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²', which int() rejects."""
    return bool(text) and text.isascii() and text.isdigit()


def parse_duration_ms(text: str) -> int:
    """'1h30m' -> 5_400_000. Units: ms s m h d w."""
    pos, total = 0, 0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNIT_MS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise SpecError(f"bad duration {text!r}: use e.g. 90s, 15m, 1h30m, 2d")
    if total > _MAX_MS:
        raise SpecError(f"bad duration {text!r}: longer than the calendar")
    return total


_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: beyond it no calendar (or server) follows


_FRACTION = re.compile(r"(\d\d:\d\d:\d\d)[.,](\d+)")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time_ms(text: str) -> int:
    """RFC 3339 / ISO 8601 (UTC when no zone is given) or Unix milliseconds -> Unix milliseconds.

    Exact, in integers: a time with digits below the millisecond rounds up to the next one,
    since records carry whole milliseconds and a bound means "at or after the time"."""
    if _digits(text):
        if int(text) > _MAX_MS:
            raise SpecError(f"bad time @{text}: Unix milliseconds past the year 9999")
        return int(text)
    # RFC 3339 allows 't' and 'z'; Python 3.11's fromisoformat does not, nor a fraction it can't
    # hold in microseconds exactly: the fraction is read here.
    iso = text.upper()
    fraction = ""
    m = _FRACTION.search(iso)
    if m is not None and m.start() >= 10:
        iso, fraction = iso[: m.start()] + m.group(1) + iso[m.end() :], m.group(2)
    try:
        when = datetime.fromisoformat(iso)
    except ValueError:
        raise SpecError(
            f"bad time {text!r}: use RFC 3339 (2026-11-22T10:00:00Z), Unix milliseconds, or -1h"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - _EPOCH) // timedelta(seconds=1)
    ms = 0
    if fraction:
        ms = -(-int(fraction) * 1000 // 10 ** len(fraction))  # the ceiling, in integers
    return seconds * 1000 + ms


MAX_OFFSET = 2**63 - 1  # offsets and stream sequences are 64-bit on disk, on the wire, in JSON


def _offset(digits: str) -> int:
    if len(digits) > 19 or int(digits) > MAX_OFFSET:
        raise SpecError(f"bad SPEC: offset {digits[:30]}{'…' if len(digits) > 30 else ''} is past 2^63-1")
    return int(digits)


def parse_position(text: str) -> Position:
    t = text.strip()
    if t == "start":
        return START
    if t == "end":
        return END
    if _digits(t):
        return Position("offset", _offset(t), t)
    if len(t) > 1 and t[0] in "+-" and _digits(t[1:]):
        return Position("start+" if t[0] == "+" else "end-", _offset(t[1:]), t)
    if t.startswith("@"):
        body = t[1:]
        if body == "now":
            return Position("ago", 0, t)
        if body[:1] in ("-", "+"):
            ms = int(body[1:]) if _digits(body[1:]) else parse_duration_ms(body[1:])
            if ms > _MAX_MS:
                raise SpecError(f"bad SPEC {t!r}: longer ago than the calendar")
            return Position("ago", ms if body[0] == "-" else -ms, t)
        return Position("time", parse_time_ms(body), t)
    raise SpecError(f"bad SPEC {text!r}: use N, +N, -N, start, end, @RFC3339, @UNIX_MS, @-1h, or a range A:B")


def parse_range(text: str) -> Range:
    """`A:B`, `A:`, `:B` or a single position (then open-ended)."""
    # An RFC 3339 time has colons of its own: split on the colon that starts a new position.
    if _looks_like_position(text) and text:
        return Range(parse_position(text), None)
    parts = _split_range(text)
    if parts is None:
        return Range(parse_position(text), None)
    a, b = parts
    start = parse_position(a) if a else START
    stop = parse_position(b) if b else END
    check_order(start, stop)
    return Range(start, stop)


def _split_range(text: str) -> tuple[str, str] | None:
    for i, ch in enumerate(text):
        if ch != ":":
            continue
        left, right = text[:i], text[i + 1 :]
        if _looks_like_position(left) and _looks_like_position(right):
            return left, right
    return None


def _looks_like_position(text: str) -> bool:
    if text == "":
        return True
    try:
        parse_position(text)
    except SpecError:
        return False
    return True


def check_order(start: Position, stop: Position) -> None:
    """Catches ranges that are backwards whatever the topic holds (`5:3`, `@t2:@t1`)."""
    same = start.kind == stop.kind and start.kind in ("offset", "time", "start+")
    if same and stop.value < start.value:
        raise SpecError(f"bad range {start.text}:{stop.text}: the end comes before the start")
    if start.kind == "end-" and stop.kind == "end-" and stop.value > start.value:
        raise SpecError(f"bad range {start.text}:{stop.text}: the end comes before the start")
    if start.kind == "ago" and stop.kind == "ago" and stop.value > start.value:
        raise SpecError(f"bad range {start.text}:{stop.text}: the end comes before the start")


def resolve(pos: Position, bounds: Bounds, now_ms: Callable[[], int] | None = None) -> int:
    """The offset a position means now. Offsets outside the topic are clamped to [first, end]."""
    first, end = bounds.first_offset(), bounds.end_offset()
    if pos.kind == "offset":
        return max(pos.value, first)  # past the end stays as asked: --follow waits for it
    if pos.kind == "start+":
        return min(first + pos.value, end)
    if pos.kind == "end-":
        return bounds.offset_before_end(pos.value)  # a subject-filtered stream: not end - N
    clock = now_ms or (lambda: int(time.time() * 1000))
    ts = pos.value if pos.kind == "time" else clock() - pos.value
    return bounds.offset_for_time(ts)


def time_of(pos: Position, now_ms: Callable[[], int] | None = None) -> int | None:
    """For a time position, the absolute time in ms it resolved to (for exact bounds); else None."""
    if pos.kind == "time":
        return pos.value
    if pos.kind == "ago":
        clock = now_ms or (lambda: int(time.time() * 1000))
        return clock() - pos.value
    return None
