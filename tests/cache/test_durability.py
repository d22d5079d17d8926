"""Batch durability in preload: one syncfs per landing batch before any final name appears, and the
per-file fsync fallback where syncfs is missing. Both must land every object verified, index after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cachekit import payload, seed_objects

from cache import Cache, store

pytestmark = pytest.mark.integration


def _preload_and_check(bucket: str, tmp_path: Path, ram_dir: Path, n: int, size: int) -> None:
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    result = c.preload([f"s3://{bucket}/d/"], tier="disk")
    assert result.objects == n and not result.failed
    for i in range(n):
        assert c.path(f"s3://{bucket}/d/{i:05d}.bin").read_bytes() == payload(i, size)
    checked, problems = c.verify()
    assert checked == n and problems == []
    assert not any((tmp_path / "c" / "tmp").iterdir())  # every temp file published or removed
    c.close()


def test_batch_publish_with_syncfs(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path, ram_dir: Path, monkeypatch: Any
) -> None:
    seed_objects(s3_client, bucket, "d/", 150, 8 * 1024)  # more than two landing batches of 64
    calls: list[Path] = []
    real = store.syncfs

    def counting(path: Path, held: int = -1) -> bool:
        calls.append(path)
        return real(path, held)

    monkeypatch.setattr("cache.fetcher.syncfs", counting)
    _preload_and_check(bucket, tmp_path, ram_dir, 150, 8 * 1024)
    assert 2 <= len(calls) <= 2 * 150  # batched: before publishing and after, per landing batch


def test_batch_publish_falls_back_to_fsync_without_syncfs(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path, ram_dir: Path, monkeypatch: Any
) -> None:
    seed_objects(s3_client, bucket, "d/", 70, 8 * 1024)
    monkeypatch.setattr(store, "_syncfs", False)  # as on a libc without syncfs
    _preload_and_check(bucket, tmp_path, ram_dir, 70, 8 * 1024)
