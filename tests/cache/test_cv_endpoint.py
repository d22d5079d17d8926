"""The cache was keyed by URL alone: an object read from a staging endpoint was served for the same
s3:// URL read at prod (AWS_ENDPOINT_URL) for up to max_age, no HEAD being made within it. Each
s3:// entry now records the endpoint it was fetched from or last confirmed at (a nullable column,
added in place: an index of version 1 made before it keeps working, and an rq before it still reads
and writes it); an entry from another endpoint is revalidated (same version: served and this
endpoint recorded; another: fetched). Real SeaweedFS under two names: 127.0.0.1 and localhost."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cache import Cache
from cache import events as ev
from cache.index import Index

pytestmark = pytest.mark.integration


def _endpoints(services: Any) -> tuple[str, str]:
    one = services.s3_endpoint
    assert "127.0.0.1" in one
    return one, one.replace("127.0.0.1", "localhost")


def _cached_from(s3_client: Any, bucket: str, root: Path, ram_dir: Path, endpoint: str, body: bytes) -> str:
    """s3://BUCKET/k.bin holding `body`, read into the cache at `root` through `endpoint`."""
    url = f"s3://{bucket}/k.bin"
    s3_client.put_object(Bucket=bucket, Key="k.bin", Body=body)
    with Cache(root, ram_dir=ram_dir, endpoint_url=endpoint) as c:
        c.read_bytes(url)
    return url


def test_an_entry_from_another_endpoint_is_not_served_as_this_ones(
    s3_client: Any, bucket: str, aws_env: dict[str, str], services: Any, tmp_path: Path, ram_dir: Path
) -> None:
    staging, prod = _endpoints(services)
    url = f"s3://{bucket}/k.bin"
    s3_client.put_object(Bucket=bucket, Key="k.bin", Body=b"staging bytes")
    root = tmp_path / "c"
    with Cache(root, ram_dir=ram_dir, endpoint_url=staging) as c:
        assert c.read_bytes(url) == b"staging bytes"
        assert c.stat(url).endpoint == staging
    s3_client.put_object(Bucket=bucket, Key="k.bin", Body=b"prod bytes")  # what "prod" holds now
    with Cache(root, endpoint_url=prod) as c:
        assert c.read_bytes(url) == b"prod bytes"  # (was b"staging bytes" for up to 60 s)
        assert c.stat(url).endpoint == prod
    # the same version at the other endpoint: served as cached, that endpoint recorded (a HEAD)
    with Cache(root, endpoint_url=staging) as c:
        assert c.read_bytes(url) == b"prod bytes"
        assert c.stat(url).endpoint == staging
    # the endpoint from the environment, as `rq cache cat` reads it; `rq cache stat` shows it
    env = {**aws_env, "AWS_ENDPOINT_URL": prod}
    s3_client.put_object(Bucket=bucket, Key="k.bin", Body=b"prod bytes 2")
    cli = [sys.executable, "-m", "rqcli", "cache"]
    out = subprocess.run(
        [*cli, "cat", "--cache-dir", str(root), url], env=env, capture_output=True, check=False
    )
    assert out.returncode == 0 and out.stdout == b"prod bytes 2", out.stderr
    out = subprocess.run(
        [*cli, "stat", "--cache-dir", str(root), url], env=env, capture_output=True, text=True, check=False
    )
    assert f"endpoint     {prod}" in out.stdout, out.stdout


def test_a_copy_from_another_endpoint_served_unchecked_says_where_it_came_from(
    s3_client: Any, bucket: str, aws_env: dict[str, str], services: Any, tmp_path: Path, ram_dir: Path
) -> None:
    staging, _ = _endpoints(services)
    root = tmp_path / "c"
    url = _cached_from(s3_client, bucket, root, ram_dir, staging, b"staging bytes")
    events: list[Any] = []
    with Cache(root, endpoint_url="http://127.0.0.1:9", on_event=events.append) as c:
        assert c.read_bytes(url) == b"staging bytes"  # (as any copy whose store cannot be asked)
    stale = [e for e in events if isinstance(e, ev.ServedStale)]
    assert len(stale) == 1 and f"cached from {staging}, and http://127.0.0.1:9 could not" in stale[0].reason


def test_an_index_made_before_the_column_gets_it_and_old_rows_are_revalidated(
    s3_client: Any, bucket: str, aws_env: dict[str, str], services: Any, tmp_path: Path, ram_dir: Path
) -> None:
    staging, prod = _endpoints(services)
    root = tmp_path / "c"
    url = _cached_from(s3_client, bucket, root, ram_dir, staging, b"one")
    # the index as the rq before this change left it: no endpoint column, user_version 1
    db = sqlite3.connect(root / "index.sqlite3")
    db.execute("ALTER TABLE entries DROP COLUMN endpoint")
    db.commit()
    db.close()
    s3_client.put_object(Bucket=bucket, Key="k.bin", Body=b"two")
    events: list[Any] = []
    with Cache(root, endpoint_url="http://127.0.0.1:9", on_event=events.append) as c:
        assert c.stat(url).endpoint is None  # (not known: landed by an rq that did not record it)
        # fresh within max_age, as before: no HEAD (asking at once made every such hit wait on
        # the store, 30 s where it was silent: dr6), so nothing stale is said either
        assert c.read_bytes(url) == b"one"
    assert not [e for e in events if isinstance(e, ev.ServedStale)], events
    with Cache(root, endpoint_url=prod, max_age=0) as c:
        assert c.read_bytes(url) == b"two"  # its next check records the endpoint
        assert c.stat(url).endpoint == prod
    db = sqlite3.connect(root / "index.sqlite3")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1  # an older rq still opens it
    # what an older rq's landing writes (its own columns, by name) still goes in: NULL endpoint
    cols = "url, version, size, tier, blob, xxh3, verified_by, pinned, last_access, checked_at, created"
    db.execute(f"INSERT INTO entries ({cols}) VALUES ('s3://b/x', 'v', 1, 'disk', 'x', 'h', 'x', 0, 0, 0, 0)")
    db.commit()
    db.close()
    index = Index(root / "index.sqlite3")
    entry = index.get("s3://b/x")
    assert entry is not None and entry.endpoint is None
    index.close()


def test_one_endpoint_spelled_two_ways_is_one_endpoint(
    s3_client: Any, bucket: str, aws_env: dict[str, str], services: Any, tmp_path: Path, ram_dir: Path
) -> None:
    """dr6: `http://h:p` and `http://h:p/` were two endpoints: two processes spelling it apart
    re-recorded an entry back and forth, a HEAD each time."""
    from cache.s3 import canonical_endpoint

    assert canonical_endpoint("HTTP://LocalHost:80/") == "http://localhost"
    assert canonical_endpoint("https://h:443/base/") == "https://h/base"
    assert canonical_endpoint("http://[::1]:18333/") == "http://[::1]:18333"
    staging, _ = _endpoints(services)
    url = f"s3://{bucket}/k.bin"
    s3_client.put_object(Bucket=bucket, Key="k.bin", Body=b"bytes")
    root = tmp_path / "c"
    with Cache(root, ram_dir=ram_dir, endpoint_url=staging + "/") as c:
        c.read_bytes(url)
        assert c.stat(url).endpoint == staging
    with Cache(root, endpoint_url=staging.upper().replace("HTTP:", "http:")) as c:
        assert not c._stale(c.stat(url))  # the same store: fresh within max_age, no HEAD
