"""pol: damage that does not frame at the end of the newest segment, met by a `--skip-corrupt`
follow, was told as `first..(unknown end)` and then told again from the same offset once a live
writer appended after it (a roll to a new segment, or a batch after it in the same segment):
skipped (3, -1) and then (3, 5) in one read. Each offset is read or told once (docs/topics.md)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from rqtest import wait_until

from topics.embedded import format as fmt
from topics.embedded.log import CorruptRange, LogWriter, TopicConfig, TopicLog


def _rec(prefix: bytes, n: int, size: int = 2) -> list[fmt.Pending]:
    return [(None, None, (), prefix + b"%d" % i + b"." * size) for i in range(n)]


def _damaged_tail(t: Path, segment_bytes: int) -> LogWriter:
    """Offsets 0..2 good, then 3..5 whose batch's first 60 bytes are overwritten (unframed)."""
    w = LogWriter(t, TopicConfig(segment_bytes=segment_bytes))
    w.append(_rec(b"a", 3))
    at = os.path.getsize(t / fmt.segment_name(0))
    w.append(_rec(b"b", 3))
    with open(t / fmt.segment_name(0), "r+b") as fh:
        fh.seek(at)
        fh.write(b"\xff" * 60)
    return w


def _read(t: Path) -> tuple[list[int], list[tuple[int, int]]]:
    told: list[tuple[int, int]] = []
    got = [
        r[0]
        for b in TopicLog(t).reader(0, None, False, True, lambda c: told.append((c.first, c.last)))
        for r in b
    ]
    return got, told


def _follow_across(
    t: Path, w: LogWriter, more: list[list[fmt.Pending]]
) -> tuple[list[int], list[tuple[int, int]]]:
    told: list[tuple[int, int]] = []
    got: list[int] = []

    def on_corrupt(c: CorruptRange) -> None:
        told.append((c.first, c.last))

    reader = TopicLog(t).reader(0, None, True, True, on_corrupt, poll_s=0.01)

    def go() -> None:
        for batch in reader:
            got.extend(r[0] for r in batch)

    th = threading.Thread(target=go, daemon=True)
    th.start()
    try:
        assert wait_until(lambda: told, timeout=20), "the damage at the end was never told"
        assert told == [(3, -1)] and got == [0, 1, 2]
        for batch in more:
            w.append(batch)
        end = TopicLog(t).end_offset()
        assert wait_until(lambda: got and got[-1] == end - 1, timeout=20), got
    finally:
        reader.close()
        th.join(20)
        w.close()
    return got, told


def test_a_follow_tells_tail_damage_once_when_a_new_segment_appears(tmp_path: Path) -> None:
    t = tmp_path / "t"
    w = _damaged_tail(t, segment_bytes=400)
    assert _read(t) == ([0, 1, 2], [(3, -1)])  # the end of the newest segment: up to an unknown end
    got, told = _follow_across(t, w, [_rec(b"c", 1, 100) for _ in range(4)])
    assert TopicLog(t).segments()[1] == 6  # the writer rolled past the damage
    assert told == [(3, -1)]  # was [(3, -1), (3, 5)]
    assert got == [0, 1, 2, *range(6, got[-1] + 1)]
    assert _read(t) == (got, [(3, 5)])  # a later read, the segment sealed: once, with its end


def test_a_follow_tells_tail_damage_once_when_a_batch_lands_after_it(tmp_path: Path) -> None:
    t = tmp_path / "t"
    w = _damaged_tail(t, segment_bytes=1 << 20)
    got, told = _follow_across(t, w, [_rec(b"d", 2)])
    assert TopicLog(t).segments() == [0]
    assert told == [(3, -1)]  # was [(3, -1), (3, 5)]
    assert got == [0, 1, 2, 6, 7]
    assert _read(t) == ([0, 1, 2, 6, 7], [(3, 5)])
