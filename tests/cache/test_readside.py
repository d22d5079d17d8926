"""The read side under churn: verify racing tier moves, pins across a refetch, prefetch windows
with bad items. Each case was found by an independent review."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rqtest import random_files

from cache import Cache


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    return random_files(tmp_path / "origin", 8, 50_000, prefix="f")


def test_verify_does_not_repair_away_an_entry_that_moved_while_it_looked(
    tmp_path: Path, ram_dir: Path, origin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    url = str(origin / "f0")
    c.open(url).read()
    snapshot = c.entries()  # what verify listed: the disk copy
    p = c.prefetch([url], ahead=1, tier="ram")  # ... then another process promotes it
    assert p.wait_warm(10)
    p.stop()
    assert c.stat(url).tier == "ram"
    monkeypatch.setattr(Cache, "entries", lambda self, pattern=None: snapshot)
    checked, problems = c.verify(repair=True)
    monkeypatch.undo()
    assert (checked, problems) == (1, [])  # it reported "missing file" and deleted the entry
    assert c.stat(url).tier == "ram" and c.path(url).read_bytes() == (origin / "f0").read_bytes()
    c.close()


def test_a_pinned_entry_refetched_after_corruption_stays_pinned(
    tmp_path: Path, ram_dir: Path, origin: Path
) -> None:
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    url = str(origin / "f1")
    c.open(url).read()
    c.pin(url)
    path = c.path(url)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    with c.open(url) as fh:
        assert fh.read() == (origin / "f1").read_bytes()  # refetched, never served corrupt
    assert c.stat(url).pinned
    c.close()


def test_prefetch_warms_the_rest_of_a_window_around_bad_items(
    tmp_path: Path, ram_dir: Path, origin: Path
) -> None:
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    good = [str(origin / f"f{i}") for i in range(2, 8)]
    urls = [str(origin / "missing"), good[0], "/etc/hostname/x", *good[1:]]
    p = c.prefetch(urls, ahead=len(urls), tier="ram")
    p.wait_warm(3)  # the bad items never warm
    p.stop()
    assert all(c.stat(u).tier == "ram" for u in good)
    assert len(p.errors) >= 2 and any("missing" in e for e in p.errors)
    c.close()


def test_lru_sees_another_processs_recent_read(tmp_path: Path, ram_dir: Path) -> None:
    """A reader's first open used to wait in a batch until its next open a second later, so an
    evicting process dropped the entry it had just read."""
    d = tmp_path / "o"
    d.mkdir()
    for name in "ABC":
        (d / name).write_bytes(name.encode() * 400_000)
    c2 = Cache(tmp_path / "c", ram_dir=ram_dir, disk_limit=900_000)
    c2.open(str(d / "A")).read()
    c2.open(str(d / "B")).read()
    c1 = Cache(tmp_path / "c", ram_dir=ram_dir)  # e.g. a DataLoader worker
    c1.open(str(d / "A")).read()  # A is now the most recently used entry
    c2.open(str(d / "C")).read()  # room for one more: B must go
    assert sorted(Path(e.url).name for e in c2.entries()) == ["A", "C"]
    c1.close()
    c2.close()
