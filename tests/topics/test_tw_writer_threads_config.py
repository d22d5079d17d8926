"""One LogWriter shared by threads; configs a later writer would refuse (tw)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from topics import LogWriter, TopicConfig, TopicLog
from topics.errors import SpecError, TopicError


def test_threads_appending_through_one_writer_get_distinct_offsets(tmp_path: Path) -> None:
    t = tmp_path / "t"
    w = LogWriter(t, TopicConfig(segment_bytes=4000))  # rolls too, under the threads' feet
    got: list[tuple[int, int]] = []
    gate = threading.Barrier(6)

    def worker(i: int) -> None:
        gate.wait()
        for j in range(60):
            got.append(w.append([(None, b"k%d" % i, (), b"v%d-%d" % (i, j))] * (1 + j % 3)))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    w.close()
    offsets = sorted(o for first, last in got for o in range(first, last + 1))
    total = sum(1 + j % 3 for j in range(60)) * 6
    assert offsets == list(range(total))  # every record its own offset, none handed out twice
    log = TopicLog(t)
    assert log.end_offset() == total
    read = [r[0] for batch in log.reader(0, stop=total) for r in batch]
    assert read == list(range(total))
    with LogWriter(t) as again:
        assert again.next_offset == total


@pytest.mark.parametrize(
    "kwargs",
    [
        {"segment_bytes": 0},
        {"segment_bytes": -1},
        {"segment_bytes": 1000.5},
        {"segment_bytes": True},
        {"retention_ms": 0},
        {"retention_ms": -1000},
        {"retention_bytes": -1},
        {"retention_bytes": "10"},
    ],
)
def test_a_config_a_later_writer_would_refuse_is_refused_first(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(SpecError, match="must be a positive integer"):
        TopicConfig(**kwargs)
    good = TopicConfig()
    t = tmp_path / "t"
    with LogWriter(t, good) as w:
        w.append([(None, None, (), b"a")])
    for name, value in kwargs.items():
        setattr(good, name, value)  # changed after it was made: refused before anything is written
    with pytest.raises(SpecError):
        LogWriter(t, good)
    with LogWriter(t) as w:  # the topic is as it was
        assert w.config == TopicConfig() and w.next_offset == 1
    assert isinstance(SpecError("x"), TopicError)
