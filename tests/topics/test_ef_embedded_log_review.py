"""The embedded log under review (ef): retention under a live reader, gaps told once, costs per
segment that do not grow with the number of segments, and small API edges.

Before: a segment retention deleted while the directory was being listed made a healthy topic read
as corrupt ("... ends (byte 0) ..."); a segment deleted between the listing and its open was told
as a gap from the same first offset again; every segment read listed the whole directory twice,
every roll listed and stat'ed it, every group's committed offset walked the newest segment again;
append([]) was a bare ValueError, a generator a zip error; a stray 99999999999999999999.log
stopped the writer ("argument out of range"); the record limit counted the 36-byte header.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import topics.embedded.log as logmod
from topics.embedded import format as fmt
from topics.embedded.groups import GroupStore
from topics.embedded.log import LogWriter, TopicConfig, TopicLog
from topics.errors import RecordTooLarge


def _batches(path: Path, segments: int, per: int = 10, config: TopicConfig | None = None) -> None:
    """One batch of `per` records per segment: bases 0, per, 2 * per, ..."""
    with LogWriter(path, config or TopicConfig(segment_bytes=100)) as w:
        for b in range(segments):
            w.append([(None, None, (), b"r%d-%d" % (b, j)) for j in range(per)])


def _count_listings(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A list that gets the directory of each listing of segments made from here on."""
    calls: list[Path] = []
    real = logmod._list_segments

    def counted(d: Path) -> list[int]:
        calls.append(d)
        return real(d)

    monkeypatch.setattr(logmod, "_list_segments", counted)
    return calls


def _seg(path: Path, base: int) -> Path:
    return path / fmt.segment_name(base)


def test_segments_retention_deletes_while_the_directory_is_listed_are_a_gap_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tmp_path / "t"
    _batches(t, 4)  # 0, 10, 20, 30
    log = TopicLog(t)
    gaps: list[tuple[int, int]] = []
    it = iter(log.reader(0, on_gap=lambda a, z: gaps.append((a, z))))
    assert [r[0] for r in next(it)] == list(range(10))
    # Retention deletes 0, 10 and 20 in order while a listing reads the directory: the listing
    # saw 0 (read before its deletion) and missed 10 and 20 (deleted before it read them).
    for base in (0, 10, 20):
        _seg(t, base).unlink()
    real = logmod._list_segments
    monkeypatch.setattr(logmod, "_list_segments", lambda d: sorted({0, *real(d)}))
    rest = [r[0] for batch in it for r in batch]  # before: CorruptRecord "... ends (byte 0) ..."
    assert rest == list(range(30, 40))
    assert gaps == [(10, 29)]


