"""The embedded log on real files: appends, seeks, segments, retention, recovery, corruption."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from topics.embedded import format as fmt
from topics.embedded.log import LogWriter, TopicConfig, TopicLog
from topics.errors import CorruptRecord, RecordTooLarge, TopicNotFound, WriterBusy


def value(i: int) -> bytes:
    return b'{"i":%d,"pad":"%s"}' % (i, b"x" * (i % 50))


def fill(
    path: Path, n: int, batch: int = 100, config: TopicConfig | None = None, ts: int | None = None
) -> None:
    with LogWriter(path, config) as w:
        for start in range(0, n, batch):
            w.append(
                [
                    (ts, b"k%d" % i, (("h", b"v"),) if i % 7 == 0 else (), value(i))
                    for i in range(start, min(n, start + batch))
                ]
            )


def read_all(log: TopicLog, start: int = 0, stop: int | None = None, **kw: object) -> list[tuple]:
    return [r for batch in log.reader(start, stop, **kw) for r in batch]  # type: ignore[arg-type]


def test_append_read_roundtrip(tmp_path: Path) -> None:
    t = tmp_path / "t"
    fill(t, 1000)
    log = TopicLog(t)
    recs = read_all(log)
    assert [r[0] for r in recs] == list(range(1000))
    assert recs[7][2] == b"k7" and recs[7][3] == (("h", b"v"),) and recs[7][4] == value(7)
    assert recs[8][3] == ()
    assert (log.first_offset(), log.end_offset()) == (0, 1000)
    assert [r[0] for r in read_all(log, 250, 260)] == list(range(250, 260))


def test_seeks_across_segments_by_offset_and_time(tmp_path: Path) -> None:
    t = tmp_path / "t"
    with LogWriter(t, TopicConfig(segment_bytes=20_000)) as w:
        for b in range(50):
            w.append([(10_000 + b * 100, None, (), value(b * 40 + i)) for i in range(40)])
    log = TopicLog(t)
    assert len(log.segments()) > 5
    for off in (0, 39, 40, 999, 1234, 1999):
        assert read_all(log, off, off + 1)[0][0] == off
    assert log.offset_for_time(10_000) == 0
    assert log.offset_for_time(10_001) == 40
    assert log.offset_for_time(10_000 + 25 * 100) == 25 * 40
    assert log.offset_for_time(99_999_999) == 2000
    recs = read_all(log, log.offset_for_time(12_000), log.offset_for_time(13_000))
    assert {r[1] for r in recs} == {12_000 + 100 * k for k in range(10)}


def test_timestamps_never_go_backwards(tmp_path: Path) -> None:
    t = tmp_path / "t"
    with LogWriter(t) as w:
        w.append([(5000, None, (), b"a"), (4000, None, (), b"b")])
        w.append([(3000, None, (), b"c")])
    assert [r[1] for r in read_all(TopicLog(t))] == [5000, 5000, 5000]


def test_retention_by_size_and_age(tmp_path: Path) -> None:
    t = tmp_path / "t"
    fill(t, 3000, batch=50, config=TopicConfig(segment_bytes=10_000, retention_bytes=40_000))
    log = TopicLog(t)
    total = sum((t / fmt.segment_name(b)).stat().st_size for b in log.segments())
    assert total <= 40_000 + 10_000
    assert log.first_offset() > 0 and log.end_offset() == 3000
    recs = read_all(log, 0)  # asking for deleted offsets starts at the first one still there
    assert recs[0][0] == log.first_offset() and recs[-1][0] == 2999

    old = tmp_path / "old"
    fill(old, 400, batch=50, config=TopicConfig(segment_bytes=5_000), ts=1_000)  # stamped in 1970
    with LogWriter(old, TopicConfig(segment_bytes=5_000, retention_ms=3_600_000)) as w:
        w.append([(None, None, (), b"new")])
    log = TopicLog(old)
    assert len(log.segments()) == 1  # everything but the active segment was older than an hour
    assert read_all(log)[-1][4] == b"new"


def test_torn_tail_is_truncated_on_open_and_never_served(tmp_path: Path) -> None:
    t = tmp_path / "t"
    fill(t, 300)
    seg = t / fmt.segment_name(0)
    good_size = seg.stat().st_size
    torn = fmt.encode_batch(300, [(None, None, (), b"torn" * 100)], [1])
    with open(seg, "ab") as fh:
        fh.write(torn[: len(torn) // 2])  # a batch cut in half, as kill -9 mid-write leaves it
    log = TopicLog(t)
    assert log.end_offset() == 300
    assert [r[0] for r in read_all(log)][-1] == 299
    with LogWriter(t) as w:  # the writer's open truncates the tail
        assert seg.stat().st_size == good_size
        assert w.append([(None, None, (), b"after")]) == (300, 300)
    assert read_all(TopicLog(t))[-1][4] == b"after"
    with open(seg, "ab") as fh:  # a file extended by a crash before its data reached the disk
        fh.write(fmt.encode_batch(301, [(None, None, (), b"lost")], [1])[:20] + b"\0" * 8192)
    assert TopicLog(t).end_offset() == 301
    with LogWriter(t) as w:
        assert w.append([(None, None, (), b"again")]) == (301, 301)


def test_a_torn_batch_holding_a_batch_like_value_is_still_a_torn_tail(tmp_path: Path) -> None:
    # A record value may hold bytes laid out like a valid batch (an rq segment produced with
    # --format raw). When its own batch is cut short, nothing inside that batch's declared length
    # is a batch: the planted one was taken for the end (offset 1000001), and the writer then
    # refused every produce after it.
    t = tmp_path / "t"
    fill(t, 10, batch=5)
    seg = t / fmt.segment_name(0)
    good_size = seg.stat().st_size
    planted = fmt.encode_batch(1_000_000, [(None, None, (), b"planted")], [1])
    holder = b"P" * 100 + planted + b"Q" * 5000
    torn = fmt.encode_batch(10, [(None, None, (), holder)], [2**40])
    with open(seg, "ab") as fh:
        fh.write(torn[: fmt.BATCH_SIZE + fmt.RECORD_SIZE + 100 + len(planted) + 100])
    log = TopicLog(t)
    assert log.end_offset() == 10
    assert [r[0] for r in read_all(log)] == list(range(10))
    assert [r[0] for r in read_all(log, 0, None, follow=True, idle_timeout=0.1)] == list(range(10))
    with LogWriter(t) as w:
        assert seg.stat().st_size == good_size
        assert w.append([(None, None, (), b"next")]) == (10, 10)
    assert [r[4] for r in read_all(TopicLog(t), 9)] == [value(9), b"next"]


@pytest.mark.parametrize("damage", ["last record", "batch header", "zeroed end"])
def test_a_damaged_full_length_last_batch_is_reported_never_truncated(tmp_path: Path, damage: str) -> None:
    # kill -9 leaves a batch cut short; a full-length batch that fails its CRC is damage to
    # acknowledged records, even the newest one.
    t = tmp_path / "t"
    fill(t, 300)
    seg = t / fmt.segment_name(0)
    data = seg.read_bytes()
    last = data.rindex(fmt.MAGIC)
    if damage == "last record":
        _flip(seg, len(data) - 3)
    elif damage == "batch header":
        _flip(seg, last + 30)  # max_ts
    else:
        with open(seg, "r+b") as fh:
            fh.seek(len(data) - 50)
            fh.write(b"\0" * 50)
    first_bad = 200 if damage == "batch header" else 299
    log = TopicLog(t)
    assert log.end_offset() == 300
    with pytest.raises(CorruptRecord) as err:
        read_all(log)
    assert err.value.offset == first_bad
    assert len(read_all(log, 0, first_bad)) == first_bad
    with LogWriter(t) as w:
        assert seg.stat().st_size == len(data)
        assert w.append([(None, None, (), b"more")]) == (300, 300)
    recs = read_all(TopicLog(t), skip_corrupt=True)
    # --skip-corrupt serves every record whose own CRC passes (a damaged header loses none)
    assert recs[-1][0] == 300 and len(recs) == (301 if damage == "batch header" else 300)


def test_unframeable_damage_at_the_end_stops_the_writer(tmp_path: Path) -> None:
    t = tmp_path / "t"
    fill(t, 300)
    seg = t / fmt.segment_name(0)
    with open(seg, "ab") as fh:
        fh.write(b"\xab" * 100)  # no batch header: not a write cut short
    assert TopicLog(t).end_offset() == 301  # the damage counts as a record: a read reaches it
    with pytest.raises(CorruptRecord) as err:
        LogWriter(t)
    assert err.value.offset == 300 and (t / fmt.segment_name(0)).read_bytes().endswith(b"\xab" * 100)
    with pytest.raises(CorruptRecord):
        read_all(TopicLog(t), 0, None, follow=True, idle_timeout=0.1)


def _lose_last_header(t: Path) -> None:
    """A topic whose newest batch (offset 100, one big record) lost the page holding its header:
    zeros from that header to the page's end, the rest of the batch there (a lost write on a
    power cut that kept the file's size)."""
    fill(t, 100)
    with LogWriter(t) as w:
        w.append([(None, None, (), b"y" * 20_000)])
    seg = t / fmt.segment_name(0)
    data = bytearray(seg.read_bytes())
    last = data.rindex(fmt.MAGIC)
    page_end = (last // 4096 + 1) * 4096
    data[last:page_end] = bytes(page_end - last)
    seg.write_bytes(bytes(data))


def test_lost_data_at_the_end_is_reported_by_bounded_readers(tmp_path: Path) -> None:
    # The writer refused to append after it, but bounded readers ended quietly one batch short:
    # replay exited 0, offsets said last 99, replay --from 100 printed nothing.
    t = tmp_path / "t"
    _lose_last_header(t)
    log = TopicLog(t)
    with pytest.raises(CorruptRecord) as err:
        log.check_end()
    assert err.value.offset == 100
    assert log.end_offset() == 101
    got: list[int] = []
    with pytest.raises(CorruptRecord) as err:
        for batch in log.reader(0, log.end_offset()):
            got.extend(r[0] for r in batch)
    assert err.value.offset == 100 and got == list(range(100))
    with pytest.raises(CorruptRecord) as err:
        read_all(log, 100, log.end_offset())
    assert err.value.offset == 100
    assert [r[0] for r in read_all(log, 0, 50)] == list(range(50))  # a range before it is fine
    skipped: list[int] = []
    recs = read_all(log, 0, log.end_offset(), skip_corrupt=True, on_corrupt=lambda c: skipped.append(c.first))
    assert [r[0] for r in recs] == list(range(100)) and skipped == [100]
    with pytest.raises(CorruptRecord) as err:
        LogWriter(t)
    assert err.value.offset == 100


@pytest.mark.parametrize("tail", ["zeros", "cut batch", "header and zeros"])
def test_a_torn_tail_stays_silent_for_readers(tmp_path: Path, tail: str) -> None:
    # What a crash can leave after the last good batch: a batch cut short, or zeros (the file
    # extended before its data reached the disk). Never acknowledged: not counted, not reported.
    t = tmp_path / "t"
    fill(t, 100)
    seg = t / fmt.segment_name(0)
    good_size = seg.stat().st_size
    batch = fmt.encode_batch(100, [(None, None, (), b"y" * 20_000)], [1])
    extra = {
        "zeros": bytes(8192),
        "cut batch": batch[:10_000],
        "header and zeros": batch[: fmt.BATCH_SIZE] + bytes(8192),
    }[tail]
    with open(seg, "ab") as fh:
        fh.write(extra)
    log = TopicLog(t)
    log.check_end()
    assert log.end_offset() == 100
    assert [r[0] for r in read_all(log, 0, log.end_offset())] == list(range(100))
    assert read_all(log, 100, log.end_offset()) == []
    with LogWriter(t) as w:
        assert seg.stat().st_size == good_size
        assert w.append([(None, None, (), b"next")]) == (100, 100)


def _flip(path: Path, pos: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        b = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([b[0] ^ 0x40]))


def test_flipped_byte_mid_log_is_reported_with_its_offset(tmp_path: Path) -> None:
    t = tmp_path / "t"
    fill(t, 1000)
    seg = t / fmt.segment_name(0)
    data = seg.read_bytes()
    target = value(537)
    pos = data.index(target) + 3
    _flip(seg, pos)
    log = TopicLog(t)
    with pytest.raises(CorruptRecord) as err:
        read_all(log)
    assert err.value.offset == 537
    assert "537" in str(err.value)
    # Records before it are readable; so is everything after with skip_corrupt.
    assert len(read_all(log, 0, 537)) == 537
    skipped: list[object] = []
    recs = read_all(log, skip_corrupt=True, on_corrupt=skipped.append)
    assert [r[0] for r in recs] == [i for i in range(1000) if i != 537]
    assert len(skipped) == 1 and skipped[0].first == 537  # type: ignore[attr-defined]
    # A writer opening the log does not "repair" mid-log damage by cutting good data.
    with LogWriter(t) as w:
        assert w.append([(None, None, (), b"more")])[0] == 1000


@pytest.mark.parametrize("field", [10, 17])  # base_offset (its records still frame it), payload_len
def test_damaged_batch_header_mid_log_is_reported(tmp_path: Path, field: int) -> None:
    t = tmp_path / "t"
    fill(t, 1000)
    seg = t / fmt.segment_name(0)
    data = seg.read_bytes()
    # the 5th batch header: offsets 400..499
    pos = [i for i in range(len(data)) if data.startswith(fmt.MAGIC, i)][4]
    _flip(seg, pos + field)
    log = TopicLog(t)
    with pytest.raises(CorruptRecord) as err:
        read_all(log)
    assert err.value.offset == 400
    recs = read_all(log, skip_corrupt=True)
    lost = range(400, 500) if field == 17 else range(0)
    assert [r[0] for r in recs] == [i for i in range(1000) if i not in lost]


def test_a_lost_middle_segment_is_reported_not_skipped_silently(tmp_path: Path) -> None:
    t = tmp_path / "t"
    fill(t, 3000, batch=50, config=TopicConfig(segment_bytes=10_000))
    segs = TopicLog(t).segments()
    lost_first, lost_end = segs[2], segs[3]
    (t / fmt.segment_name(lost_first)).unlink()
    log = TopicLog(t)
    with pytest.raises(CorruptRecord) as err:
        read_all(log)
    assert err.value.offset == lost_first and f"{lost_first}..{lost_end - 1}" in str(err.value)
    assert len(read_all(log, 0, lost_first)) == lost_first  # everything before the hole
    with pytest.raises(CorruptRecord):  # a range inside the hole
        read_all(log, lost_first + 3, lost_first + 5)
    skipped: list[object] = []
    recs = read_all(log, skip_corrupt=True, on_corrupt=skipped.append)
    assert [r[0] for r in recs] == [i for i in range(3000) if not lost_first <= i < lost_end]
    assert [(s.first, s.last) for s in skipped] == [(lost_first, lost_end - 1)]  # type: ignore[attr-defined]
    assert read_all(log, lost_first + 3, lost_first + 5, skip_corrupt=True) == []
    assert read_all(log, lost_end, lost_end + 1)[0][0] == lost_end  # after the hole: fine


def test_one_writer_many_readers(tmp_path: Path) -> None:
    t = tmp_path / "t"
    w = LogWriter(t, TopicConfig(segment_bytes=4000))  # segments roll under the followers' feet
    with pytest.raises(WriterBusy):
        LogWriter(t)
    seen: list[int] = []

    def follow() -> None:
        for batch in TopicLog(t).reader(0, 500, follow=True, poll_s=0.01):
            seen.extend(r[0] for r in batch)

    readers = [threading.Thread(target=follow) for _ in range(3)]
    for th in readers:
        th.start()
    for s in range(0, 500, 25):
        w.append([(None, None, (), value(i)) for i in range(s, s + 25)])
        time.sleep(0.002)
    for th in readers:
        th.join(10)
    w.close()
    assert len(TopicLog(t).segments()) > 5
    assert sorted(seen) == sorted(list(range(500)) * 3)


def test_index_is_rebuilt_around_a_lost_or_stale_index(tmp_path: Path) -> None:
    t = tmp_path / "t"
    fill(t, 5000, batch=100)
    idx = t / fmt.index_name(0)
    assert idx.stat().st_size > 0
    os.truncate(idx, idx.stat().st_size - 5)  # a half-written last entry
    log = TopicLog(t)
    assert read_all(log, 4321, 4322)[0][0] == 4321
    idx.unlink()
    assert read_all(TopicLog(t), 4321, 4322)[0][0] == 4321
    assert TopicLog(t).end_offset() == 5000


@pytest.mark.parametrize("field", ["position", "offset", "timestamp"])
def test_a_damaged_index_entry_is_never_trusted(tmp_path: Path, field: str) -> None:
    t = tmp_path / "t"
    with LogWriter(t) as w:
        for b in range(50):
            w.append([(1000 + b, None, (), value(b * 100 + i)) for i in range(100)])
    seg, idx = t / fmt.segment_name(0), t / fmt.index_name(0)
    size = seg.stat().st_size
    data = bytearray(idx.read_bytes())
    n = len(data) // fmt.INDEX_SIZE
    assert n > 3
    off, pos, ts = fmt.INDEX.unpack_from(data, (n - 2) * fmt.INDEX_SIZE)
    if field == "position":  # an entry for the last batch, pointing 8 bytes into it
        off, pos, ts = 4900, seg.read_bytes().rindex(fmt.MAGIC), 1049
        data += fmt.INDEX.pack(off, pos + 8, ts)
    else:  # offset - 3 / timestamp - 9 would start a seek after its target
        damaged = (off - 3, pos, ts) if field == "offset" else (off, pos, ts - 9)
        fmt.INDEX.pack_into(data, (n - 2) * fmt.INDEX_SIZE, *damaged)
    idx.write_bytes(bytes(data))
    log = TopicLog(t)
    assert log.end_offset() == 5000
    target = off - 3 if field == "offset" else off - 1
    assert [r[0] for r in read_all(log, target, target + 5)] == list(range(target, target + 5))
    assert log.offset_for_time(ts - 5) == (ts - 5 - 1000) * 100
    with LogWriter(t) as w:  # the writer's recovery does not take the entry for the end
        assert seg.stat().st_size == size
        assert w.append([(None, None, (), b"x")]) == (5000, 5000)


def test_unknown_topic(tmp_path: Path) -> None:
    with pytest.raises(TopicNotFound):
        TopicLog(tmp_path / "nope")


def test_a_record_over_the_batch_limit_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fmt, "MAX_BATCH_PAYLOAD", 1000)  # 256 MiB in real life
    t = tmp_path / "t"
    fill(t, 3)
    seg = t / fmt.segment_name(0)
    size = seg.stat().st_size
    with LogWriter(t) as w, pytest.raises(RecordTooLarge):
        w.append([(None, None, (), b"ok"), (None, None, (), b"x" * 1000)])
    assert seg.stat().st_size == size
    with LogWriter(t) as w:  # a batch over the limit made of small records is split, not refused
        assert w.append([(None, None, (), b"%03d" % i + b"y" * 300) for i in range(10)]) == (3, 12)
    recs = read_all(TopicLog(t))
    assert [r[0] for r in recs] == list(range(13)) and recs[-1][4] == b"009" + b"y" * 300


