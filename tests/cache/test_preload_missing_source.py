"""`rq preload` of a source that is not there (a missing bucket or directory, an empty prefix) exits
3 as before, but creates no cache for it: no cache dir, no RAM root in /dev/shm (as a bad URL
already creates nothing). A cache that exists is used as it is."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from cachekit import payload
from rqtest import run_rq

from cache.layout import INDEX_NAME, default_ram_root

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", ["missing-bucket", "empty-prefix", "missing-dir", "two-sources"])
def test_a_missing_source_creates_no_cache(
    kind: str, tmp_path: Path, aws_env: dict[str, str], s3_client: Any, bucket: str
) -> None:
    s3_client.put_object(Bucket=bucket, Key="there/a.bin", Body=payload(1, 1000))
    source = {
        "missing-bucket": [f"s3://rqtest-missing-{uuid.uuid4().hex[:10]}/x/"],
        "empty-prefix": [f"s3://{bucket}/nothing-here/"],
        "missing-dir": [str(tmp_path / "no-such-dir")],
        "two-sources": [f"s3://{bucket}/there/", str(tmp_path / "no-such-dir")],  # the last one's typo
    }[kind]
    cache_dir = tmp_path / "cache"
    ram_root = default_ram_root(cache_dir.absolute())
    assert not ram_root.exists()
    proc = run_rq("preload", *source, "--cache-dir", str(cache_dir), "--json", env=aws_env)
    assert proc.returncode == 3, proc.stderr.decode()
    assert len(proc.stderr.decode().strip().splitlines()) == 1
    summary = json.loads(proc.stdout.decode().splitlines()[-1])
    assert summary["aborted"] is True and summary["objects"] == 0
    assert not cache_dir.exists()
    assert not ram_root.exists()


def test_an_existing_cache_still_reports_a_missing_source(
    tmp_path: Path, aws_env: dict[str, str], s3_client: Any, bucket: str, ram_dir: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="there/a.bin", Body=payload(1, 1000))
    cache_dir = tmp_path / "cache"
    from cache import Cache

    Cache(cache_dir, ram_dir=ram_dir).close()
    proc = run_rq("preload", f"s3://{bucket}/nothing/", "--cache-dir", str(cache_dir), env=aws_env)
    assert proc.returncode == 3 and b"no objects under" in proc.stderr
    proc = run_rq("preload", f"s3://{bucket}/there/", "--cache-dir", str(cache_dir), env=aws_env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert (cache_dir / INDEX_NAME).exists()


def test_a_new_cache_is_made_once_the_source_listed_something(
    tmp_path: Path, aws_env: dict[str, str], s3_client: Any, bucket: str
) -> None:
    for i in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"there/{i}.bin", Body=payload(i, 1000))
    cache_dir = tmp_path / "cache"
    proc = run_rq("preload", f"s3://{bucket}/there/", "--cache-dir", str(cache_dir), "--json", env=aws_env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout.decode().splitlines()[-1])["objects"] == 3


def test_the_first_page_waited_for_is_left_to_the_listing(
    aws_env: dict[str, str], services: Any, s3_client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cache.s3 import Listing, S3Settings, shared_client

    monkeypatch.setattr(Listing, "page_size", 2)
    keys = [f"p/{i}.bin" for i in range(5)]
    for key in keys:
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"x")
    client = shared_client(S3Settings(endpoint_url=services.s3_endpoint))
    first = client.first_listing_page(bucket, "p/")
    assert [key for key, *_ in first[0]] == keys[:2] and first[1:] == (None, False)
    assert client.first_listing_page(bucket, "p/") == first  # asked twice: still the same page
    assert [key for key, *_ in client.list_objects(bucket, "p/")] == keys
    assert client.first_listing_page(bucket, "q/") == ([], None, True)
    missing = client.first_listing_page(f"{bucket}-missing", "p/")
    assert missing[0] == [] and "not found" in str(missing[1])
