"""tq: a topic creation that failed (a full disk while topic.json was written) unlinks the
writer.lock it made, to leave the directory as it was. A second creator that had opened that
writer.lock before the unlink then took its flock after it: a lock on a file no longer in the
directory, so a third writer made a new writer.lock, locked it too, and two writers appended to
one topic at once. A writer now checks, once it holds the flock, that writer.lock is still the file
it locked, and locks the new one otherwise. Deterministic: the steps are ordered with events."""

from __future__ import annotations

import errno
import fcntl
import threading
from pathlib import Path
from typing import Any

import pytest

from topics.embedded.log import LogWriter, TopicConfig
from topics.errors import WriterBusy

WAIT_S = 10.0


def test_failed_creation_unlinking_its_lock_lets_no_two_writers_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = tmp_path / "T"
    a_holds, b_opened, a_done = threading.Event(), threading.Event(), threading.Event()
    threads: dict[str, threading.Thread] = {}
    real_flock, real_save = fcntl.flock, TopicConfig.save

    def flock(fd: int, op: int) -> Any:
        if threading.current_thread() is threads.get("b") and not b_opened.is_set():
            b_opened.set()  # B opened the first creator's writer.lock: it locks once A is gone
            assert a_done.wait(WAIT_S)
        return real_flock(fd, op)

    def save(self: TopicConfig, directory: Path) -> None:
        if threading.current_thread() is threads.get("a"):
            a_holds.set()
            assert b_opened.wait(WAIT_S)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(self, directory)

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(TopicConfig, "save", save)
    failed: list[BaseException] = []
    writers: list[LogWriter] = []

    def create_a() -> None:
        try:
            LogWriter(topic, TopicConfig())
        except Exception as exc:
            failed.append(exc)
        finally:
            a_done.set()

    def create_b() -> None:
        writers.append(LogWriter(topic))

    threads["a"] = threading.Thread(target=create_a)
    threads["b"] = threading.Thread(target=create_b)
    threads["a"].start()
    assert a_holds.wait(WAIT_S)
    threads["b"].start()
    for t in threads.values():
        t.join(WAIT_S)
        assert not t.is_alive()
    assert failed and "No space left" in str(failed[0])
    assert len(writers) == 1  # the second creator made the topic
    try:
        with pytest.raises(WriterBusy):  # was: a third writer got in beside it
            LogWriter(topic).close()
        assert writers[0].append([(None, None, (), b"x")]) == (0, 0)  # the topic works
    finally:
        writers[0].close()
