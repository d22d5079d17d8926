"""After the wall clock stepped back (NTP, a resumed VM), reads stopped being recorded: Index.touch
moves a stamp only forward, so every entry stamped before the step kept its stamp (LRU froze),
and Prefetcher compared the workers' new, earlier stamps with its own start time and with the
entries' landing stamps, all ahead of them: the window no longer followed DataLoader workers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from rqtest import random_files

from cache import Cache
from cache.index import Index

STEP = 3600.0


def test_a_stamp_ahead_of_the_clock_moves_again(tmp_path: Path, ram_dir: Path) -> None:
    src = random_files(tmp_path / "src", 2, 100)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        c.preload([str(src)])
        url = str(src / "0")
        index = c._state().index
        index.touch({url: time.time() + STEP})  # read before the clock went back an hour
        now = time.time()
        index.touch({url: now})
        assert c.stat(url).last_access == now  # (old: still an hour ahead)
        index.touch({url: now - 0.5})  # an older batch of another process: kept out, as before
        assert c.stat(url).last_access == now


def test_a_prefetch_follows_reads_made_after_the_clock_stepped_back(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = random_files(tmp_path / "src", 12, 1000)
    order = [str(src / str(i)) for i in range(12)]
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    pre = c.prefetch(order, ahead=4, tier="ram")
    assert pre.wait_warm(30)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - STEP)
    worker = Index(tmp_path / "c" / "index.sqlite3")  # a DataLoader worker's reads of items 0-3
    worker.touch({url: time.time() for url in order[:4]})
    worker.close()
    deadline = time.monotonic() + 30  # (it looks every 0.5 s; a loaded runner may be slow to)
    while pre.position < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    monkeypatch.setattr(time, "time", real)
    assert pre.position >= 3, pre.position  # (old: 0)
    assert pre.errors == []
    c.close()
