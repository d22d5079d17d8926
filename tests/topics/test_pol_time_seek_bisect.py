"""pol: a time seek (`--from @t`, `offset_for_time`) read the first header of every segment up to
the one holding t: linear in the segment count. Timestamps never decrease across the log (the
writer clamps them), so segments are now bisected on their first timestamps. Correctness at the
segment boundaries (plateaus of equal timestamps across them, a segment whose first header is
damaged) against a brute force over the records, and the number of segment heads read."""

from __future__ import annotations

from pathlib import Path

import pytest

import topics.embedded.log as logmod
from topics.embedded import format as fmt
from topics.embedded.log import LogWriter, TopicConfig, TopicLog


def _log(t: Path, segments: int, per: int = 3) -> list[int]:
    """`segments` segments of `per` records each, one batch a segment; record n stamped
    (n // 5) * 10: plateaus of 5 equal timestamps that run across segment boundaries."""
    stamps = []
    with LogWriter(t, TopicConfig(segment_bytes=64)) as w:
        for s in range(segments):
            batch = [((n // 5) * 10, None, (), b"v") for n in range(s * per, (s + 1) * per)]
            w.append(batch)
            stamps += [b[0] for b in batch]
    assert TopicLog(t).segments() == [s * per for s in range(segments)]
    return stamps


def _first_at_or_after(stamps: list[int], ts: int) -> int:
    return next((o for o, s in enumerate(stamps) if s >= ts), len(stamps))


@pytest.mark.parametrize("segments", [1, 2, 3, 17])
def test_time_seek_at_every_boundary(tmp_path: Path, segments: int) -> None:
    t = tmp_path / "t"
    stamps = _log(t, segments)
    log = TopicLog(t)
    for ts in range(-5, stamps[-1] + 15):
        assert log.offset_for_time(ts) == _first_at_or_after(stamps, ts), ts


def test_time_seek_past_a_segment_whose_first_header_is_damaged(tmp_path: Path) -> None:
    t = tmp_path / "t"
    stamps = _log(t, 12)
    with open(t / fmt.segment_name(18), "r+b") as fh:  # segment 6 of 12: its first timestamp unknown
        fh.write(b"\xff" * 8)
    log = TopicLog(t)
    for ts in range(-5, stamps[-1] + 15):
        want = _first_at_or_after(stamps, ts)
        if 15 <= want <= 21:
            continue  # around the damage: CorruptRecord where it may hide the answer (as before)
        assert log.offset_for_time(ts) == want, ts


def test_time_seek_reads_few_segment_heads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = tmp_path / "t"
    stamps = _log(t, 300, per=1)
    heads: list[int] = []
    real = logmod._first_ts

    def counted(directory: Path, base: int) -> int:
        heads.append(base)
        return real(directory, base)

    monkeypatch.setattr(logmod, "_first_ts", counted)
    log = TopicLog(t)
    for ts in (stamps[250], stamps[299] + 1, 0, stamps[150] + 1):
        heads.clear()
        assert log.offset_for_time(ts) == _first_at_or_after(stamps, ts)
        assert len(heads) <= 12, (ts, len(heads))  # log2(300) ~ 8; before: up to 300
