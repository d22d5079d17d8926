"""A cache whose recorded RAM cap is above what this process's cgroup allows (made on the host,
opened in a container with a memory limit) used the recorded cap: tmpfs pages count against the
cgroup, so a `--tier ram` run could fill RAM past the limit and be OOM-killed. The cap this process
uses is now min(recorded, half the cgroup limit) unless a cap is given to this Cache; the recorded
cap stays for processes without the limit, and `ram_cap_note` says so in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

import cache.api
from cache import Cache

KIB = 1024


def _source(tmp_path: Path, n: int, size: int) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(n):
        (src / f"f{i}").write_bytes(bytes([i]) * size)
    return src


def _cgroup(monkeypatch: pytest.MonkeyPatch, limit: int | None) -> None:
    monkeypatch.setattr(cache.api, "cgroup_memory_limit", lambda: limit)


def test_recorded_cap_above_the_cgroup_bound_is_lowered_for_this_process(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cgroup(monkeypatch, None)  # the host: no limit
    with Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit="4M") as c:
        assert c.caps["ram"] == 4 << 20
    _cgroup(monkeypatch, 256 * KIB)  # a container: 256 KiB limit, so at most 128 KiB of RAM tier
    src = _source(tmp_path, 6, 40 * KIB)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        assert c.caps["ram"] == 128 * KIB
        assert c.ram_cap_note is not None and "4.0 MiB recorded" in c.ram_cap_note, c.ram_cap_note
        assert "128.0 KiB" in c.ram_cap_note
        result = c.preload([str(src)], tier="ram")
        assert not result.failed
        usage = c.usage()
        assert usage["ram"]["limit"] == 128 * KIB
        assert 0 < usage["ram"]["bytes"] <= 128 * KIB, usage
        assert usage["ram"]["objects"] + usage["disk"]["objects"] == 6, usage
    _cgroup(monkeypatch, None)  # back on the host: the recorded cap was not changed
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        assert c.caps["ram"] == 4 << 20 and c.ram_cap_note is None


def test_a_cap_given_explicitly_is_the_users_choice(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cgroup(monkeypatch, 256 * KIB)
    with Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit="1M") as c:
        assert c.caps["ram"] == 1 << 20 and c.ram_cap_note is None
    with Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit="100K") as c:  # below the bound: as given
        assert c.caps["ram"] == 100 * KIB and c.ram_cap_note is None
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:  # recorded 100K, under the bound: unchanged
        assert c.caps["ram"] == 100 * KIB and c.ram_cap_note is None


def test_cache_du_says_which_cap_this_process_uses(tmp_path: Path, ram_dir: Path) -> None:
    from rqtest import popen_rq_with

    with Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit="4M"):
        pass
    setup = "import cache.api\ncache.api.cgroup_memory_limit = lambda: 262144"
    proc = popen_rq_with(setup, "cache", "du", "--cache-dir", str(tmp_path / "c"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = out.decode().splitlines()
    assert "4.0 MiB recorded, 128.0 KiB used" in lines[1], lines
    assert lines[2].startswith("ram") and "of   128.0 KiB" in lines[2], lines
