"""Cache.open / Cache.path while the store cannot be reached: the verified cached copy is served
(and reported as a ServedStale event), but never when the store answers that the object is gone
or refuses the credentials, and never a copy that fails its digest. Real SeaweedFS behind a
fault proxy that is stopped (connection refused) or answers 503 to everything."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from cachekit import payload
from rqtest import run_rq

from cache import Cache, NotFoundError, UnreachableError
from cache import events as ev

pytestmark = pytest.mark.integration

SIZE = 64 * 1024


def _seed(s3_client: Any, bucket: str, key: str = "d/a.bin") -> str:
    s3_client.put_object(Bucket=bucket, Key=key, Body=payload(1, SIZE))
    return f"s3://{bucket}/{key}"


def _landed(root: Path, ram_dir: Path, url: str, endpoint: str) -> Path:
    """`root`, a cache dir holding `url`, landed through `endpoint`."""
    with Cache(root, ram_dir=ram_dir, endpoint_url=endpoint) as c, c.open(url) as fh:
        assert fh.read() == payload(1, SIZE)
    return root


def _make_stale(root: Path, ram_dir: Path, url: str) -> None:
    """As if the entry was last confirmed an hour ago: older than rq's 60 s max age."""
    with Cache(root, ram_dir=ram_dir) as c:
        c._state().index.mark_checked([url], time.time() - 3600)


