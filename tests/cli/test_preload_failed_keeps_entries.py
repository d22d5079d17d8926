"""`rq preload` with a lowered --disk-limit/--ram-limit whose source is a typo fails and keeps the
cache as it was: the lowered cap used to evict every entry before the listing failed, and only
the cap was put back (restore_limits), not the entries."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from rqtest import run_rq

from cache import Cache

pytestmark = pytest.mark.integration


def _entries(cache_dir: Path) -> list[tuple[str, str]]:
    """(tier, url) of each entry: a lowered RAM cap demotes to disk rather than evicting."""
    res = run_rq("cache", "ls", "--json", "--cache-dir", str(cache_dir))
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines() if b'"url"' in line]
    return sorted((str(row["tier"]), str(row["url"])) for row in rows)


@pytest.mark.parametrize("missing", ["dir", "s3"])
@pytest.mark.parametrize("flag", ["--disk-limit", "--ram-limit"])
def test_a_failed_preload_with_a_lowered_cap_evicts_nothing(
    tmp_path: Path, aws_env: dict[str, str], s3_client: Any, bucket: str, missing: str, flag: str
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 4000)
    ram = Path("/dev/shm") / f"rqtest-{uuid.uuid4().hex[:10]}"
    cache_dir = tmp_path / "c"
    Cache(cache_dir, ram_dir=ram).close()
    try:
        tier = "ram" if flag == "--ram-limit" else "disk"
        res = run_rq("preload", str(src), "--tier", tier, "--cache-dir", str(cache_dir), "-q")
        assert res.returncode == 0, res.stderr
        before = _entries(cache_dir)
        assert len(before) == 3
        typo = str(tmp_path / "no-such-dir") if missing == "dir" else f"s3://{bucket}-typo/x/"
        res = run_rq(
            "preload", typo, "--tier", tier, "--cache-dir", str(cache_dir), flag, "1000", env=aws_env
        )
        assert res.returncode == 3, res.stderr
        assert _entries(cache_dir) == before  # (old code: [] for disk, all three demoted for RAM)
    finally:
        shutil.rmtree(ram, ignore_errors=True)
