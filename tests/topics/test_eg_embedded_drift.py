"""The embedded log when a segment goes some other way than through the writer or retention.

Before: the writer kept its sealed segments in memory (90a32c2) and trusted them: with one deleted
by hand, age retention stopped for the writer's life (the missing segment's first timestamp read as
unknown, every pass stopped there) and byte retention deleted segments it should have kept (the
missing segment's bytes still counted). With --skip-corrupt, a segment deleted after damage already
reported in the segment before was skipped with no report and no gap (exit 0).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import topics.embedded.log as logmod
from topics.embedded import format as fmt
from topics.embedded.log import CorruptRange, LogWriter, TopicConfig, TopicLog

HOUR = 3_600_000


def _rec(value: bytes, n: int = 3, ts: int | None = None) -> list[fmt.Pending]:
    return [(ts, None, (), value) for _ in range(n)]


def _hand_delete(path: Path) -> None:
    """Deletes a segment as an operator would. On a kernel with coarse timestamps an unlink in the
    same tick as the writer's last change leaves the directory's mtime as it was: moved on then,
    as a later tick would."""
    before = path.parent.stat().st_mtime_ns
    os.unlink(path)
    if path.parent.stat().st_mtime_ns == before:
        os.utime(path.parent, ns=(before, before + 1_000_000))


def _clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    now = [1_700_000_000_000]
    monkeypatch.setattr(logmod, "now_ms", lambda: now[0])
    return now


def _age_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    now = _clock(monkeypatch)
    t = tmp_path / "t"
    w = LogWriter(t, TopicConfig(segment_bytes=100, retention_ms=HOUR))
    for _ in range(5):
        w.append(_rec(b"x" * 20))  # one batch a segment
    assert TopicLog(t).segments() == [0, 3, 6, 9, 12]
    _hand_delete(t / fmt.segment_name(6))
    now[0] += 2 * HOUR
    for _ in range(5):
        w.append(_rec(b"y" * 20))
    segs = TopicLog(t).segments()
    w.close()
    return segs


def test_age_retention_goes_on_after_a_segment_deleted_by_hand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 12 is the newest old one: its records are no newer than 15's first, which is new
    assert _age_case(tmp_path, monkeypatch) == [12, 15, 18, 21, 24, 27]


def test_age_retention_sees_the_missing_file_when_the_mtime_does_not_tell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a directory mtime that never moves (a coarse clock, a filesystem that does not keep it):
    # the segment in the books with no file is seen when its timestamp is looked for
    monkeypatch.setattr(LogWriter, "_dir_mtime", lambda self: 0, raising=False)
    assert _age_case(tmp_path, monkeypatch) == [12, 15, 18, 21, 24, 27]


def _bytes_case(tmp_path: Path, gone: list[int], appends: int) -> tuple[LogWriter, Path, int]:
    t = tmp_path / "t"
    with LogWriter(t, TopicConfig(segment_bytes=100)) as w:
        for _ in range(6):
            w.append(_rec(b"x" * 20))
    seg = (t / fmt.segment_name(0)).stat().st_size
    # at most 4 segments' bytes (the active one's counted): the open deletes 0 and 3
    w = LogWriter(t, TopicConfig(segment_bytes=100, retention_bytes=4 * seg + 10))
    assert TopicLog(t).segments() == [6, 9, 12, 15]
    for base in gone:
        _hand_delete(t / fmt.segment_name(base))
    for _ in range(appends):
        w.append(_rec(b"y" * 20))
    return w, t, seg


def test_byte_retention_does_not_count_a_segment_deleted_by_hand(tmp_path: Path) -> None:
    w, t, seg = _bytes_case(tmp_path, [9], 2)
    try:
        # 6, 12, 15, 18 sealed and 21 active: 5 segments' bytes, 4 sealed ones under the limit
        assert TopicLog(t).segments() == [6, 12, 15, 18, 21]
        sealed = sum((t / fmt.segment_name(b)).stat().st_size for b in (6, 12, 15, 18))
        assert sealed + w.size > 4 * seg + 10 >= sealed  # (the active segment's batch tips it)
    finally:
        w.close()


def test_byte_retention_lists_again_when_the_oldest_is_gone_already(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # mtime telling nothing: the oldest segment, gone when retention unlinks it, is the sign; the
    # listing then finds 12 gone too
    monkeypatch.setattr(LogWriter, "_dir_mtime", lambda self: 0, raising=False)
    w, t, _ = _bytes_case(tmp_path, [6, 12], 3)
    try:
        assert TopicLog(t).segments() == [9, 15, 18, 21, 24]
    finally:
        w.close()


def _three_segments(t: Path) -> None:
    with LogWriter(t, TopicConfig(segment_bytes=1000)) as w:
        for b in range(12):
            w.append([(None, None, (), b"v%02d-%d" % (b, j)) for j in range(3)])
    assert TopicLog(t).segments() == [0, 15, 30]


def _read(t: Path, stop: int | None = None) -> tuple[list[int], list[CorruptRange], list[tuple[int, int]]]:
    corrupt: list[CorruptRange] = []
    gaps: list[tuple[int, int]] = []
    got: list[int] = []
    reader = TopicLog(t).reader(
        0, stop=stop, skip_corrupt=True, on_corrupt=corrupt.append, on_gap=lambda a, z: gaps.append((a, z))
    )
    for batch in reader:
        got += [r[0] for r in batch]
    return got, corrupt, gaps


def test_a_segment_deleted_after_damage_reported_before_it_is_reported(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _three_segments(t)
    p = t / fmt.segment_name(0)
    data = bytearray(p.read_bytes())
    second = data.find(fmt.MAGIC, 1)  # batch 2 (offsets 3..5): its header no longer frames
    data[second : second + 4] = b"XXXX"
    data[second + 60] ^= 0xFF
    p.write_bytes(bytes(data))
    os.unlink(t / fmt.segment_name(15))
    got, corrupt, gaps = _read(t)
    assert got == [*range(3), *range(6, 15), *range(30, 36)]
    assert [(c.first, c.last) for c in corrupt] == [(3, 5), (15, 29)]
    assert gaps == []


def test_a_stop_inside_the_hole_after_a_cut_short_segment_reports_it_once(tmp_path: Path) -> None:
    # segment 0 cut inside its third batch: 6..14 lost; the read stops at 10, inside the hole
    t = tmp_path / "t"
    _three_segments(t)
    p = t / fmt.segment_name(0)
    data = p.read_bytes()
    third = data.find(fmt.MAGIC, data.find(fmt.MAGIC, 1) + 1)
    p.write_bytes(data[: third + 10])
    got, corrupt, gaps = _read(t, stop=10)
    assert got == list(range(6))
    assert [(c.first, c.last) for c in corrupt] == [(6, 9)]  # never an empty 10..9 after it
    assert gaps == []