def test_a_segment_cut_at_a_batch_boundary_is_still_damage(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _batches(t, 3)
    _seg(t, 10).unlink()  # by hand: 0 is still there, so this is no retention
    with pytest.raises(logmod.CorruptRecord, match=r"offsets 10..19 are missing"):
        list(TopicLog(t).reader(0))


def test_a_segment_deleted_between_listing_and_open_is_told_once(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _batches(t, 6)  # 0 .. 50
    log = TopicLog(t)
    gaps: list[tuple[int, int]] = []
    r = log.reader(0, on_gap=lambda a, z: gaps.append((a, z)))
    it = iter(r)
    assert next(it)[0][0] == 0
    _seg(t, 0).unlink()
    _seg(t, 10).unlink()
    real_open = r._open_segment

    def open_segment(base: int) -> logmod._View | None:
        if base == 20:  # retention, again, between the reader's listing and its open
            _seg(t, 20).unlink(missing_ok=True)
        return real_open(base)

    r._open_segment = open_segment  # type: ignore[method-assign]
    rest = [rec[0] for batch in it for rec in batch]
    assert rest == list(range(30, 60))
    assert gaps == [(10, 19), (20, 29)]  # before: [(10, 19), (10, 29)]: 10..19 told twice


def test_a_reader_behind_a_writer_with_retention_reads_or_is_told_each_offset_once(tmp_path: Path) -> None:
    t = tmp_path / "t"
    n, per = 2000, 10
    writer = LogWriter(t, TopicConfig(segment_bytes=150, retention_bytes=600))
    writer.append([(None, None, (), b"v%d" % j) for j in range(per)])
    done = threading.Event()

    def write() -> None:
        try:
            for b in range(1, n // per):
                writer.append([(None, None, (), b"v%d" % (b * per + j)) for j in range(per)])
        finally:
            writer.close()
            done.set()

    thread = threading.Thread(target=write)
    seen: list[int] = []
    reader = TopicLog(t).reader(
        0, n, follow=True, poll_s=0.001, on_gap=lambda a, z: seen.extend(range(a, z + 1))
    )
    thread.start()
    try:
        for batch in reader:  # before: at times CorruptRecord on a healthy topic
            seen.extend(r[0] for r in batch)
    finally:
        reader.close()
        thread.join(30)
    assert done.is_set()
    assert seen == list(range(n))  # each offset read or told as a gap, once, in order


def test_a_read_across_segments_lists_the_directory_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tmp_path / "t"
    _batches(t, 60)
    calls = _count_listings(monkeypatch)
    offsets = [r[0] for b in TopicLog(t).reader(0) for r in b]
    assert offsets == list(range(600))
    assert len(calls) <= 3  # before: 2 a segment (121)


def test_a_roll_with_retention_does_not_list_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tmp_path / "t"
    config = TopicConfig(segment_bytes=100, retention_bytes=10_000)
    _batches(t, 50, config=config)
    calls = _count_listings(monkeypatch)
    with LogWriter(t, config) as w:
        opened = len(calls)
        for b in range(100):
            w.append([(None, None, (), b"s%d-%d" % (b, j)) for j in range(10)])
    assert len(calls) == opened  # before: one listing (and a stat of every segment) a roll
    sizes = [p.stat().st_size for p in t.glob("*.log")]
    # retention still holds (it weighs the segments at each roll: the active one may grow past it)
    assert sum(sizes) + max(sizes) > 10_000 and sum(sizes) - max(sizes) <= 10_000
    first = TopicLog(t).first_offset()
    assert [r[0] for b in TopicLog(t).reader(0) for r in b] == list(range(first, 1500))


def test_committed_offsets_of_many_groups_look_at_the_end_once(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _batches(t, 2)
    store = TopicLog(t).groups
    for g in range(40):
        store.commit(f"g{g}", g % 20)
    calls: list[int] = []
    log = TopicLog(t)
    store = GroupStore(t, lambda: calls.append(1) or log.end_offset())
    assert [store.committed(f"g{g}") for g in range(40)] == [g % 20 for g in range(40)]
    assert len(calls) == 1  # before: 38 (one per group past offset 0)
    with pytest.raises(Exception, match="past the end"):
        store.commit("g0", 21)  # an offset past the end seen is looked at again, and refused


def test_an_empty_or_generated_batch(tmp_path: Path) -> None:
    t = tmp_path / "t"
    with LogWriter(t) as w:
        assert w.append([]) == (0, -1)  # before: ValueError "append needs at least one record"
        assert w.append((None, None, (), b"g%d" % i) for i in range(3)) == (0, 2)  # before: a zip error
        assert w.append(iter([])) == (3, 2)
    assert [r[-1] for b in TopicLog(t).reader(0) for r in b] == [b"g0", b"g1", b"g2"]


def test_a_stray_segment_name_past_the_offsets_is_not_a_segment(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _batches(t, 2)
    (t / "99999999999999999999.log").write_bytes(b"")
    assert TopicLog(t).segments() == [0, 10]
    with LogWriter(t) as w:  # before: struct.error "argument out of range"
        assert w.append([(None, None, (), b"more")]) == (20, 20)
    assert [r[0] for b in TopicLog(t).reader(0) for r in b] == list(range(21))


def test_the_record_limit_is_said_as_rq_produce_says_it(tmp_path: Path) -> None:
    most = fmt.MAX_BATCH_PAYLOAD - fmt.RECORD_SIZE  # what `rq produce` allows a line
    with LogWriter(tmp_path / "t") as w, pytest.raises(RecordTooLarge) as err:
        w.append([(None, None, (), bytes(most + 1))])
    assert os.path.getsize(tmp_path / "t" / fmt.segment_name(0)) == 0
    assert f"at most {most} bytes" in str(err.value)  # before: "at most 268435456 bytes per record"


def test_offsets_lost_is_not_fooled_by_a_listing_retention_raced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tmp_path / "t"
    _batches(t, 4)
    for base in (0, 10, 20):
        _seg(t, base).unlink()
    real = logmod._list_segments
    monkeypatch.setattr(logmod, "_list_segments", lambda d: sorted({0, *real(d)}))
    assert TopicLog(t).lost() == []  # 0, listed, is gone when looked at: retention's, not a loss


def test_a_follower_waiting_at_the_end_does_not_list_the_directory_each_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tmp_path / "t"
    _batches(t, 3)
    calls = _count_listings(monkeypatch)
    reader = TopicLog(t).reader(30, follow=True, poll_s=0.0001)
    for polls, batch in enumerate(reader, 1):
        assert batch == []
        if polls == 200:
            break
    assert len(calls) <= 200 // logmod._TAIL_RELIST + 3  # before: one a poll (201)


def test_a_follower_still_finds_a_newer_segment_under_another_name(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _batches(t, 3)  # 0, 10, 20
    aside = tmp_path / "aside"
    aside.mkdir()
    for base in (10, 20):
        _seg(t, base).rename(aside / fmt.segment_name(base))
    reader = TopicLog(t).reader(5, follow=True, poll_s=0.0001)
    offsets: list[int] = []
    polls = 0
    with pytest.raises(logmod.CorruptRecord, match=r"offsets 10..19 are missing"):
        for batch in reader:
            offsets += [r[0] for r in batch]
            polls += 1
            if polls == 3:  # waiting at the end of 0: 20 comes back, 10 does not (damage)
                (aside / fmt.segment_name(20)).rename(_seg(t, 20))
            assert polls < 1000
    assert offsets == list(range(5, 10))