def _three_batches(t: Path, stamps: tuple[int, int, int] = (1000, 2000, 3000)) -> Path:
    """Offsets 0-2, 3-5, 6-8, one batch each, stamped stamps[0], [1], [2]; returns the segment."""
    with LogWriter(t) as w:
        for b, ts in enumerate(stamps):
            w.append([(ts, None, (), b"value-%d" % (3 * b + i)) for i in range(3)])
    return t / fmt.segment_name(0)


def test_a_time_seek_sees_through_a_damaged_record_where_the_headers_pin_the_time(tmp_path: Path) -> None:
    seg = _three_batches(tmp_path / "t")
    _flip(seg, seg.read_bytes().index(b"value-3") + 6)
    log = TopicLog(tmp_path / "t")
    # Batch 3-5's header (its own CRC holds) says record 3 is stamped 2000: the seek lands on it
    # and the read then reports it, instead of stepping over the batch to 6.
    assert log.offset_for_time(2000) == 3
    assert log.offset_for_time(1001) == 3
    assert log.offset_for_time(2001) == 6  # the header's newest stamp: the whole batch is older
    assert log.offset_for_time(3000) == 6 and log.offset_for_time(3001) == 9
    with pytest.raises(CorruptRecord) as err:
        read_all(log, log.offset_for_time(2000))
    assert err.value.offset == 3


