"""pol: a segment's `.log` deleted by hand from the middle (or by a retention pass killed between
its two unlinks) left its `.idx` behind for good: the writer's books and retention know segments by
their `.log`, so nothing ever removed it. The writer now removes an index whose segment file is gone
when it opens and when it lists the directory again (a change it did not make); an index whose
`.log` is there is never removed. Readers ignore such an index (segments are listed by `.log`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import topics.embedded.log as logmod
from topics.embedded import format as fmt
from topics.embedded.log import LogWriter, TopicConfig, TopicLog

HOUR = 3_600_000


def _rec(value: bytes, n: int = 3) -> list[fmt.Pending]:
    return [(None, None, (), value) for _ in range(n)]


def _hand_delete(path: Path) -> None:
    """As an operator would; the directory's mtime moved on if the unlink fell in the same tick."""
    before = path.parent.stat().st_mtime_ns
    os.unlink(path)
    if path.parent.stat().st_mtime_ns == before:
        os.utime(path.parent, ns=(before, before + 1_000_000))


def _files(t: Path, ext: str) -> list[int]:
    return sorted(int(n[:20]) for n in os.listdir(t) if n.endswith(ext) and n[:20].isdigit())


def _five_segments(t: Path, config: TopicConfig) -> LogWriter:
    w = LogWriter(t, config)
    for _ in range(5):
        w.append(_rec(b"x" * 20))  # one batch a segment
    assert TopicLog(t).segments() == [0, 3, 6, 9, 12]
    assert _files(t, ".idx") == [0, 3, 6, 9, 12]
    return w


def test_a_reopened_writer_removes_the_index_of_a_segment_deleted_by_hand(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _five_segments(t, TopicConfig(segment_bytes=100)).close()
    _hand_delete(t / fmt.segment_name(6))
    # readers list segments by their .log: the orphan index is ignored, the hole still told
    log = TopicLog(t)
    assert log.segments() == [0, 3, 9, 12]
    assert [(a, b) for a, b, _ in log.lost()] == [(6, 8)]
    LogWriter(t).close()
    assert _files(t, ".idx") == [0, 3, 9, 12]  # was: [0, 3, 6, 9, 12] for good
    assert _files(t, ".log") == [0, 3, 9, 12]  # every index whose log is there is kept
    assert [(a, b) for a, b, _ in TopicLog(t).lost()] == [(6, 8)]  # the hole is still damage


def test_a_retention_pass_killed_between_its_unlinks_leaves_no_index_for_good(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _five_segments(t, TopicConfig(segment_bytes=100)).close()
    os.unlink(t / fmt.segment_name(0))  # retention's first unlink, then a kill -9
    LogWriter(t).close()
    assert _files(t, ".idx") == [3, 6, 9, 12]
    assert TopicLog(t).first_offset() == 3


def test_a_running_writer_under_retention_removes_the_orphan_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1_700_000_000_000]
    monkeypatch.setattr(logmod, "now_ms", lambda: now[0])
    t = tmp_path / "t"
    w = _five_segments(t, TopicConfig(segment_bytes=100, retention_ms=HOUR))
    _hand_delete(t / fmt.segment_name(6))
    w.append(_rec(b"y" * 20))  # a roll: the writer sees a change it did not make
    assert _files(t, ".idx") == _files(t, ".log")
    assert 6 not in _files(t, ".idx")
    now[0] += 2 * HOUR
    for _ in range(3):
        w.append(_rec(b"z" * 20))
    w.close()
    assert _files(t, ".idx") == _files(t, ".log") == TopicLog(t).segments()


def test_only_indexes_without_a_log_go(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _five_segments(t, TopicConfig(segment_bytes=100)).close()
    (t / fmt.index_name(99)).write_bytes(b"")  # an index with no segment anywhere near
    (t / "notes.idx").write_bytes(b"keep")  # not an index of rq's naming
    _hand_delete(t / fmt.segment_name(3))
    w = LogWriter(t)
    assert _files(t, ".idx") == [0, 6, 9, 12]
    assert (t / "notes.idx").read_bytes() == b"keep"
    w.append(_rec(b"after"))  # rolls to segment 15: every index of a segment there is kept
    w.close()
    assert _files(t, ".idx") == _files(t, ".log") == [0, 6, 9, 12, 15]
    assert [r[-1] for b in TopicLog(t).reader(12) for r in b] == [b"x" * 20] * 3 + [b"after"] * 3
