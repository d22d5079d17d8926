"""Per-object work of small objects that the preload's speed target (issue 3) pays for 2,000 times.

* With batch syncs, a whole object is finished (read back, hashed, verified) on the thread that
  reported it done, not handed to a finisher thread (a queue message, a wake-up and a GIL hand-off
  fewer per object)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from cachekit import local_source

from cache import Cache
from cache.landing import Landing


def test_whole_objects_finish_on_the_thread_that_reports_them_done(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: set[str] = set()
    finish = Landing.finish

    def spy(self: Landing) -> Any:
        threads.add(threading.current_thread().name)
        return finish(self)

    monkeypatch.setattr(Landing, "finish", spy)
    src = local_source(tmp_path / "src", 20, 1000)
    with Cache(tmp_path / "cache", ram_dir=ram_dir) as c:
        result = c.preload([str(src)], tier="disk")
    assert result.objects == 20
    assert threads and not any(name.startswith("rq-finish") for name in threads), threads
