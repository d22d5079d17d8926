"""`rq preload 's3://b/train/*.tar'` (what s5cmd users type first) lists the prefix "train/*.tar":
nothing, exit 3. A SOURCE is never a pattern; the one error line now says to use --include, with
the command to run, for a new cache and an existing one, S3 and directory sources alike. A source
with no wildcard keeps the old hint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rqtest import run_rq

from cache import Cache

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("cache", ["new", "existing"])
@pytest.mark.parametrize("kind", ["dir", "s3"])
def test_a_wildcard_in_source_says_to_use_include(
    kind: str, cache: str, tmp_path: Path, aws_env: dict[str, str], s3_client: Any, bucket: str
) -> None:
    (tmp_path / "train").mkdir()
    for i in range(2):
        (tmp_path / "train" / f"f{i}.tar").write_bytes(b"x" * 100)
        s3_client.put_object(Bucket=bucket, Key=f"train/f{i}.tar", Body=b"x" * 100)
    base = f"{tmp_path}/train/" if kind == "dir" else f"s3://{bucket}/train/"
    cache_dir = tmp_path / "cache"
    if cache == "existing":
        Cache(cache_dir).close()
    res = run_rq("preload", base + "*.tar", "--cache-dir", str(cache_dir), "--json", env=aws_env)
    err = res.stderr.decode()
    assert res.returncode == 3, err
    assert err.count("\n") == 1 and err.startswith("rq: error: "), err
    # (old: "… — check the bucket, prefix or path")
    assert f"use --include, e.g. `rq preload {base} --include '*.tar'`" in err, err
    summary = json.loads(res.stdout.decode().splitlines()[-1])
    assert summary["aborted"] is True and "--include" in summary["error"]
    # what the hint says to run fetches the two
    res = run_rq("preload", base, "--include", "*.tar", "--cache-dir", str(cache_dir), "--json", env=aws_env)
    assert res.returncode == 0, res.stderr.decode()
    assert json.loads(res.stdout.decode().splitlines()[-1])["objects"] == 2


def test_a_missing_source_without_a_wildcard_keeps_its_hint(tmp_path: Path) -> None:
    res = run_rq("preload", str(tmp_path / "no-such-dir"), "--cache-dir", str(tmp_path / "cache"))
    err = res.stderr.decode()
    assert res.returncode == 3, err
    assert "check the bucket, prefix or path" in err and "--include" not in err, err