def test_a_time_seek_refuses_to_guess_where_damage_hides_the_time(tmp_path: Path) -> None:
    t = tmp_path / "t"
    with LogWriter(t) as w:
        w.append([(ts, None, (), b"value-%d" % ts) for ts in (1000, 2000, 3000)])
    seg = t / fmt.segment_name(0)
    _flip(seg, seg.read_bytes().index(b"value-2000") + 6)
    log = TopicLog(t)
    assert log.offset_for_time(500) == 0 and log.offset_for_time(1000) == 0
    assert log.offset_for_time(3001) == 3  # after the newest record: the end
    for ts in (1001, 2000, 3000):  # record 1 may be stamped anywhere in 1000..3000
        with pytest.raises(CorruptRecord) as err:
            log.offset_for_time(ts)
        assert err.value.offset == 1


def _batch_starts(seg: Path) -> list[int]:
    data = seg.read_bytes()
    return [i for i in range(len(data)) if data.startswith(fmt.MAGIC, i)]


def test_a_time_seek_past_a_damaged_batch_header(tmp_path: Path) -> None:
    seg = _three_batches(tmp_path / "m")
    second = _batch_starts(seg)[1]
    with open(seg, "r+b") as fh:  # the magic overwritten: the records still frame the batch
        fh.seek(second)
        fh.write(b"XXXX")
    log = TopicLog(tmp_path / "m")
    assert [log.offset_for_time(ts) for ts in (2000, 2001, 3000, 3001)] == [3, 6, 6, 9]
    seg = _three_batches(tmp_path / "p")
    second = _batch_starts(seg)[1]
    _flip(seg, second + 17)  # payload_len: the batch cannot be framed; its offsets 3..5 are lost
    log = TopicLog(tmp_path / "p")
    assert log.offset_for_time(1000) == 0 and log.offset_for_time(3001) == 9
    for ts in (1001, 2000, 3000):
        with pytest.raises(CorruptRecord) as err:
            log.offset_for_time(ts)
        assert err.value.offset == 3


def test_a_read_starting_after_a_damaged_record_of_its_batch_is_not_failed_by_it(tmp_path: Path) -> None:
    seg = _three_batches(tmp_path / "t")
    _flip(seg, seg.read_bytes().index(b"value-3") + 6)
    log = TopicLog(tmp_path / "t")
    assert [r[0] for r in read_all(log, 4)] == [4, 5, 6, 7, 8]
    skipped: list[object] = []
    assert [r[0] for r in read_all(log, 4, skip_corrupt=True, on_corrupt=skipped.append)] == [4, 5, 6, 7, 8]
    assert skipped == []  # record 3 is outside the read: not reported either
    with pytest.raises(CorruptRecord) as err:
        read_all(log, 2)
    assert err.value.offset == 3
    assert [r[0] for r in read_all(log, 0, 3)] == [0, 1, 2]
