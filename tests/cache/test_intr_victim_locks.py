"""An interrupt (KeyboardInterrupt) landing after eviction picked its victims, each locked
LOCK_EX, but before they were retired (here: at the COMMIT of the transaction that picked them)
lost their descriptors: the rolled-back rows named those files again, but this process kept them
locked for good. Eviction then skipped them as "open by a reader" (`evict` left them), and a
later landing of the same object waited in lock_twin up to 60 s per object (the leak reviewer saw
an interrupted preload hang in the publisher's lock_twin). Picked victims not retired are now
unlocked whatever ends the transaction."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from cachekit import local_source

import cache.store as store_module
from cache import Cache


class _InterruptAtCommit:
    """The index's connection; once armed, its next COMMIT raises KeyboardInterrupt instead."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._real, self.armed = db, False

    def execute(self, sql: str, *args: Any) -> Any:
        if self.armed and sql == "COMMIT":
            self.armed = False
            raise KeyboardInterrupt
        return self._real.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _fds_on(root: Path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(root)):
                out.append(target)
    return out


def test_victims_picked_by_an_interrupted_transaction_are_unlocked(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = local_source(tmp_path / "src", 3, 4000)
    cache = Cache(tmp_path / "c", ram_dir=ram_dir, disk_limit=9000)
    try:
        cache.preload([str(src / "f0"), str(src / "f1")])
        index = cache._state().index
        conn = _InterruptAtCommit(index._db)
        monkeypatch.setattr(index, "_db", conn)
        real_pick = store_module.Store._pick_victims

        def pick(self: Any, *args: Any, **kwargs: Any) -> Any:
            victims = real_pick(self, *args, **kwargs)
            conn.armed = bool(victims)
            return victims

        monkeypatch.setattr(store_module.Store, "_pick_victims", pick)
        with pytest.raises(KeyboardInterrupt):
            cache.preload([str(src / "f2")])
        monkeypatch.undo()
        assert _fds_on(tmp_path / "c" / "objects") == []
        assert cache.evict(f"{src}/*") == (2, 0)  # (evicted, skipped as open): none locked
    finally:
        cache.close()
