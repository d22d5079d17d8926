"""The RAM root removed under a running process (a tmp cleaner, systemd's RemoveIPC, a container
restart): a Cache made it again only when it was opened, so every later RAM landing failed on the
missing tmp/ (review, 2026-11-23). Shown against the test S3 and the real /dev/shm."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from cache import Cache, orphans
from cache.errors import CacheError
from cache.fetcher import Fetcher, Job
from cache.origins import origin_for_url

BIG = 70 << 20  # over cache.digests.BIG_OBJECT: a ranged, resumable landing with a hold of its own


@pytest.fixture
def objects(bucket: str, s3_client: Any, aws_env: dict[str, str]) -> dict[str, bytes]:
    made = {}
    for name in ("a", "b", "c", "d"):
        data = os.urandom(3000)
        s3_client.put_object(Bucket=bucket, Key=name, Body=data)
        made[f"s3://{bucket}/{name}"] = data
    return made


def held(c: Cache, tier: str = "ram") -> int:
    return c.usage()[tier]["held"]


def test_a_ram_root_removed_under_a_running_cache_is_made_again(
    tmp_path: Path, ram_dir: Path, objects: dict[str, bytes]
) -> None:
    """Before: `CacheError [Errno 2] No such file or directory: '…/tmp/….part'` on every open of
    an entry in the RAM tier and on every RAM miss, for as long as the process lived."""
    a, b = list(objects)[:2]
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        with c.open(a, tier="ram") as fh:
            assert fh.read() == objects[a]
        shutil.rmtree(c.layout.ram_root)
        with c.open(a) as fh:  # a hit whose file went with the root: fetched again, into RAM
            assert fh.read() == objects[a]
        with c.open(b, tier="ram") as fh:  # a miss into the RAM tier
            assert fh.read() == objects[b]
        for url in (a, b):
            assert c.stat(url).tier == "ram" and c.path(url).is_file()
        assert ram_dir.stat().st_mode & 0o777 == 0o700  # made again as __init__ makes it
        assert c.usage()["ram"]["objects"] == 2 and held(c) == 0
        # `rq cache orphans` must see the new root in use: our lock was on the deleted one
        assert orphans._in_use(ram_dir)


def test_a_prefetch_into_a_removed_ram_root_warms_it_again(
    tmp_path: Path, ram_dir: Path, objects: dict[str, bytes]
) -> None:
    """Before: the prefetch thread failed every landing without a word (wait_warm False, errors
    empty), and the entries whose files were gone counted as warm."""
    urls = list(objects)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        with c.open(urls[0], tier="ram") as fh:
            fh.read()
        shutil.rmtree(c.layout.ram_root)
        pre = c.prefetch(urls, ahead=len(urls), tier="ram")
        assert pre.wait_warm(30), pre.errors
        assert pre.errors == []
        for url in urls:
            assert c.stat(url).tier == "ram" and c.path(url).read_bytes() == objects[url]


def test_a_big_object_into_a_removed_ram_root_lands_and_leaves_no_hold(tmp_path: Path, ram_dir: Path) -> None:
    """Before: a bare FileNotFoundError from the landing, and a 70 MiB hold of pid 0 that `rq
    cache du` counted as in flight until a clear."""
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "big", "wb") as fh:
        fh.truncate(BIG)  # sparse: no real bytes to write
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        shutil.rmtree(c.layout.ram_root)
        with c.open(str(src / "big"), tier="ram") as fh:
            assert sum(len(chunk) for chunk in iter(lambda: fh.read(8 << 20), b"")) == BIG
        assert c.stat(str(src / "big")).tier == "ram" and held(c) == 0


def test_a_landing_that_cannot_start_is_a_cache_error_and_keeps_no_hold(
    tmp_path: Path, ram_dir: Path
) -> None:
    """The fetcher on its own, the tier's RAM root gone between a check and the landing: one
    CacheError (it was a bare FileNotFoundError), and the hold it reserved released, not kept as
    if a partial file were there to resume. (A tmp/ gone alone is made again by the landing.)"""
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "big", "wb") as fh:
        fh.truncate(BIG)
    url = str(src / "big")
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        shutil.rmtree(c.layout.ram_root)
        origin = origin_for_url(url, c.s3_settings)
        fetcher = Fetcher(c._state().store, c.layout, "ram", 4)
        with pytest.raises(CacheError, match="could not start") as raised:
            fetcher.run([Job(origin.stat(url), origin)])
        assert not isinstance(raised.value, FileNotFoundError)
        assert held(c) == 0


def test_a_prefetch_reports_each_item_that_failed_alone(tmp_path: Path, ram_dir: Path) -> None:
    """Items the fetcher failed one by one (here a /proc file, uncacheable) were dropped without a
    word: `errors` stayed empty while the window never warmed."""
    real = tmp_path / "real"
    real.write_bytes(b"x" * 100)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        pre = c.prefetch(["/proc/self/status", str(real)], ahead=2, tier="ram")
        deadline = time.monotonic() + 30
        while not pre.errors and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any("/proc/self/status" in e and "/proc or /sys" in e for e in pre.errors), pre.errors
        assert pre.wait_warm(0) is False  # the /proc item never lands
        assert c.stat(str(real)).tier == "ram"
