"""An aborted preload's count is what the index committed. `rq preload`'s aborted summary counts
`Landed` events; an interrupt (or an error) that reached the fetcher after a batch's commit, as
Store.land collected superseded blobs, or inside the caller's on_event, left committed objects
without their event: the summary said fewer objects than the run had cached. Each committed
object is now counted and reported, then the error goes on."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from cachekit import local_source

import cache.fetcher
import cache.store
from cache import Cache
from cache import events as ev


def _indexed(cache_dir: Path) -> int:
    with sqlite3.connect(cache_dir / "index.sqlite3") as db:
        return int(db.execute("select count(*) from entries").fetchone()[0])


def test_an_interrupt_after_a_commit_still_counts_its_batch(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache.fetcher, "LAND_BATCH", 4)
    src = local_source(tmp_path / "src", 40, 100)
    land = cache.store.Store.land
    calls = []

    def committed_then_interrupted(self: Any, items: Any) -> None:
        land(self, items)
        calls.append(len(items))
        if len(calls) == 2:
            raise KeyboardInterrupt  # (as SIGINT lands between the COMMIT and land()'s return)

    monkeypatch.setattr(cache.store.Store, "land", committed_then_interrupted)
    landed: list[str] = []
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c, pytest.raises(KeyboardInterrupt):
        c.preload([str(src)], on_event=lambda e: landed.append(e.url) if isinstance(e, ev.Landed) else None)
    assert len(calls) >= 2
    assert len(landed) == _indexed(tmp_path / "c") >= sum(calls[:2])


def test_an_interrupt_in_on_event_still_reports_the_rest_of_the_batch(tmp_path: Path, ram_dir: Path) -> None:
    src = local_source(tmp_path / "src", 40, 100)
    landed: list[str] = []

    def on_event(e: object) -> None:
        if isinstance(e, ev.Landed):
            landed.append(e.url)
            if len(landed) == 1:
                raise KeyboardInterrupt

    with Cache(tmp_path / "c", ram_dir=ram_dir) as c, pytest.raises(KeyboardInterrupt):
        c.preload([str(src)], on_event=on_event)
    assert len(landed) == _indexed(tmp_path / "c") > 1
