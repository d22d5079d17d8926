"""Cache.prefetch promotes entries cached on disk into RAM by copying the disk file. When that copy
is gone or damaged by the time it is read (evicted by another process, deleted, corrupted), the
prefetch fetches the object from its origin instead, as `Cache.open` and `rq preload --tier ram`
do; it used to record an error and leave the item cold."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cachekit import payload, seed_objects

from cache import Cache

KIB = 1 << 10


def _damage(path: Path) -> None:
    os.chmod(path, 0o600)
    with open(path, "r+b") as f:
        f.write(b"\0" * 16)


@pytest.mark.parametrize("how", ["gone", "damaged"])
def test_a_prefetch_promotion_whose_disk_copy_is_lost_fetches_from_the_origin(
    tmp_path: Path, ram_dir: Path, how: str
) -> None:
    origin = tmp_path / "origin"
    origin.mkdir()
    for i in range(3):
        (origin / f"f{i}").write_bytes(os.urandom(64 * KIB))
    urls = [str(origin / f"f{i}") for i in range(3)]
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    c.preload([str(origin)])  # all three on disk
    blob = c.path(urls[1])
    if how == "gone":
        blob.unlink()
    else:
        _damage(blob)
    pre = c.prefetch(urls, ahead=3)
    assert pre.wait_warm(5), pre.errors
    assert pre.errors == []
    for url in urls:
        entry = c.stat(url)
        assert entry.tier == "ram"
        assert c.path(url).read_bytes() == Path(url).read_bytes()
    assert c.usage()["disk"]["bytes"] == 0  # the disk copies (the damaged one too) went
    assert c.verify() == (3, [])
    c.close()


@pytest.mark.integration
def test_an_s3_prefetch_promotion_falls_back_to_the_store(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path, ram_dir: Path
) -> None:
    seed_objects(s3_client, bucket, "pf/", 3, 32 * KIB)
    urls = [f"s3://{bucket}/pf/{i:05d}.bin" for i in range(3)]
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    c.preload([f"s3://{bucket}/pf/"])
    c.path(urls[0]).unlink()
    _damage(c.path(urls[2]))
    pre = c.prefetch(urls, ahead=3)
    assert pre.wait_warm(5), pre.errors
    assert pre.errors == []
    for i, url in enumerate(urls):
        assert c.stat(url).tier == "ram"
        with c.open(url) as fh:
            assert fh.read() == payload(i, 32 * KIB)
    c.close()
