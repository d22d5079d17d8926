"""`--to @t --follow` while records land as the window is resolved (review fx4).

resolve_window compared the end offset the time search returned ("no record stamped at or after t":
the end at that moment) with a second end_offset() read after it; a record landing in between made
"none yet" look like "found at the old end", and the follow became a read bounded there: it ended at
once, exit 0, and --save-spec pinned the truncated window. The interleaving is injected here: the
source appends a record right after each time search and each end offset it tells.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from topics.embedded.log import LogWriter, now_ms
from topics.pipeline import Request, run
from topics.plan import resolve_window
from topics.sources.embedded import EmbeddedSource
from topics.spec import parse_position

HOUR = 3_600_000


class _RecordsLandWhileItResolves:
    """An embedded source whose writer appends the next of `landing` just after each time search
    and each end offset it tells (while any are left)."""

    def __init__(self, source: EmbeddedSource, writer: LogWriter, landing: list[Any]):
        self._source, self._writer, self._landing = source, writer, landing

    def _land(self, value: int) -> int:
        if self._landing:
            self._writer.append([self._landing.pop(0)])
        return value

    def offset_for_time(self, ts_ms: int) -> int:
        return self._land(self._source.offset_for_time(ts_ms))

    def end_offset(self) -> int:
        return self._land(self._source.end_offset())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)


def _follow(topic: Path, stop: str, landing: list[Any], then: list[Any]) -> tuple[Any, list[bytes]]:
    with LogWriter(topic) as w:
        source = _RecordsLandWhileItResolves(EmbeddedSource(topic, idle_timeout=20), w, landing)
        win = resolve_window(source, parse_position("0"), parse_position(stop), True)  # type: ignore[arg-type]
        if landing + then:
            w.append(landing + then)  # what comes after the window was resolved, the end of it included
    seen: list[bytes] = []
    req = Request(win.start, win.stop, True, win.time_from, win.time_to)
    run(EmbeddedSource(topic, idle_timeout=20), req, lambda recs, _d: seen.extend(bytes(r[4]) for r in recs))
    return win, seen


def _stamped_before(topic: Path, t: int) -> list[bytes]:
    log = EmbeddedSource(topic).log
    return [bytes(r[4]) for b in log.reader(0, log.end_offset()) for r in b if r[1] < t]


def test_a_future_t_is_followed_though_a_record_lands_while_it_resolves(tmp_path: Path) -> None:
    topic = tmp_path / "t"
    t0 = now_ms()
    with LogWriter(topic) as w:
        w.append([(t0 - 1000, None, (), b"old")])
    t = t0 + HOUR
    win, seen = _follow(
        topic,
        f"@{t}",
        landing=[(t0 + i, None, (), b"landed %d" % i) for i in range(4)],
        then=[(t0 + 9, None, (), b"before t"), (t + 1, None, (), b"at t: ends it"), (t + 2, None, (), b"x")],
    )
    assert (win.stop, win.time_to) == (None, t)
    assert seen == _stamped_before(topic, t)
    assert seen[0] == b"old" and seen[-1] == b"before t"


def test_a_past_t_with_no_record_after_it_yet_is_followed_too(tmp_path: Path) -> None:
    """t already passed but nothing stamped at or after it when the search ran (a server's clock
    behind ours, or records stamped by hand): the follow ends on the first record that is."""
    topic = tmp_path / "t"
    t0 = now_ms()
    t = t0 - 60_000
    with LogWriter(topic) as w:
        w.append([(t - 2000, None, (), b"old")])
    win, seen = _follow(
        topic,
        f"@{t}",
        landing=[(t - 1000 + i, None, (), b"landed %d" % i) for i in range(4)],
        then=[(t + 1, None, (), b"at t: ends it")],
    )
    assert win.stop is None
    assert seen == _stamped_before(topic, t)
    assert seen[0] == b"old" and seen[-1] == b"landed 3"


def test_a_record_found_at_or_after_t_still_bounds_the_follow(tmp_path: Path) -> None:
    """(Unchanged by the fix, passes on the old code too: the bounded case stays bounded.)"""
    topic = tmp_path / "t"
    t0 = now_ms()
    t = t0 - 60_000
    with LogWriter(topic) as w:
        w.append([(t - 1000, None, (), b"old"), (t, None, (), b"at t")])
    win, seen = _follow(topic, f"@{t}", landing=[(t0 + i, None, (), b"late") for i in range(4)], then=[])
    assert win.stop == 1
    assert seen == [b"old"]
