"""In a versioned bucket a HEAD or GET names the version id (`;vid:` in the entry's version) and a
listing never does, so the same bytes had two versions: a copy `rq cache cat` landed was fetched
again by every `rq preload` (its listing's version differed), a copy a preload landed was fetched
again by every revalidating read, and d379f59/b621cda then dropped the current copy whenever that
needless fetch failed (dv). The same ETag and size are the same bytes (cache.origins.same_version).
Real SeaweedFS with versioning on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cachekit import payload

import cache.api
from cache import Cache
from cache import events as ev

pytestmark = pytest.mark.integration

SIZE = 4096


def _versioned(s3_client: Any, bucket: str) -> str:
    s3_client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3_client.put_object(Bucket=bucket, Key="d/x.bin", Body=payload(1, SIZE))
    return f"s3://{bucket}/d/x.bin"


def _no_fetch(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("fetched again")


def test_a_copy_a_read_landed_is_already_cached_for_preload(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path, ram_dir: Path
) -> None:
    url = _versioned(s3_client, bucket)
    root = tmp_path / "c"
    with Cache(root, ram_dir=ram_dir) as c, c.open(url) as fh:
        assert fh.read() == payload(1, SIZE)
    with Cache(root, ram_dir=ram_dir) as c:
        assert ";vid:" in c.entries()[0].version  # the read's HEAD named the version id
        result = c.preload([f"s3://{bucket}/d/"])
    assert (result.skipped, result.objects) == (1, 0), result


def test_a_copy_a_preload_landed_is_current_for_a_revalidating_read(
    s3_client: Any,
    bucket: str,
    aws_env: dict[str, str],
    tmp_path: Path,
    ram_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = _versioned(s3_client, bucket)
    root = tmp_path / "c"
    with Cache(root, ram_dir=ram_dir) as c:
        c.preload([f"s3://{bucket}/d/"])
        assert ";vid:" not in c.entries()[0].version  # a listing names none
    events: list[ev.Event] = []
    monkeypatch.setattr(cache.api.Cache, "_open_fetched", _no_fetch)
    with Cache(root, ram_dir=ram_dir, max_age=0, on_event=events.append) as c, c.open(url) as fh:
        assert fh.read() == payload(1, SIZE)
    assert not [e for e in events if isinstance(e, ev.ServedStale)]
