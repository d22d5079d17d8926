"""`rq preload --tier ram --ram-limit SIZE` that fails (exit 7: some objects are bigger than the
cap) puts the cache's old cap back (restore_limits); its warnings about objects that did not stay
in RAM must still name the cap this run filled the tier under, not the one put back after it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rqtest import random_files, run_rq

from cache import Cache

pytestmark = pytest.mark.integration


def _source(tmp_path: Path) -> Path:
    src = random_files(tmp_path / "src", 4, 140 << 10, prefix="a")  # 560 KiB: 2 fit under 300 KiB
    random_files(src, 2, 400 << 10, prefix="b")  # each bigger than the cap: fails (no_space)
    return src


@pytest.mark.parametrize("stored", [None, "1M"])
def test_a_failed_ram_preload_names_the_cap_it_ran_under(tmp_path: Path, stored: str | None) -> None:
    cache_dir = tmp_path / "cache"
    if stored is not None:
        Cache(cache_dir, ram_limit=stored).close()  # a cap from an earlier run (old code named it)
    res = run_rq(
        "preload", str(_source(tmp_path)), "--tier", "ram", "--ram-limit", "300K", "--workers", "1",
        "--cache-dir", str(cache_dir), "--json",
    )  # fmt: skip
    err = res.stderr.decode()
    assert res.returncode == 7, err
    summary = json.loads(res.stdout.decode().splitlines()[-1])
    assert summary["failed"] == 2 and summary["demoted_own"] + summary["evicted_own"] >= 2, summary
    warning = next(line for line in err.splitlines() if "did not stay in the ram tier" in line)
    assert "ram tier's cap of 300.0 KiB" in warning, warning  # (old: 5.9 GiB / 1.0 MiB, the restored cap)
    with Cache(cache_dir) as c:  # the failed run kept no new cap
        assert c.caps["ram"] != 300 << 10
        if stored is not None:
            assert c.caps["ram"] == 1 << 20


def test_a_failed_ram_preload_names_its_cap_for_entries_left_on_disk(tmp_path: Path) -> None:
    src = _source(tmp_path)
    cache_dir = tmp_path / "cache"
    res = run_rq("preload", str(src), "--include", "a*", "--ram-limit", "1M", "--cache-dir", str(cache_dir))
    assert res.returncode == 0, res.stderr.decode()  # the small ones, in the disk tier; cap 1 MiB kept
    res = run_rq(
        "preload", str(src), "--tier", "ram", "--ram-limit", "300K", "--workers", "1",
        "--cache-dir", str(cache_dir),
    )  # fmt: skip
    err = res.stderr.decode()
    assert res.returncode == 7, err
    warning = next(line for line in err.splitlines() if "cached before this run are in the disk tier" in line)
    assert "RAM tier's cap of 300.0 KiB" in warning, warning  # (old: 1.0 MiB)
