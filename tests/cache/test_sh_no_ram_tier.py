"""A machine without a usable RAM tier (/dev/shm missing, read-only, not ours to write: common in
containers) could not use rq at all: every Cache() tried to make the RAM root and failed (exit 2),
even for the disk tier or to read an existing cache. The disk tier now works without it (RAM's cap
0, `ram_unavailable` says why) and only asking for the RAM tier is refused, RamTierUnavailableError
(rq: exit 10). A failed create leaves nothing behind in a cache directory it made."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cachekit import cache_with_both_tiers

import cache.api
from cache import Cache, RamTierUnavailableError
from cache.errors import UnsafeDirError


def _shm_under(monkeypatch: pytest.MonkeyPatch, shm: Path) -> None:
    monkeypatch.setattr(cache.api, "default_ram_root", lambda root, n=0: shm / f"rq-{n}")


def _no_shm(shm: Path) -> None:
    """Makes `shm` unusable whoever we are (root included): a regular file, so mkdir under it fails."""
    shutil.rmtree(shm, ignore_errors=True)
    shm.write_bytes(b"")


def test_disk_tier_works_without_a_ram_tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shm = tmp_path / "shm"
    _no_shm(shm)
    _shm_under(monkeypatch, shm)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"aaa")
    with Cache(tmp_path / "c") as c:
        assert c.ram_unavailable is not None and str(shm) in c.ram_unavailable
        assert c.caps["ram"] == 0
        result = c.preload([str(tmp_path / "src")], tier="disk")
        assert not result.failed
        assert c.read_bytes(str(tmp_path / "src" / "a")) == b"aaa"
        with pytest.raises(RamTierUnavailableError, match="no RAM tier"):
            c.preload([str(tmp_path / "src")], tier="ram")
        with pytest.raises(RamTierUnavailableError):
            c.open(str(tmp_path / "src" / "b"), tier="ram")
        with pytest.raises(RamTierUnavailableError):
            c.prefetch([str(tmp_path / "src" / "a")], tier="ram")
        assert c.usage()["ram"]["limit"] == 0
    assert shm.is_file()


def test_existing_cache_is_read_after_the_ram_tier_went(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    _shm_under(monkeypatch, shm)
    src, _ = cache_with_both_tiers(tmp_path)
    _no_shm(shm)  # a reboot into a container without /dev/shm
    with Cache(tmp_path / "c") as c:
        assert c.ram_unavailable is not None
        assert [(e.url, e.tier) for e in c.entries()] == [(str(src / "d"), "disk")]  # RAM's files are gone
        assert c.read_bytes(str(src / "d")) == b"disk"
        assert c.read_bytes(str(src / "r")) == b"ram"  # fetched again, into the disk tier
        assert c.verify()[1] == []


def test_a_failed_create_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    _shm_under(monkeypatch, shm)
    for n in range(16):
        (shm / f"rq-{n}").write_bytes(b"squatter")  # every name taken
    with pytest.raises(UnsafeDirError, match="no free RAM tier directory name"):
        Cache(tmp_path / "c")
    assert not (tmp_path / "c").exists()
    (tmp_path / "c2").mkdir()
    (tmp_path / "c2" / "mine").write_bytes(b"x")
    with pytest.raises(UnsafeDirError):
        Cache(tmp_path / "c2")  # not a cache and not empty: refused, untouched
    assert sorted(p.name for p in (tmp_path / "c2").iterdir()) == ["mine"]
