"""A one-object read (Cache.open, `rq cache cat`) raises the error its fetch met, subclass and hint
included. It raised the base class of the failure's kind: a store replying without an ETag came back
as a plain OriginError, and `rq cache cat` told the user "re-run to continue" although the message
says a re-run meets the same reply."""

from __future__ import annotations

import http.server
from pathlib import Path

import pytest
from rqtest import popen_rq_with
from s3fake import ENV, HTML, FakeS3, object_reply, write_reply

from cache import Cache
from cache.errors import MisbehavingStoreError


def head_fine_get_without_etag(handler: http.server.BaseHTTPRequestHandler, head: bool) -> None:
    """The HEAD looks like S3's; the GET is a proxy's page: the failure is met by the fetch."""
    write_reply(handler, object_reply(b"the real object\n") if head else HTML, head)


ONE_ATTEMPT = "import cache.fetcher; cache.fetcher.MAX_ATTEMPTS = 1"  # the retries meet the same page


def test_cache_open_raises_the_misbehaving_store_error_itself(
    store: FakeS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cache.fetcher.MAX_ATTEMPTS", 1)
    store.objects = {"p/a": head_fine_get_without_etag}
    with (
        Cache(tmp_path / "c", ram_dir=tmp_path / "ram", endpoint_url=store.endpoint) as c,
        pytest.raises(MisbehavingStoreError, match="no ETag") as raised,
    ):
        c.open("s3://b/p/a")
    assert raised.value.hint == MisbehavingStoreError.hint


def test_rq_cache_cat_gives_the_misbehaving_store_hint(store: FakeS3, tmp_path: Path) -> None:
    store.objects = {"p/a": head_fine_get_without_etag}
    env = {**ENV, "RQ_CACHE_DIR": str(tmp_path / "c"), "AWS_ENDPOINT_URL": store.endpoint}
    proc = popen_rq_with(ONE_ATTEMPT, "cache", "cat", "s3://b/p/a", env=env)
    _, stderr = proc.communicate(timeout=60)
    err = stderr.decode()
    assert proc.returncode == 6, err
    assert "no ETag" in err and "proxy in front of it" in err, err
    assert "re-run to continue" not in err, err
    assert len(err.strip().splitlines()) == 1, err
