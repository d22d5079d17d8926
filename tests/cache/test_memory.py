"""rq preload's memory stays bounded with objects just under the ranged-GET size (real SeaweedFS)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cachekit import summary
from rqtest import rq_command

import cache.fetcher as fetcher_mod
from cache import Cache

MIB = 1 << 20
RSS_LIMIT_MIB = 512  # issue #3: peak RSS of rq preload


def peak_rss_mib(args: list[str], env: dict[str, str]) -> tuple[int, subprocess.CompletedProcess[bytes]]:
    """Runs one command under a wrapper whose only child it is; returns the child's peak RSS."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True)\n"
        "sys.stderr.buffer.write(p.stderr)\n"
        "sys.stdout.buffer.write(p.stdout)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
        "sys.exit(p.returncode)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", wrapper, *args], env=env, capture_output=True, timeout=300, check=False
    )
    rss_kib = int(proc.stderr.decode().strip().splitlines()[-1])
    return rss_kib // 1024, proc


def test_many_objects_just_under_the_ranged_size_stay_under_the_rss_limit(
    aws_env: dict[str, str], s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    # 24 x 40 MiB: the CRT holds each body in a buffer grown to 64 MiB; with 24 in flight at once
    # that was ~1.3 GiB of RSS before the fetcher bounded the bodies in flight
    blob = os.urandom(40 * MIB + 24)

    def put(i: int) -> None:
        s3_client.put_object(Bucket=bucket, Key=f"m/{i:02d}", Body=blob[i : i + 40 * MIB])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(put, range(24)))
    args = [*rq_command(), "preload", f"s3://{bucket}/m/", "--cache-dir", str(tmp_path / "c"), "--json"]
    rss, proc = peak_rss_mib(args, {**os.environ, **aws_env, "CI": "1"})
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert summary(proc)["objects"] == 24
    assert rss <= RSS_LIMIT_MIB, f"peak RSS {rss} MiB"


def test_bodies_in_flight_stay_under_the_budget(
    aws_env: dict[str, str], s3_client: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(10):
        s3_client.put_object(Bucket=bucket, Key=f"b/{i}", Body=bytes([i]) * (3 * MIB))
    monkeypatch.setattr(fetcher_mod, "BODY_BUDGET", 7 * MIB)  # room for two 3 MiB bodies, not three
    most = 0
    start = fetcher_mod.Fetcher._start

    def watching(self: fetcher_mod.Fetcher, *args: Any) -> None:
        nonlocal most
        most = max(most, self._body_bytes)
        start(self, *args)

    monkeypatch.setattr(fetcher_mod.Fetcher, "_start", watching)
    c = Cache(tmp_path / "c", ram_dir=tmp_path / "ram")
    try:
        result = c.preload([f"s3://{bucket}/b/"])
        assert result.objects == 10 and not result.failed
        assert most == 6 * MIB
        for i in range(10):
            with c.open(f"s3://{bucket}/b/{i}") as f:
                assert f.read() == bytes([i]) * (3 * MIB)
    finally:
        c.close()
