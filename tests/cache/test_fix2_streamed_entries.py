"""`rq cache ls / verify / pin / evict` loaded the whole index before doing anything (a fetchall
of every row, then a list of every entry, then the pattern's filter): with 200,000 entries the
first line of `rq cache ls` came after 0.6-1.1 s and the process peaked at ~210 MiB. The index is
now read a page at a time (`url > last ORDER BY url LIMIT 1000`, no read transaction held between
pages), a pattern's literal start is a range of the index, and pin works page by page."""

from __future__ import annotations

import sqlite3
import time
import tracemalloc
from pathlib import Path

from cache import Cache
from cache.api import _match
from cache.index import Entry, Index

N = 20_000


def _cache(tmp_path: Path, ram_dir: Path) -> Cache:
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    index = Index(tmp_path / "c" / "index.sqlite3")
    t = time.time()
    with index.write() as db:
        for i in range(N):
            url = f"s3://b/{'train' if i % 2 else 'val'}/{i:06d}[x].tar"
            Index.put(
                db,
                Entry(url, f"etag:{i};size:9", 9, "disk", f"ab/{i:032x}-a", "0" * 32, "size", False, t, t, t),
            )
    index.close()
    return c


def test_entries_are_walked_in_bounded_memory(tmp_path: Path, ram_dir: Path) -> None:
    c = _cache(tmp_path, ram_dir)
    c.stat("s3://b/val/000000[x].tar")  # (the index opened before measuring)
    tracemalloc.start()
    try:
        assert c.pin("s3://b/train/", True) == N // 2
        _, peak_pin = tracemalloc.get_traced_memory()
        # a page of 1,000 entries is ~1 MB; the list of all 20,000 was ~20 MB (old pin: that)
        assert peak_pin < 4 << 20, peak_pin
        tracemalloc.reset_peak()
        n = sum(1 for _ in c.iter_entries("s3://b/"))  # (old: no iter_entries)
        _, peak_ls = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == N
    assert peak_ls < 4 << 20, peak_ls
    assert sum(e.pinned for e in c.iter_entries()) == N // 2
    c.close()


def test_patterns_select_what_they_did(tmp_path: Path, ram_dir: Path) -> None:
    c = _cache(tmp_path, ram_dir)
    urls = [e.url for page in c._state().index.pages() for e in page]
    assert urls == sorted(urls) and len(urls) == N
    for pattern in (
        None,
        "s3://b/val/",
        "s3://b/train/0001*",
        "s3://b/*/00000?[[]x].tar",
        "s3://b/val/000002[x].tar",  # a URL with a `[` in it, given whole
        "s3://b/vax/",
    ):
        want = [u for u in urls if pattern is None or _match(u, pattern)]
        assert [e.url for e in c.iter_entries(pattern)] == want, pattern
    c.close()


def test_a_walk_paused_between_pages_does_not_hold_off_a_checkpoint(tmp_path: Path, ram_dir: Path) -> None:
    c = _cache(tmp_path, ram_dir)
    walk = c.iter_entries()
    next(walk)  # the first page is read; the walk waits (a slow reader of rq cache ls's output)
    other = sqlite3.connect(tmp_path / "c" / "index.sqlite3", isolation_level=None)
    other.execute("UPDATE entries SET pinned = 1 WHERE url = 's3://b/val/000000[x].tar'")
    busy, _, _ = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0
    assert sum(1 for _ in walk) == N - 1
    other.close()
    c.close()
