"""A run that is failing (or Ctrl-C) cancels what it started; a directory origin's copies could not
be cancelled (LocalOrigin.fetch returned None), so a halted `rq preload` went on copying every object
it had queued on the copy pool (up to its window of 256) before it exited: from a slow NFS server,
minutes after Ctrl-C. (By hand, 200 files of 8 MiB read at 1 MiB per 50 ms, SIGINT after 1.2 s:
exit 130 after 2.33 s with all 200 landed; now after 0.19 s with 64.)"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from cache.landing import ObjectInfo
from cache.origins import LocalOrigin, local_version


class _Sink:
    """The part of a Landing a local copy uses."""

    def note_read(self, when_ns: int) -> None:
        pass

    def write(self, chunk: Any, offset: int, inline: bool = False) -> None:
        pass


def test_cancelled_copies_end_without_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    infos = []
    for i in range(100):
        f = src / f"f{i:03}"
        f.write_bytes(b"x" * 10)
        infos.append(ObjectInfo(str(f), f.name, 10, local_version(f.stat())))
    origin = LocalOrigin(src, workers=2)
    threads = origin.pool(origin.workers)._max_workers  # (the pool is the process's: maybe bigger)

    gate = threading.Event()
    lock = threading.Lock()
    reads: list[int] = []
    all_blocked = threading.Event()
    real_preadv = os.preadv

    def preadv(fd: int, buffers: Any, offset: int) -> int:
        if threading.current_thread().name.startswith("rq-local"):
            with lock:
                reads.append(fd)
                if len(reads) == threads:
                    all_blocked.set()
            gate.wait(30)
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", preadv)
    done: list[BaseException | None] = []
    finished = threading.Event()

    def on_done(err: BaseException | None) -> None:
        with lock:
            done.append(err)
            if len(done) == len(infos):
                finished.set()

    try:
        requests = [origin.fetch(info, _Sink(), on_done, None) for info in infos]  # type: ignore[arg-type]
        assert all_blocked.wait(30), "the copy pool's threads never started"
        for req in requests:
            req.cancel()  # was: AttributeError, fetch returned None: nothing to cancel
    finally:
        gate.set()
    assert finished.wait(30)
    # the copies under way end (each file is one chunk, read already); the queued ones end at once,
    # without opening or reading their file (they used to be read, every one)
    assert len(reads) == threads
    cancelled = [e for e in done if e is not None and "cancelled" in str(e)]
    assert len(cancelled) == len(infos) - threads
