"""Segment boundaries of the embedded log (topics loose ends of issue #5).

- Time ranges that start, end or lie across segment boundaries, one that falls wholly between two
  records, and bounds equal to the timestamp of a segment's first or last record: exactly the
  records stamped in [from, to), none missing or doubled (a guard: this held before).
- A signal (KeyboardInterrupt) while the writer rolls to a new segment: the writer kept the old
  books with the new segment's fd (or a closed fd), so an append after it failed, and a roll
  retried found its half-made segment (FileExistsError).
- Two threads committing one group at once shared one temp file name (per pid): a torn or
  missing group file, FileNotFoundError from the rename.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import topics.embedded.log as logmod
from topics.embedded import format as fmt
from topics.embedded.groups import GroupStore
from topics.embedded.log import LogWriter, TopicConfig, TopicLog

# 40 records: timestamps 1000, 1010, ... with runs of equal ones (the clamp makes ties common),
# written one record per batch into 150-byte segments: every record sits at a segment boundary.
_STAMPS = [1000 + 10 * (i // 2) for i in range(40)]


def _topic(tmp_path: Path, per_batch: int) -> Path:
    t = tmp_path / "t"
    with LogWriter(t, TopicConfig(segment_bytes=150 * per_batch)) as w:
        for i in range(0, len(_STAMPS), per_batch):
            w.append([(ts, None, (), b"v%d" % (i + j)) for j, ts in enumerate(_STAMPS[i : i + per_batch])])
    return t


def _between(log: TopicLog, lo: int, hi: int) -> list[int]:
    start, stop = log.offset_for_time(lo), log.offset_for_time(hi)
    return [r[0] for batch in log.reader(start, max(start, stop)) for r in batch]


@pytest.mark.parametrize("per_batch", [1, 3])
def test_time_ranges_across_segment_boundaries_are_exact(tmp_path: Path, per_batch: int) -> None:
    t = _topic(tmp_path, per_batch)
    log = TopicLog(t)
    assert len(log.segments()) > 5  # the boundaries are there to cross
    edges = sorted({ts + d for ts in _STAMPS for d in (-1, 0, 1)} | {0, 10**13})
    at = {ts: log.offset_for_time(ts) for ts in edges}
    for ts, off in at.items():
        assert off == next((i for i, s in enumerate(_STAMPS) if s >= ts), len(_STAMPS)), ts
    for lo in edges:
        for hi in edges:
            if hi >= lo:
                want = [off for off, ts in enumerate(_STAMPS) if lo <= ts < hi]
                assert list(range(at[lo], max(at[lo], at[hi]))) == want, (lo, hi)
    # the reader serves each such range exactly, wherever it starts and stops
    for lo in edges[::3]:
        for hi in edges[::3]:
            if hi >= lo:
                assert _between(log, lo, hi) == [o for o, ts in enumerate(_STAMPS) if lo <= ts < hi]


def test_bounds_at_a_segments_first_and_last_record(tmp_path: Path) -> None:
    t = _topic(tmp_path, 3)
    log = TopicLog(t)
    segs = log.segments()
    firsts = [_STAMPS[b] for b in segs]
    lasts = [_STAMPS[n - 1] for n in segs[1:]]
    for ts in firsts + lasts:
        assert log.offset_for_time(ts) == _STAMPS.index(ts)  # the first record stamped ts
        assert _between(log, ts, ts + 1) == [i for i, s in enumerate(_STAMPS) if s == ts]
    # a range wholly between two records (of two segments): nothing, and nothing doubled around it
    assert _between(log, 1001, 1009) == []
    assert log.offset_for_time(1001) == log.offset_for_time(1009) == 2


def _writer_rolling(tmp_path: Path) -> LogWriter:
    w = LogWriter(tmp_path / "t", TopicConfig(segment_bytes=100))
    w.append([(None, None, (), b"a" * 40)])
    return w


def test_a_signal_while_the_writer_rolls_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = _writer_rolling(tmp_path)
    real = logmod.fsync_dir
    calls = [0]

    def stopped(path: Path) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise KeyboardInterrupt  # the signal lands inside the roll
        real(path)

    monkeypatch.setattr(logmod, "fsync_dir", stopped)
    with pytest.raises(KeyboardInterrupt):
        w.append([(None, None, (), b"b" * 40)])
    # the caller goes on (a library user that caught it): the same writer rolls again and appends
    assert w.append([(None, None, (), b"b" * 40)]) == (1, 1)
    w.close()
    with LogWriter(tmp_path / "t") as w2:  # the next run continues
        assert w2.append([(None, None, (), b"c" * 40)]) == (2, 2)
    got = [(r[0], r[4]) for b in TopicLog(tmp_path / "t").reader(0) for r in b]
    assert got == [(0, b"a" * 40), (1, b"b" * 40), (2, b"c" * 40)]


def test_a_signal_before_the_new_segment_leaves_no_stale_fd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = _writer_rolling(tmp_path)
    real_open = logmod.os.open

    def stopped(path: object, *args: object, **kw: object) -> int:
        if str(path).endswith(fmt.segment_name(1)):
            raise KeyboardInterrupt  # before the new segment exists
        return real_open(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(logmod.os, "open", stopped)
    with pytest.raises(KeyboardInterrupt):
        w.append([(None, None, (), b"b" * 40)])
    monkeypatch.setattr(logmod.os, "open", real_open)
    w.close()  # closes only files it holds (was EBADF: the old segment's fd, already closed)
    with LogWriter(tmp_path / "t") as w2:
        assert w2.append([(None, None, (), b"b" * 40)]) == (1, 1)
    assert [r[0] for b in TopicLog(tmp_path / "t").reader(0) for r in b] == [0, 1]


def test_an_empty_newest_segment_keeps_timestamps_from_going_back(tmp_path: Path) -> None:
    t = tmp_path / "t"
    with LogWriter(t, TopicConfig(segment_bytes=10_000)) as w:
        w.append([(1000, None, (), b"a"), (5000, None, (), b"b")])
    (t / fmt.segment_name(2)).touch()  # a roll stopped before its first batch
    with LogWriter(t) as w:
        w.append([(3000, None, (), b"c")])  # a record's own time (tail --record), older
    stamps = [r[1] for b in TopicLog(t).reader(0) for r in b]
    assert stamps == [1000, 5000, 5000]  # clamped to the newest before it, not to 1000
    assert TopicLog(t).offset_for_time(5000) == 1


def test_two_threads_committing_one_group_each_write_a_whole_file(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "t") as w:
        w.append([(None, None, (), b"x")])
    store = GroupStore(tmp_path / "t")
    errors: list[BaseException] = []
    seen: list[int] = []

    def commit(n: int) -> None:
        for i in range(150):
            try:
                store.commit("g", n * 1000 + i)
                seen.append(store.committed("g") or 0)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=commit, args=(n,)) for n in (1, 2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert store.committed("g") in (1149, 2149)  # the last writer wins, whole
    assert not [p for p in (tmp_path / "t" / "groups").iterdir() if p.suffix == ".tmp"]


def test_rq_replay_time_bounds_at_segment_edges(tmp_path: Path) -> None:
    from rqtest import run_rq

    _topic(tmp_path, 3)
    env = {"RQ_TOPICS_DIR": str(tmp_path)}

    def replay(lo: int, hi: int) -> list[bytes]:
        res = run_rq("replay", "t", "--from", f"@{lo}", "--to", f"@{hi}", "--format", "raw", env=env)
        assert res.returncode == 0, res.stderr
        return res.stdout.split()

    assert replay(1001, 1009) == []  # wholly between two records
    assert replay(1010, 1030) == [b"v2", b"v3", b"v4", b"v5"]  # from a segment's last record
    assert replay(1000, 1190) == [b"v%d" % i for i in range(38)]
