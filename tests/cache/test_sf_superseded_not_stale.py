"""Once the store has named a newer version of a cached object, the old copy is known superseded:
should fetching the new one then fail (a corrupt body), the old entry must not stay to be served
later as merely unchecked (ServedStale) while the store cannot be asked. Real SeaweedFS; the
failed fetch is a VerifyError raised in place of the landing, the outage a stopped fault proxy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cachekit import payload

import cache.api
from cache import Cache, NotFoundError, UnreachableError, VerifyError
from cache import events as ev
from cache.s3 import S3Settings

pytestmark = pytest.mark.integration

SIZE = 4096


def _corrupt_fetch(*_args: Any, **_kwargs: Any) -> Any:
    raise VerifyError("the body does not match its digest")


@pytest.mark.parametrize("how", ["open", "path"])
def test_a_superseded_copy_is_not_served_stale(
    how: str,
    s3_client: Any,
    bucket: str,
    aws_env: dict[str, str],
    tmp_path: Path,
    ram_dir: Path,
    proxy_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"s3://{bucket}/k.bin"
    s3_client.put_object(Bucket=bucket, Key="k.bin", Body=payload(1, SIZE))
    proxy = proxy_factory()
    root = tmp_path / "c"
    with Cache(root, ram_dir=ram_dir, endpoint_url=proxy.endpoint) as c, c.open(url) as fh:
        assert fh.read() == payload(1, SIZE)  # v1 cached
    s3_client.put_object(Bucket=bucket, Key="k.bin", Body=payload(2, SIZE))  # v2 at the store
    with (
        Cache(root, ram_dir=ram_dir, endpoint_url=proxy.endpoint, max_age=0) as c,
        monkeypatch.context() as m,
    ):
        m.setattr(cache.api.Cache, "_fetch_one", _corrupt_fetch)
        with pytest.raises(VerifyError):  # the HEAD named v2; its GET failed
            if how == "open":
                c.open(url).close()
            else:
                c.path(url, fresh=True)
    proxy.stop()  # the store cannot be asked from now on
    events: list[ev.Event] = []
    with Cache(root, ram_dir=ram_dir, endpoint_url=proxy.endpoint, max_age=0, on_event=events.append) as c:
        c.s3_settings = S3Settings(endpoint_url=proxy.endpoint, max_retries=1)  # refused: fewer retries
        if how == "open":
            with pytest.raises(UnreachableError):  # a miss now: v1 is not served
                c.open(url).close()
        else:
            with pytest.raises(NotFoundError):  # not cached any more
                c.path(url, fresh=True)
    assert [e for e in events if isinstance(e, ev.ServedStale)] == []


def test_a_preload_that_fails_the_new_version_drops_the_old_copy(
    s3_client: Any,
    bucket: str,
    aws_env: dict[str, str],
    tmp_path: Path,
    ram_dir: Path,
    proxy_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import cache.fetcher

    url = f"s3://{bucket}/d/k.bin"
    s3_client.put_object(Bucket=bucket, Key="d/k.bin", Body=payload(1, SIZE))
    root = tmp_path / "c"
    proxy = proxy_factory()
    with Cache(root, ram_dir=ram_dir, endpoint_url=proxy.endpoint) as c:
        assert c.preload([f"s3://{bucket}/d/"]).failed == []  # v1 cached
    s3_client.put_object(Bucket=bucket, Key="d/k.bin", Body=payload(2, SIZE))
    # the listing names v2; every GET of an object answers 500 (one attempt, one CRT retry)
    sick = proxy_factory(p_slowdown=1.0, only_objects=True, internal_error=True)
    monkeypatch.setattr(cache.fetcher, "MAX_ATTEMPTS", 1)
    with Cache(root, ram_dir=ram_dir, endpoint_url=sick.endpoint) as c:
        c.s3_settings = S3Settings(endpoint_url=sick.endpoint, max_retries=1)
        failed = c.preload([f"s3://{bucket}/d/"]).failed
        assert [f.url for f in failed] == [url]
        assert c.entries() == []  # old: v1's entry stayed
    sick.stop()
    events: list[ev.Event] = []
    with Cache(root, ram_dir=ram_dir, endpoint_url=sick.endpoint, max_age=0, on_event=events.append) as c:
        c.s3_settings = S3Settings(endpoint_url=sick.endpoint, max_retries=1)
        with pytest.raises(UnreachableError):
            c.open(url).close()
    assert [e for e in events if isinstance(e, ev.ServedStale)] == []
