"""The Python read API: forked DataLoader-style workers, prefetch into RAM, demotion, leases."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
from cachekit import payload, seed_objects

from cache import Cache

pytestmark = pytest.mark.integration


def _read_in_worker(args: tuple[Cache, str, int, int]) -> bool:
    cache, url, i, size = args
    with cache.open(url) as fh:
        return fh.read() == payload(i, size) and os.getpid() != 0


def test_open_in_forked_worker_processes(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path, ram_dir: Path
) -> None:
    seed_objects(s3_client, bucket, "w/", 24, 16 * 1024)
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    c.preload([f"s3://{bucket}/w/"], include=["0000*"])  # some hits, the rest misses in the workers
    urls = [(c, f"s3://{bucket}/w/{i:05d}.bin", i, 16 * 1024) for i in range(24)]
    with multiprocessing.get_context("fork").Pool(3) as pool:
        assert all(pool.map(_read_in_worker, urls))
    with multiprocessing.get_context("spawn").Pool(2) as pool:  # pickled Cache, fresh interpreter
        assert all(pool.map(_read_in_worker, urls[:6]))
    assert len(c.entries()) == 24
    c.close()


def test_prefetch_keeps_the_next_items_in_ram(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path, ram_dir: Path
) -> None:
    seed_objects(s3_client, bucket, "e/", 20, 8 * 1024)
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    c.preload([f"s3://{bucket}/e/"], include=["0000*"])  # 10 on disk, 10 only at the origin
    order = [f"s3://{bucket}/e/{i:05d}.bin" for i in (3, 12, 7, 15, 0, 19, 4, 11)]
    pre = c.prefetch(order, ahead=4)
    assert pre.wait_warm(30)
    tiers = {e.url: e.tier for e in c.entries()}
    assert [tiers.get(u) for u in order[:4]] == ["ram"] * 4  # promoted from disk or fetched
    for i, url in enumerate(order):
        with c.open(url) as fh:
            assert fh.read() == payload(int(url[-9:-4]), 8 * 1024)
        if i == 3:
            assert pre.wait_warm(30)
            tiers = {e.url: e.tier for e in c.entries()}
            assert all(tiers.get(u) == "ram" for u in order[3:7])
    assert pre.errors == []
    c.close()


def test_ram_evictions_demote_to_disk_and_disk_drops(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path, ram_dir: Path
) -> None:
    data = seed_objects(s3_client, bucket, "m/", 9, 32 * 1024)
    c = Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit=96 * 1024, disk_limit=128 * 1024)
    result = c.preload([f"s3://{bucket}/m/"], tier="ram")
    assert result.objects == 9 and not result.failed
    usage = c.usage()
    assert usage["ram"]["bytes"] <= 96 * 1024 and usage["disk"]["bytes"] <= 128 * 1024
    assert usage["ram"]["objects"] >= 1 and usage["disk"]["objects"] >= 1  # demoted, not only dropped
    assert usage["ram"]["objects"] + usage["disk"]["objects"] < 9  # the oldest dropped (origin has them)
    for key, body in data.items():  # every one still readable: hit, or fetched again
        assert c.read_bytes(f"s3://{bucket}/{key}") == body
    assert c.verify()[1] == []
    c.close()


def test_an_open_entry_is_never_evicted(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path, ram_dir: Path, monkeypatch: Any
) -> None:
    import cache.api

    seed_objects(s3_client, bucket, "o/", 2, 4096)
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    c.preload([f"s3://{bucket}/o/"])
    monkeypatch.setattr(cache.api, "SMALL_READ", 0)  # return a real file holding the lease
    url = f"s3://{bucket}/o/00000.bin"
    fh = c.open(url)
    assert c.evict(url) == (0, 1)  # kept: a reader has it open
    assert fh.read() == payload(0, 4096)
    fh.close()
    assert c.evict(url) == (1, 0)
    c.close()


def test_hit_path_verifies_and_does_not_touch_the_origin(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path, ram_dir: Path, monkeypatch: Any
) -> None:
    seed_objects(s3_client, bucket, "h/", 1, 1 << 20)
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    c.preload([f"s3://{bucket}/h/"], tier="ram")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # any origin call would now fail
    c2 = Cache(tmp_path / "c")
    for _ in range(50):
        assert len(c2.read_bytes(f"s3://{bucket}/h/00000.bin")) == 1 << 20
    c2.close()
    c.close()
