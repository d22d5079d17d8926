"""The RAM root a cache's index names is gone after a reboot and its predictable name taken by
another user (or by something that is not a directory): the cache was refused whole (exit 2,
"belongs to uid …; remove it, or give the cache another ram_dir"), which a CLI user can do neither
of. It now passes over to a fresh name as a new cache does, records it (index and the `ram`
link), and drops the RAM entries whose files went with the old root; the squatter is not touched."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cachekit import cache_with_both_tiers

import cache.api
from cache import Cache


def _cache_with_both_tiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(cache.api, "default_ram_root", lambda root, n=0: shm / f"rq-{n}")
    src, old = cache_with_both_tiers(tmp_path)
    shutil.rmtree(old)  # the reboot
    return src, old, tmp_path / "c"


def _check_moved_on(src: Path, old: Path, root: Path) -> None:
    with Cache(root) as c:
        assert c.layout.ram_root != old and c.ram_unavailable is None
        assert [(e.url, e.tier) for e in c.entries()] == [(str(src / "d"), "disk")]
        assert c.read_bytes(str(src / "d")) == b"disk"
        c.preload([str(src / "r")], tier="ram")
        assert c.stat(str(src / "r")).tier == "ram"
        new = c.layout.ram_root
    assert os.readlink(root / "ram") == str(new)
    with Cache(root) as c:  # recorded: the next open uses it too, entries and all
        assert c.layout.ram_root == new
        assert c.read_bytes(str(src / "r")) == b"ram"


def test_a_recorded_root_taken_by_a_file_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, old, root = _cache_with_both_tiers(tmp_path, monkeypatch)
    old.write_bytes(b"squatter")
    _check_moved_on(src, old, root)
    assert old.read_bytes() == b"squatter"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another uid")
def test_a_recorded_root_taken_by_another_user_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, old, root = _cache_with_both_tiers(tmp_path, monkeypatch)
    old.mkdir(mode=0o755)
    os.chown(old, 65534, 65534)
    _check_moved_on(src, old, root)
    assert os.stat(old).st_uid == 65534 and not any(old.iterdir())