def test_open_serves_the_cached_copy_when_the_store_went_away(
    s3_client: Any,
    bucket: str,
    aws_env: dict[str, str],
    tmp_path: Path,
    ram_dir: Path,
    proxy_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import cache.api

    # the store stays known down for the whole test, however slow the runner (10 s in real life)
    monkeypatch.setattr(cache.api, "UNREACHABLE_RECHECK_S", 3600.0)
    url = _seed(s3_client, bucket)
    proxy = proxy_factory()
    events: list[ev.Event] = []
    c = Cache(tmp_path / "c", ram_dir=ram_dir, endpoint_url=proxy.endpoint, max_age=0, on_event=events.append)
    with c.open(url) as fh:  # a miss, through the store (the CRT keeps its connection pooled)
        assert fh.read() == payload(1, SIZE)
    assert events == []
    proxy.stop()  # refused from now on; the pooled connection is reset
    with c.open(url) as fh:
        assert fh.read() == payload(1, SIZE)
    stale = [e for e in events if isinstance(e, ev.ServedStale)]
    assert len(stale) == 1 and stale[0].url == url
    assert "cannot reach" in stale[0].reason and stale[0].checked_s >= 0
    asked: list[str] = []
    origin_for_url = cache.api.origin_for_url

    def counted(url: str, *args: Any) -> Any:
        asked.append(url)
        return origin_for_url(url, *args)

    monkeypatch.setattr(cache.api, "origin_for_url", counted)
    for _ in range(5):  # the store is known down for a while: not asked (and waited for) per open
        with c.open(url) as fh:
            assert fh.read() == payload(1, SIZE)
    assert asked == []  # (was: less than 1 s for the five, which a loaded runner can take anyway)
    monkeypatch.setattr(cache.api, "origin_for_url", origin_for_url)
    assert c.path(url, fresh=True).read_bytes() == payload(1, SIZE)
    assert len([e for e in events if isinstance(e, ev.ServedStale)]) == 7
    assert c.stat(url).url == url  # still cached, still at its version
    c.close()


@pytest.mark.parametrize("internal_error", [False, True], ids=["503-slowdown", "500-internal"])
def test_open_serves_the_cached_copy_while_the_store_answers_5xx(
    internal_error: bool,
    s3_client: Any,
    bucket: str,
    aws_env: dict[str, str],
    services: Any,
    tmp_path: Path,
    ram_dir: Path,
    proxy_factory: Any,
) -> None:
    url = _seed(s3_client, bucket)
    root = _landed(tmp_path / "c", ram_dir, url, services.s3_endpoint)
    # 503 SlowDown (or 500 InternalError) to every request, HEAD too, outlasting the retries
    sick = proxy_factory(p_slowdown=1.0, only_get=False, internal_error=internal_error)
    events: list[ev.Event] = []
    with Cache(root, ram_dir=ram_dir, endpoint_url=sick.endpoint, max_age=0, on_event=events.append) as c:
        with c.open(url) as fh:
            assert fh.read() == payload(1, SIZE)
        assert sick.stats.slowdowns >= 1
        stale = [e for e in events if isinstance(e, ev.ServedStale)]
        assert [e.url for e in stale] == [url]
        assert ("INTERNAL_ERROR" if internal_error else "throttled") in stale[0].reason


def test_an_object_the_store_says_is_gone_is_dropped_not_served(
    s3_client: Any, bucket: str, aws_env: dict[str, str], services: Any, tmp_path: Path, ram_dir: Path
) -> None:
    url = _seed(s3_client, bucket)
    root = _landed(tmp_path / "c", ram_dir, url, services.s3_endpoint)
    s3_client.delete_object(Bucket=bucket, Key="d/a.bin")
    events: list[ev.Event] = []
    with Cache(root, ram_dir=ram_dir, max_age=0, on_event=events.append) as c:
        with pytest.raises(NotFoundError):
            c.open(url)
        assert c.entries() == []  # dropped: the next open does not find a copy to serve
        assert not any(isinstance(e, ev.ServedStale) for e in events)


def test_refused_credentials_are_not_served_around(
    s3_client: Any, bucket: str, cache_env: dict[str, str], services: Any, ram_dir: Path
) -> None:
    url = _seed(s3_client, bucket)
    root = Path(cache_env["RQ_CACHE_DIR"])
    _landed(root, ram_dir, url, services.s3_endpoint)
    _make_stale(root, ram_dir, url)
    wrong = {**cache_env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    out = run_rq("cache", "cat", url, env=wrong)
    assert out.returncode == 4, out.stderr  # as rq's exit-code table says: credentials
    assert out.stdout == b"" and b"served" not in out.stderr
    with Cache(root, ram_dir=ram_dir) as c:
        assert [e.url for e in c.entries()] == [url]  # the answer was about us, not the object


def test_a_damaged_copy_is_not_served_when_the_store_is_gone(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path, ram_dir: Path, proxy_factory: Any
) -> None:
    url = _seed(s3_client, bucket)
    proxy = proxy_factory()
    root = _landed(tmp_path / "c", ram_dir, url, proxy.endpoint)
    proxy.stop()
    events: list[ev.Event] = []
    with Cache(root, ram_dir=ram_dir, endpoint_url=proxy.endpoint, max_age=0, on_event=events.append) as c:
        blob = c.path(url)
        os.chmod(blob, 0o600)
        with open(blob, "r+b") as fh:
            fh.write(b"X")
        with pytest.raises(UnreachableError):
            c.open(url)
        assert [type(e) for e in events] == [ev.Damaged]  # dropped (and said), never served stale


def test_rq_cache_cat_warns_that_it_served_a_copy_it_could_not_check(
    s3_client: Any, bucket: str, cache_env: dict[str, str], ram_dir: Path, proxy_factory: Any
) -> None:
    url = _seed(s3_client, bucket)
    proxy = proxy_factory()
    root = Path(cache_env["RQ_CACHE_DIR"])
    _landed(root, ram_dir, url, proxy.endpoint)
    _make_stale(root, ram_dir, url)
    proxy.stop()
    for command in (("cat", url), ("path", url)):
        out = run_rq("cache", *command, "--endpoint-url", proxy.endpoint, env=cache_env)
        assert out.returncode == 0, out.stderr
        if command[0] == "cat":
            assert out.stdout == payload(1, SIZE)
        assert b"served the cached copy" in out.stderr and url.encode() in out.stderr
