"""From the user's SPECs to exact offsets on one source."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from topics.errors import SpecError
from topics.sources.base import Source
from topics.spec import START, Position, Range, check_order, parse_position, parse_range, resolve, time_of


@dataclass(frozen=True)
class Window:
    start: int
    stop: int | None  # exclusive; None: follow without end
    time_from: int | None
    time_to: int | None


def parse_window(from_text: str | None, to_text: str | None) -> tuple[Position | None, Position | None]:
    """`--from A:B` or `--from A --to B` (not both forms at once)."""
    start: Position | None = None
    stop: Position | None = None
    if from_text is not None:
        rng: Range = parse_range(from_text)
        start = rng.start
        if rng.stop is not None:
            if to_text is not None:
                raise SpecError(f"--from {from_text!r} is already a range: drop --to, or use --from A --to B")
            stop = rng.stop
    if to_text is not None:
        stop = parse_position(to_text)
        if start is not None:
            check_order(start, stop)
    return start, stop


def resolve_window(
    source: Source,
    start: Position | None,
    stop: Position | None,
    follow: bool,
    committed: int | None = None,
    now_ms: Callable[[], int] | None = None,
) -> Window:
    """Exact offsets for a read: from the SPEC, else the group's committed offset, else the start.

    Without follow, the read never goes past the end the topic has now (it exits there). Relative
    times (`@-1h`) are read against one "now": read once per bound, `--from @-1h` began a few ms
    after the `time_from` the window recorded, and a replay by the saved spec, which filters by
    that bound, counted fewer records than were written out.
    """
    now = (now_ms or _wall_ms)()

    def frozen() -> int:
        return now

    now_ms = frozen
    if start is None and committed is not None:
        # Not clamped to the first offset still there: what retention deleted before the group
        # read it is a gap the reader reports (on_gap), never skipped without a word.
        begin = committed
    elif start is None:
        begin = max(resolve(START, source, now_ms), source.first_offset())
    else:
        begin = resolve(start, source, now_ms)
        if start.kind == "offset" and start.value < begin:
            # An offset asked for by number that retention deleted: not clamped either. The read
            # starts there and the reader tells start..first-1 (within --to) as a gap, as for a
            # group; clamped, `--from 100 --to 200` on a topic now starting at 3000 printed nothing
            # and exited 0 without a word. `start`, `+N`, `-N` and a time ask for no offset known
            # lost: they start at the first record still there.
            begin = start.value
    end: int | None
    time_to = time_of(stop, now_ms) if stop is not None else None
    if stop is not None and follow and time_to is not None:
        end = _follow_until(source, time_to, now_ms)
        end = max(end, begin) if end is not None else None
    elif stop is not None:
        # an offset --to as asked (resolve() clamps it to the first offset still there): below the
        # first, a range that aged out ends there, not at the first record (max(end, begin) below
        # keeps it the same wherever begin was clamped)
        end = stop.value if stop.kind == "offset" else resolve(stop, source, now_ms)
        if not follow:
            end = min(end, source.end_offset())
        end = max(end, begin)
    else:
        end = None if follow else max(source.end_offset(), begin)
    return Window(begin, end, time_of(start, now_ms) if start is not None else None, time_to)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _follow_until(source: Source, t: int, now_ms: Callable[[], int] | None) -> int | None:
    """The end of a follow `--to @t`: the offset of the first record stamped at or after t, or None
    while there is none (the pipeline then ends the read on the first one that comes, or once the
    clock passes t and what came before is read: it checks both).

    A t still in the future is None by the time itself. Otherwise the record found must be one that
    was there before the search began: records keep landing while the window is resolved, and an
    end offset read after the search (one record later) made "none found" look like "found at the
    old end", a read bounded there that stopped at once."""
    clock = now_ms or (lambda: time.time_ns() // 1_000_000)
    if t > clock():
        return None
    there = source.end_offset()  # read before the search: what it finds below this is a record
    found = source.offset_for_time(t)
    return found if found < there else None
