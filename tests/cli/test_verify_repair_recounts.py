"""`rq cache verify --repair` recounts the tier totals from the entries: totals left wrong (by an
older rq, or a program that edited the index) kept every cap wrong, and repair did not mend them."""

from __future__ import annotations

import shutil
import sqlite3
import uuid
from pathlib import Path

from rqtest import run_rq

from cache import Cache


def _disk_total(cache_dir: Path) -> int:
    """The running total every cap is checked against (rq cache du counts the entries instead)."""
    with sqlite3.connect(cache_dir / "index.sqlite3") as db:
        return int(db.execute("SELECT bytes FROM tier_bytes WHERE tier = 'disk'").fetchone()[0])


def test_verify_repair_recounts_wrong_totals(tmp_path: Path) -> None:
    ram = Path("/dev/shm") / f"rqtest-{uuid.uuid4().hex[:10]}"
    cache_dir = tmp_path / "c"
    Cache(cache_dir, ram_dir=ram).close()
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}").write_bytes(b"x" * 1000)
    try:
        assert run_rq("preload", str(src), "--cache-dir", str(cache_dir), "-q").returncode == 0
        assert _disk_total(cache_dir) == 3000
        with sqlite3.connect(cache_dir / "index.sqlite3") as db:
            db.execute("UPDATE tier_bytes SET bytes = -20000 WHERE tier = 'disk'")
        res = run_rq("cache", "verify", "--repair", "--cache-dir", str(cache_dir))
        assert res.returncode == 0, res.stderr
        assert _disk_total(cache_dir) == 3000  # (old code: -20000)
    finally:
        shutil.rmtree(ram, ignore_errors=True)
