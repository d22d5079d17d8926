"""Edge cases found by reviews: repeated slashes in an S3 prefix, caps kept by failed runs, unusable
RAM directories, the library's RAM path, holds of killed readers, the --json field names."""

from __future__ import annotations

import json
from typing import Any

from cachekit import summary
from rqtest import run_rq


def test_double_slash_prefix_is_relative_to_what_the_store_lists(
    s3_client: Any, bucket: str, cache_env: dict[str, str]
) -> None:
    """SeaweedFS lists `d/x` for the prefix `d//`: the key is kept as listed (one entry per object,
    never a rewritten key), and --include matches it relative to the prefix (`x`), as under `d/`."""
    s3_client.put_object(Bucket=bucket, Key="d/x", Body=b"x" * 10)
    s3_client.put_object(Bucket=bucket, Key="d/y", Body=b"y" * 10)
    listed = {o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="d//").get("Contents", [])}
    proc = run_rq("preload", f"s3://{bucket}/d//", "--include", "x", "--json", env=cache_env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert summary(proc)["objects"] == 1
    # then the same object under the single-slash URL is already cached: one entry, not two
    again = run_rq("preload", f"s3://{bucket}/d/", "--include", "x", "--json", env=cache_env)
    assert again.returncode == 0, again.stderr.decode()
    entries = [
        json.loads(x)["url"] for x in run_rq("cache", "ls", "--json", env=cache_env).stdout.splitlines()
    ]
    if listed == {"d/x", "d/y"}:  # a store that merges the slashes (SeaweedFS)
        assert summary(again)["skipped"] == 1 and summary(again)["objects"] == 0
        assert entries == [f"s3://{bucket}/d/x"]
