"""ck: one record stamped in the future (an explicit stamp, or a producer whose clock ran ahead)
stamped every later record of an embedded topic at that time, records written under a right clock
too (stamps never decrease, so seeks stay exact), without a word: `--from @-1h` then missed them
until the clock caught up, years later for a stamp in 3000. A stamp more than an hour ahead of the
writer's clock is now refused (Kafka 4.0's default), and `rq produce` says when a topic it writes
to is already stamped ahead. A capture (`tail --record`) keeps its source's stamps as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rqtest import run_rq

from topics.embedded.log import LogWriter, now_ms
from topics.errors import SpecError
from topics.sources.embedded import EmbeddedSource

DAY = 86_400_000


def _stamps(topic: Path) -> list[int]:
    source = EmbeddedSource(topic)
    return [rec[1] for batch in source.log.reader(0, source.end_offset()) for rec in batch]


def test_a_stamp_over_an_hour_ahead_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    topic = tmp_path / "t"
    with LogWriter(topic) as w:
        w.append([(None, None, (), b"now")])
        with pytest.raises(SpecError, match="ahead of this clock"):
            w.append([(None, None, (), b"fine"), (32503680000000, None, (), b"year 3000")])  # (old: stored)
        assert w.next_offset == 1
        w.append([(now_ms() + 30 * 60_000, None, (), b"half an hour ahead")])  # skew within the hour: taken
    with LogWriter(topic, max_ahead_ms=None) as w:  # a copy that keeps its source's stamps
        w.append([(now_ms() + 2 * DAY, None, (), b"two days ahead")])
    assert len(_stamps(topic)) == 3


def test_produce_says_when_the_topic_is_stamped_ahead_of_its_clock(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "t", max_ahead_ms=None) as w:
        w.append([(now_ms() + 2 * DAY, None, (), b"ahead")])
    done = run_rq("produce", "t", "--topics-dir", str(tmp_path), input=b"a\n")
    assert done.returncode == 0, done.stderr
    assert b"stamped 2.0 d ahead of this clock" in done.stderr  # (old: no word)
    fine = run_rq("produce", "u", "--topics-dir", str(tmp_path), input=b"a\n")
    assert fine.returncode == 0 and b"ahead" not in fine.stderr


def test_a_capture_keeps_stamps_ahead_of_its_clock(tmp_path: Path) -> None:
    ahead = now_ms() + 2 * DAY
    with LogWriter(tmp_path / "src", max_ahead_ms=None) as w:
        w.append([(ahead, None, (), b"x"), (ahead + 1, None, (), b"y")])
    done = run_rq(
        "tail", "src", "--topics-dir", str(tmp_path), "-n", "2", "--record", "copy", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    assert len([json.loads(line) for line in done.stdout.splitlines()]) == 2
    assert _stamps(tmp_path / "copy") == [ahead, ahead + 1]
