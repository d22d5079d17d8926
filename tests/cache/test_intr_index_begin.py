"""A KeyboardInterrupt (SIGALRM in a training job, a Jupyter interrupt) landing in Index.write()
right after BEGIN IMMEDIATE succeeded, before the try that rolls back was entered, left the
connection inside a transaction for good: every later write of that Cache failed "cannot start a
transaction within a transaction", and SQLite's write lock shut every other process out. The
interrupt is injected here right after BEGIN, through a stand-in for the connection."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cache.index import Index


class _InterruptAfterBegin:
    """The index's connection, raising KeyboardInterrupt once, right after a BEGIN succeeded."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._real, self.armed = db, True

    def execute(self, sql: str, *args: Any) -> Any:
        out = self._real.execute(sql, *args)
        if self.armed and sql.startswith("BEGIN"):
            self.armed = False
            raise KeyboardInterrupt
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _other_process_can_write(path: Path) -> bool:
    other = sqlite3.connect(str(path), timeout=0.1, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        other.close()


def test_interrupt_right_after_begin_leaves_no_transaction(tmp_path: Path) -> None:
    index = Index(tmp_path / "index.db", busy_timeout_s=0.1)
    real = index._db
    index._db = _InterruptAfterBegin(real)  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt), index.write() as db:
            index.put_setting(db, "k", "lost")
        assert not real.in_transaction
        assert _other_process_can_write(index.path)
        with index.write() as db:  # the next write works, and is committed
            index.put_setting(db, "k", "kept")
        assert index.setting("k") == "kept"
    finally:
        index._db = real
        index.close()


def test_a_leftover_transaction_is_rolled_back_at_the_next_write(tmp_path: Path) -> None:
    """However one was left open (the interrupt between the check and the ROLLBACK), the next
    write() rolls it back instead of failing for good."""
    index = Index(tmp_path / "index.db", busy_timeout_s=0.1)
    try:
        index._db.execute("BEGIN IMMEDIATE")
        index._db.execute("INSERT INTO settings (key, value) VALUES ('k', 'half')")
        with index.write() as db:
            index.put_setting(db, "j", "kept")
        assert index.setting("j") == "kept"
        assert index.setting("k") is None
        assert not index._db.in_transaction
    finally:
        index.close()
