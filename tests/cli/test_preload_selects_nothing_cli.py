"""`rq preload SRC --include PATTERN` that selects nothing exits 3 and makes no cache (no cache dir,
no RAM root), as a missing source does; an existing cache is used as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rqtest import run_rq

from cache.layout import default_ram_root

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", ["dir", "s3"])
def test_filters_that_select_nothing_make_no_cache(
    kind: str, tmp_path: Path, aws_env: dict[str, str], s3_client: Any, bucket: str
) -> None:
    (tmp_path / "src").mkdir()
    for i in range(3):
        (tmp_path / "src" / f"f{i}.tar").write_bytes(b"x" * 100)
        s3_client.put_object(Bucket=bucket, Key=f"src/f{i}.tar", Body=b"x" * 100)
    source = str(tmp_path / "src") if kind == "dir" else f"s3://{bucket}/src/"
    cache_dir = tmp_path / "cache"
    ram_root = default_ram_root(cache_dir.absolute())
    proc = run_rq(
        "preload", source, "--include", "*.zip", "--cache-dir", str(cache_dir), "--json", env=aws_env
    )
    assert proc.returncode == 3, proc.stderr.decode()
    assert b"none of the 3 objects listed matches" in proc.stderr
    summary = json.loads(proc.stdout.decode().splitlines()[-1])
    assert summary["aborted"] is True and summary["objects"] == 0
    assert not cache_dir.exists()
    assert not ram_root.exists()
    proc = run_rq(
        "preload", source, "--include", "*.tar", "--cache-dir", str(cache_dir), "--json", env=aws_env
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout.decode().splitlines()[-1])["objects"] == 3
