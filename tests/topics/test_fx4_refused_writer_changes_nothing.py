"""A second writer refused with "is being written by another process" changes nothing (review fx4).

`LogWriter` wrote topic.json (the --segment-bytes/--retention-* of the command) before it tried
writer.lock: the refused `rq produce T --retention-bytes 1` left retention_bytes 1 behind, and the
next produce applied it, deleting every sealed segment. The "another writer holds it" state is made
here by holding writer.lock's flock in the test process.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rqtest import run_rq

from rqcli.exitcodes import ExitCode
from topics.embedded.log import LogWriter, TopicConfig, TopicLog
from topics.errors import WriterBusy


@contextmanager
def _writer_lock_held(topic: Path) -> Iterator[None]:
    fd = os.open(topic / "writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def _topic_of_segments(topic: Path) -> None:
    with LogWriter(topic, TopicConfig(segment_bytes=4096)) as w:
        for i in range(0, 2000, 100):
            w.append([(None, None, [], str(n).encode()) for n in range(i, i + 100)])
    assert len(TopicLog(topic).segments()) > 3


def _offsets(topic: Path) -> tuple[int, int]:
    log = TopicLog(topic)
    return log.first_offset(), log.end_offset()


def test_a_refused_rq_produce_leaves_topic_json_and_the_records_alone(tmp_path: Path) -> None:
    topics = tmp_path / "topics"
    topic = topics / "lk2"
    _topic_of_segments(topic)
    before = (topic / "topic.json").read_bytes()
    env = {"RQ_TOPICS_DIR": str(topics)}
    with _writer_lock_held(topic):
        for flag, value in (("--retention-bytes", "1"), ("--segment-bytes", "1K"), ("--retention-age", "1s")):
            res = run_rq("produce", "lk2", flag, value, input=b"x\n", env=env)
            assert res.returncode == ExitCode.FAILURE, res.stderr
            assert b"is being written by another process" in res.stderr
            assert (topic / "topic.json").read_bytes() == before, flag
    assert _offsets(topic) == (0, 2000)
    # the next writer works with the topic's own settings: nothing deleted
    assert run_rq("produce", "lk2", "-q", input=b"y\n", env=env).returncode == 0
    assert _offsets(topic) == (0, 2001)
    assert (topic / "topic.json").read_bytes() == before


def test_a_refused_library_writer_does_not_write_its_config(tmp_path: Path) -> None:
    topic = tmp_path / "t"
    _topic_of_segments(topic)
    before = (topic / "topic.json").read_bytes()
    with _writer_lock_held(topic), pytest.raises(WriterBusy):
        LogWriter(topic, TopicConfig(segment_bytes=1024, retention_bytes=1))
    assert (topic / "topic.json").read_bytes() == before
    with LogWriter(topic) as w:  # retention applied at open: with the old settings, nothing to do
        assert w.config == TopicConfig(segment_bytes=4096)
    assert _offsets(topic) == (0, 2000)


def test_a_second_creator_of_a_new_topic_hears_writer_busy(tmp_path: Path) -> None:
    """The first creator takes writer.lock before it writes topic.json: a second one sees a
    directory holding only writer.lock and is refused by the lock, not told the directory is not
    a topic; once the lock is free, that directory becomes the topic."""
    topic = tmp_path / "new"
    topic.mkdir()
    with _writer_lock_held(topic), pytest.raises(WriterBusy):
        LogWriter(topic, TopicConfig(segment_bytes=4096))
    assert sorted(os.listdir(topic)) == ["writer.lock"]
    with LogWriter(topic, TopicConfig(segment_bytes=4096)) as w:
        w.append([(None, None, [], b"a")])
    assert TopicConfig.load(topic) == TopicConfig(segment_bytes=4096)
    assert _offsets(topic) == (0, 1)
