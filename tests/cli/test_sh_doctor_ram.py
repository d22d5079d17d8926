"""rq doctor's cache-ram line tells the cgroup memory limit that bounds a new cache's RAM cap
(RAM-tier files count against it: a run past it is OOM-killed), and says "no RAM tier" where
/dev/shm is missing (the disk tier works then: docs/cache.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

import cache.sizes
from rqcli.commands.doctor import check_ram_tier


def test_cache_ram_reports_the_cgroup_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache.sizes, "cgroup_memory_limit", lambda: 512 << 20)
    shm = tmp_path / "shm"
    shm.mkdir()
    ram = check_ram_tier(tmp_path / "c", shm)[0]
    assert ram.check == "cache-ram" and ram.status in ("ok", "warn")
    assert "cgroup memory limit 512" in ram.detail and "at most 256" in ram.detail, ram.detail
    monkeypatch.setattr(cache.sizes, "cgroup_memory_limit", lambda: None)
    assert "cgroup" not in check_ram_tier(tmp_path / "c", shm)[0].detail


def test_cache_ram_without_dev_shm(tmp_path: Path) -> None:
    (ram,) = check_ram_tier(tmp_path / "c", tmp_path / "no-shm")
    assert (ram.status, ram.fix) == ("skip", "use --tier disk") and "no RAM tier" in ram.detail
