"""A cache index made before the tier totals (bf25d69) got them new, as zeros under the entries
already there: trusted by every reservation, each cap was overrun by what the cache held (`rq cache
du`: "40 objects 38.1 MiB of 30.0 MiB") and evicting drove the totals below zero, for good. The
index now keeps its layout version (PRAGMA user_version): an older one is brought up to date and its
totals recounted from the entries; a newer one is refused in one line, never misread. The old
layouts are made here directly with sqlite3 (the tables then were those of today, less the totals
and their triggers)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from rqtest import run_rq

import cache.index as index_module
from cache import Cache
from cache.errors import CacheError
from cache.index import Index
from cache.layout import INDEX_NAME

KB = 1000


def _files(root: Path, n: int, size: int, tag: str) -> Path:
    root.mkdir()
    for i in range(n):
        (root / f"{tag}{i}").write_bytes(bytes([i]) * size)
    return root


def _db(cache_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(str(cache_dir / INDEX_NAME), isolation_level=None)


def _totals(cache_dir: Path) -> tuple[int, int]:
    """(tier_bytes of disk, the entries' own sum on disk)."""
    db = _db(cache_dir)
    try:
        total = db.execute("SELECT bytes FROM tier_bytes WHERE tier = 'disk'").fetchone()[0]
        real = db.execute("SELECT COALESCE(SUM(size), 0) FROM entries WHERE tier = 'disk'").fetchone()[0]
    finally:
        db.close()
    return int(total), int(real)


def _make_old(cache_dir: Path, totals: bool) -> None:
    """The index as an older rq left it: without the totals and their triggers (before bf25d69),
    or with them (`totals`) but no version kept."""
    db = _db(cache_dir)
    try:
        if not totals:
            for trigger in ("entries_add", "entries_del", "entries_upd"):
                db.execute(f"DROP TRIGGER {trigger}")
            db.execute("DROP TABLE tier_bytes")
        db.execute("PRAGMA user_version = 0")
    finally:
        db.close()


def test_an_index_from_before_the_totals_keeps_its_caps(tmp_path: Path, ram_dir: Path) -> None:
    cache_dir = tmp_path / "c"
    old = _files(tmp_path / "old", 20, 10 * KB, "o")
    new = _files(tmp_path / "new", 20, 10 * KB, "n")
    with Cache(cache_dir, ram_dir=ram_dir, disk_limit=150 * KB) as c:
        c.preload([str(old)])
        assert c.usage()["disk"]["bytes"] <= 150 * KB
    _make_old(cache_dir, totals=False)

    with Cache(cache_dir, ram_dir=ram_dir) as c:
        total, real = _totals(cache_dir)
        assert total == real > 0  # (old: 0 under 150 KB of entries)
        c.preload([str(new)])
        assert c.usage()["disk"]["bytes"] <= 150 * KB  # (old: 300 KB in a 150 KB cap)
        assert c.clear()[0] > 0
    assert _totals(cache_dir) == (0, 0)  # (old: below zero)
    db = _db(cache_dir)
    assert db.execute("PRAGMA user_version").fetchone()[0] == index_module.INDEX_VERSION
    db.close()


def test_totals_that_drifted_are_recounted_once_and_by_repair(tmp_path: Path, ram_dir: Path) -> None:
    cache_dir = tmp_path / "c"
    src = _files(tmp_path / "src", 5, 10 * KB, "f")
    with Cache(cache_dir, ram_dir=ram_dir) as c:
        c.preload([str(src)])
    _make_old(cache_dir, totals=True)
    db = _db(cache_dir)
    db.execute("UPDATE tier_bytes SET bytes = -7 WHERE tier = 'disk'")  # an older rq's REPLACE drift
    db.close()
    Cache(cache_dir, ram_dir=ram_dir).close()
    assert _totals(cache_dir) == (50 * KB, 50 * KB)

    db = _db(cache_dir)
    db.execute("UPDATE tier_bytes SET bytes = 3 WHERE tier = 'disk'")  # a version-1 index: kept as is
    db.close()
    index = Index(cache_dir / INDEX_NAME)
    try:
        assert _totals(cache_dir) == (3, 50 * KB)
        assert index.recount() == {"ram": 0, "disk": 50 * KB - 3}
        assert _totals(cache_dir) == (50 * KB, 50 * KB)
        assert index.recount() == {"ram": 0, "disk": 0}
    finally:
        index.close()


def test_a_newer_index_is_refused_in_one_line(tmp_path: Path, ram_dir: Path) -> None:
    cache_dir = tmp_path / "c"
    Cache(cache_dir, ram_dir=ram_dir).close()
    db = _db(cache_dir)
    db.execute(f"PRAGMA user_version = {index_module.INDEX_VERSION + 1}")
    db.close()
    with pytest.raises(
        CacheError, match=f"cache index version {index_module.INDEX_VERSION + 1} is newer than this rq"
    ):
        Cache(cache_dir, ram_dir=ram_dir)
    res = run_rq("cache", "du", "--cache-dir", str(cache_dir))
    err = res.stderr.decode()
    assert res.returncode != 0
    assert "is newer than this rq understands" in err and "upgrade rq" in err
    assert "Traceback" not in err
    db = _db(cache_dir)  # nor was it written back as this rq's
    assert db.execute("PRAGMA user_version").fetchone()[0] == index_module.INDEX_VERSION + 1
    db.close()
