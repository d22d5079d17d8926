"""`rq preload` and `rq cache …` against the real SeaweedFS of scripts/services.sh."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from cachekit import payload, seed_objects, summary, tree_files
from rqtest import run_rq

pytestmark = pytest.mark.integration


def test_preload_end_to_end_then_rerun_skips(s3_client: Any, bucket: str, cache_env: dict[str, str]) -> None:
    data = seed_objects(s3_client, bucket, "data/", 40, 32 * 1024)
    first = run_rq("preload", f"s3://{bucket}/data/", "--json", env=cache_env)
    assert first.returncode == 0, first.stderr
    s = summary(first)
    assert (s["objects"], s["bytes"], s["skipped"], s["failed"]) == (40, 40 * 32 * 1024, 0, 0)

    again = run_rq("preload", f"s3://{bucket}/data/", "--json", env=cache_env)
    assert again.returncode == 0
    assert (summary(again)["objects"], summary(again)["skipped"]) == (0, 40)

    verify = run_rq("cache", "verify", "--json", env=cache_env)
    assert verify.returncode == 0, verify.stderr
    assert summary(verify)["checked"] == 40 and summary(verify)["corrupt"] == 0

    from cache import Cache

    cache_dir = Path(cache_env["RQ_CACHE_DIR"])
    with Cache(cache_dir) as c:
        for key, body in data.items():
            with c.open(f"s3://{bucket}/{key}") as fh:
                assert fh.read() == body
        entry = c.stat(f"s3://{bucket}/data/00003.bin")
        assert entry.verified_by in ("size+crc32", "size+md5")
        assert entry.tier == "disk"

    ls = run_rq("cache", "ls", "--json", f"s3://{bucket}/data/", env=cache_env)
    assert len(ls.stdout.splitlines()) == 40
    du = json.loads(run_rq("cache", "du", "--json", env=cache_env).stdout)
    assert du["disk"]["objects"] == 40 and du["disk"]["bytes"] == 40 * 32 * 1024 and du["disk"]["held"] == 0
    cat = run_rq("cache", "cat", f"s3://{bucket}/data/00007.bin", env=cache_env)
    assert cat.returncode == 0 and cat.stdout == data["data/00007.bin"]
    where = Path(
        run_rq("cache", "path", f"s3://{bucket}/data/00007.bin", env=cache_env).stdout.decode().strip()
    )
    assert where.read_bytes() == data["data/00007.bin"]
    assert cache_dir in where.parents
    # the layout is what docs/cache.md says: one file per entry under objects/, nothing left in tmp/
    assert len(tree_files(cache_dir / "objects")) == 40
    assert tree_files(cache_dir / "tmp") == {}


def test_include_exclude_and_dry_run(s3_client: Any, bucket: str, cache_env: dict[str, str]) -> None:
    for name in ("a/1.tar", "a/2.tar", "a/3.json", "b/4.tar"):
        s3_client.put_object(Bucket=bucket, Key=f"set/{name}", Body=name.encode())
    dry = run_rq(
        "preload",
        f"s3://{bucket}/set/",
        "--include",
        "*.tar",
        "--exclude",
        "b/*",
        "--dry-run",
        "--json",
        env=cache_env,
    )
    assert dry.returncode == 0, dry.stderr
    planned = [json.loads(x)["url"] for x in dry.stdout.splitlines() if json.loads(x).get("event") == "plan"]
    assert sorted(planned) == [f"s3://{bucket}/set/a/1.tar", f"s3://{bucket}/set/a/2.tar"]
    assert json.loads(run_rq("cache", "du", "--json", env=cache_env).stdout)["disk"]["objects"] == 0
    real = run_rq(
        "preload", f"s3://{bucket}/set/", "--include", "*.tar", "--exclude", "b/*", "--json", env=cache_env
    )
    assert summary(real)["objects"] == 2


def test_changed_object_is_refetched_never_served_stale(
    s3_client: Any, bucket: str, cache_env: dict[str, str]
) -> None:
    seed_objects(s3_client, bucket, "v/", 5, 4096)
    assert run_rq("preload", f"s3://{bucket}/v/", env=cache_env).returncode == 0
    s3_client.put_object(Bucket=bucket, Key="v/00002.bin", Body=b"new content")
    rerun = run_rq("preload", f"s3://{bucket}/v/", "--json", env=cache_env)
    assert (summary(rerun)["objects"], summary(rerun)["skipped"]) == (1, 4)
    from cache import Cache

    cache_dir = Path(cache_env["RQ_CACHE_DIR"])
    with Cache(cache_dir, max_age=0) as c:
        assert c.read_bytes(f"s3://{bucket}/v/00002.bin") == b"new content"
        # changed behind our back, no preload in between: open() revalidates (max_age=0) and refetches
        s3_client.put_object(Bucket=bucket, Key="v/00003.bin", Body=b"newer")
        assert c.read_bytes(f"s3://{bucket}/v/00003.bin") == b"newer"
    assert len(tree_files(cache_dir / "objects")) == 5  # superseded versions were removed


def test_clear_errors_with_documented_exit_codes(
    s3_client: Any, bucket: str, cache_env: dict[str, str], tmp_path: Path
) -> None:
    s3_client.put_object(Bucket=bucket, Key="k/x", Body=b"x")
    cases = [
        (("preload", f"s3://{bucket}-nope/k/"), 3, "bucket not found"),
        (("preload", f"s3://{bucket}/absent/"), 3, "no objects"),
        (("cache", "cat", f"s3://{bucket}/k/missing"), 3, "not found"),
        (("preload", "ftp://x/y"), 2, "unsupported"),
        (("preload", str(tmp_path / "no-such-dir")), 3, "not found"),
        (("preload", f"s3://{bucket}/k/", "--endpoint-url", "http://127.0.0.1:9"), 6, "cannot reach"),
    ]
    for args, code, words in cases:
        proc = run_rq(*args, env=cache_env)
        err = proc.stderr.decode()
        assert proc.returncode == code, (args, err)
        assert len(err.strip().splitlines()) == 1 and words in err, (args, err)
        assert "Traceback" not in err
    bad = run_rq("preload", f"s3://{bucket}/k/", env={**cache_env, "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert bad.returncode == 4 and len(bad.stderr.decode().strip().splitlines()) == 1


@pytest.mark.slow
def test_big_object_fetched_in_verified_pieces(
    s3_client: Any, bucket: str, cache_env: dict[str, str]
) -> None:
    from cache.digests import BIG_OBJECT

    body = (payload(7, 1 << 20) * (BIG_OBJECT // (1 << 20) + 6))[: BIG_OBJECT + 5 * (1 << 20) + 3]
    s3_client.upload_fileobj(io.BytesIO(body), bucket, "big/shard.bin")  # multipart: composite CRC32
    proc = run_rq("preload", f"s3://{bucket}/big/", "--json", env=cache_env)
    assert proc.returncode == 0, proc.stderr
    from cache import Cache

    with Cache(Path(cache_env["RQ_CACHE_DIR"])) as c:
        entry = c.stat(f"s3://{bucket}/big/shard.bin")
        assert entry.verified_by == "size+crc32-composite"
        assert entry.xxh3.startswith("p:")
        with c.open(f"s3://{bucket}/big/shard.bin") as fh:
            assert hashlib.sha256(fh.read()).digest() == hashlib.sha256(body).digest()


@pytest.mark.slow
def test_a_big_object_missing_from_the_cache_is_read_through(
    s3_client: Any, bucket: str, cache_env: dict[str, str]
) -> None:
    # Cache.open's own miss of a big object: the landing holds the partial's exclusive lock until
    # it publishes, and the reader's shared lock was taken on a second descriptor under it (hung)
    from cache.digests import BIG_OBJECT

    body = (payload(9, 1 << 20) * (BIG_OBJECT // (1 << 20) + 2))[: BIG_OBJECT + (1 << 20) + 7]
    s3_client.upload_fileobj(io.BytesIO(body), bucket, "big/miss.bin")
    proc = run_rq("cache", "cat", f"s3://{bucket}/big/miss.bin", env=cache_env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert hashlib.sha256(proc.stdout).digest() == hashlib.sha256(body).digest()
    listing = run_rq("cache", "ls", "--json", env=cache_env)
    assert f"s3://{bucket}/big/miss.bin" in listing.stdout.decode()


def test_local_directory_origin(tmp_path: Path, cache_env: dict[str, str]) -> None:
    src = tmp_path / "dataset"
    (src / "nested").mkdir(parents=True)
    for i in range(6):
        (src / ("nested" if i % 2 else "") / f"f{i}.bin").write_bytes(payload(i, 10_000 + i))
    proc = run_rq("preload", str(src), "--json", env=cache_env)
    assert proc.returncode == 0, proc.stderr
    assert summary(proc)["objects"] == 6
    from cache import Cache

    target = src / "nested" / "f1.bin"
    with Cache(Path(cache_env["RQ_CACHE_DIR"])) as c:
        assert c.read_bytes(str(target)) == payload(1, 10_001)
        assert c.stat(str(target)).verified_by == "size+mtime"
        target.write_bytes(b"edited")  # a directory origin is re-stat'ed on every open
        os.utime(target, ns=(1, 1))
        assert c.read_bytes(str(target)) == b"edited"


def test_hostile_keys_stay_inside_the_cache(
    s3_client: Any, bucket: str, cache_env: dict[str, str], tmp_path: Path
) -> None:
    keys = [
        "h/../../escape.bin",
        "h/a/../../../b.bin",
        "h/..",
        "h/" + "x" * 240 + ".bin",
        "h/" + "/".join(["deep"] * 60) + "/f",
        "h/new\nline\ttab\x01.bin",
        "h/日本語/ключ.bin",
        "h/sp ace & plus+%25 ?#.bin",
        "h/.hidden",
        "h/\\back\\slash",
    ]
    stored = {}
    for k in keys:
        try:
            s3_client.put_object(Bucket=bucket, Key=k, Body=k.encode())
        except Exception:
            continue  # the store refused this key; nothing to cache then
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="h/"):
        for obj in page.get("Contents", []):
            stored[obj["Key"]] = s3_client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    try:
        assert len(stored) >= 7, stored.keys()  # SeaweedFS itself refuses `..` keys
        before = set(os.listdir(tmp_path))
        proc = run_rq("preload", f"s3://{bucket}/h/", "--json", env=cache_env)
        assert proc.returncode == 0, proc.stderr
        assert summary(proc)["objects"] == len(stored)
        assert set(os.listdir(tmp_path)) == before  # nothing appeared beside the cache dir
        cache_dir = Path(cache_env["RQ_CACHE_DIR"]).resolve()
        for path in tree_files(cache_dir):
            assert Path(path).resolve().is_relative_to(cache_dir)
        from cache import Cache

        with Cache(cache_dir) as c:
            for key, body in stored.items():
                assert c.read_bytes(f"s3://{bucket}/{key}") == body
    finally:
        for key in stored:  # one by one: DeleteObjects XML cannot carry control characters
            s3_client.delete_object(Bucket=bucket, Key=key)
