"""LocalOrigin.fetch queues its copy on a ThreadPoolExecutor, whose submit() queues the call and
then raises when the thread it starts for it cannot start ("can't start new thread"). A thread
the pool already had ran that copy later, after the failure was reported (the fetcher had given
the object and its landing up): it opened the source and wrote into the landing. The queued copy
is now cancelled: it reports _Cancelled and does no file work."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from cache.landing import ObjectInfo
from cache.origins import LocalOrigin


def test_a_copy_whose_thread_could_not_start_does_no_file_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_start = threading.Thread.start
    started = {"rq-local": 0}

    def start(self: threading.Thread) -> None:
        if self.name.startswith("rq-local"):
            started["rq-local"] += 1
            if started["rq-local"] > 1:  # the pool's first thread starts, no second one
                raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(LocalOrigin, "_pool", None)  # (a pool of this test's own)
    copied: list[str] = []
    monkeypatch.setattr(LocalOrigin, "_copy", lambda self, info, landing, piece: copied.append(info.url))
    (tmp_path / "f").write_bytes(b"x")
    origin = LocalOrigin(tmp_path, workers=4)
    pool = LocalOrigin.pool(4)
    gate, busy = threading.Event(), threading.Event()
    try:
        # the pool's one thread is busy, so the copy's submit() starts a second one: refused
        pool.submit(lambda: (busy.set(), gate.wait(30)))
        assert busy.wait(10)
        reported: list[BaseException | None] = []
        ended = threading.Event()

        def on_done(err: BaseException | None) -> None:
            reported.append(err)
            ended.set()

        info = ObjectInfo(str(tmp_path / "f"), "f", 1, "v")
        landing: Any = object()  # (never touched: the copy is cancelled)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            origin.fetch(info, landing, on_done, None)
        gate.set()  # the one thread now takes the queued copy
        assert ended.wait(10), "the queued copy never ran"
    finally:
        gate.set()
        pool.shutdown(wait=True)
    assert copied == []
    assert len(reported) == 1 and "cancelled" in str(reported[0])
