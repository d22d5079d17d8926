"""Throttling was invisible in preload's human summary (review, on-call at 3 a.m.): with most GETs
answered 503 SlowDown the line read only `preloaded 20 objects (3.8 MiB) in 2.85 s (1 MB/s) …
0 failed`, a merely slow store, while --json had "throttled" and "smallest_window". The human
line now says `throttled by the store N times; concurrency fell to W of K` when it happened (and
a window cut by the open-files limit, not counted as throttling, says that), nothing otherwise."""

from __future__ import annotations

import io
from typing import Any

import pytest
from cachekit import seed_objects
from rqtest import run_rq

from rqcli.commands.preload import report
from rqcli.output import Output


def _line(summary: dict[str, Any], workers: int | None = 256) -> str:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    report(out, summary, False, workers)
    return str(out.stdout.getvalue())


def _summary(**over: Any) -> dict[str, Any]:
    base = {
        "objects": 20,
        "bytes": 4_000_000,
        "skipped": 0,
        "failed": 0,
        "seconds": 2.85,
        "mb_per_s": 1.4,
        "aborted": False,
        "throttled": 0,
        "smallest_window": 256,
    }
    return {**base, **over}


def test_the_human_line_says_the_store_throttled() -> None:
    line = _line(_summary(throttled=2, smallest_window=64))
    assert line.startswith("preloaded 20 objects (3.8 MiB) in 2.85 s (1 MB/s); 0 already cached; 0 failed")
    assert line.rstrip().endswith("; throttled by the store 2 times; concurrency fell to 64 of 256"), line
    assert "throttled by the store once;" in _line(_summary(throttled=1, smallest_window=128))


def test_a_run_that_kept_its_concurrency_says_nothing_more() -> None:
    assert _line(_summary()).rstrip().endswith("0 failed")
    # a cut by the open-files limit is no throttling by the store: said as what it is
    said = _line(_summary(smallest_window=32)).rstrip()
    assert said.endswith("; concurrency fell to 32 of 256 (the process's open-files limit)"), said


@pytest.mark.integration
def test_a_throttling_store_shows_in_the_human_line(
    s3_client: Any, bucket: str, cache_env: dict[str, str], proxy_factory: Any
) -> None:
    seed_objects(s3_client, bucket, "f/", 80, 48 * 1024)
    # every object GET answers SlowDown for 2 s: past the CRT's retries, it reaches the window
    storm = proxy_factory(storm_s=2.0)
    proc = run_rq("preload", f"s3://{bucket}/f/", "--endpoint-url", storm.endpoint, env=cache_env)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.decode()
    assert "preloaded 80 objects" in line and "throttled by the store " in line, line
    assert "; concurrency fell to " in line and " of 256" in line, line
