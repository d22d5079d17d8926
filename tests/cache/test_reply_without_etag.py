"""A 200 reply to an object's GET or HEAD without an ETag (a proxy's HTML error page) is not the
object: S3 always sends an ETag. It was cached as the object, and later HEADs with the same empty
ETag kept it as current."""

from __future__ import annotations

from pathlib import Path

import pytest
from rqtest import run_rq
from s3fake import ENV, HTML, FakeS3, list_page, object_reply

from cache import Cache
from cache.errors import OriginError

BODY = b"the real object\n"


def test_cache_open_refuses_an_html_page_without_an_etag(store: FakeS3, tmp_path: Path) -> None:
    store.objects = {"p/a": HTML}
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", endpoint_url=store.endpoint) as c:
        with pytest.raises(OriginError, match="no ETag"):
            c.open("s3://b/p/a")
        assert c.entries() == []  # nothing cached


def test_a_cached_object_is_not_replaced_by_a_page_without_an_etag(store: FakeS3, tmp_path: Path) -> None:
    store.objects = {"p/a": object_reply(BODY)}
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", endpoint_url=store.endpoint, max_age=0) as c:
        with c.open("s3://b/p/a") as f:
            assert f.read() == BODY
        store.objects = {"p/a": HTML}
        # an answer (not silence): raised, neither the page cached nor the old copy served stale
        with pytest.raises(OriginError, match="no ETag"):
            c.open("s3://b/p/a")
        assert [e.size for e in c.entries()] == [len(BODY)]


def test_a_preload_get_without_an_etag_lands_nothing(store: FakeS3, tmp_path: Path) -> None:
    page = HTML[2]  # type: ignore[index]
    store.pages = {None: list_page({"p/a": page})}  # listed with an ETag; the GET brings none
    store.objects = {"p/a": HTML}
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", endpoint_url=store.endpoint) as c:
        result = c.preload(["s3://b/p/"])
        assert result.objects == 0 and [f.kind for f in result.failed] == ["origin"]
        assert "no ETag" in result.failed[0].message
        assert c.entries() == []


def test_rq_preload_of_html_pages_without_etags_fails_them_and_caches_nothing(
    store: FakeS3, tmp_path: Path
) -> None:
    page = HTML[2]  # type: ignore[index]
    store.pages = {None: list_page({"p/a": page})}
    store.objects = {"p/a": HTML}
    proc = run_rq(
        "preload", "s3://b/p/", "--endpoint-url", store.endpoint, "--cache-dir", str(tmp_path / "c"), "--json",
        env=ENV, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stderr
    assert b"no ETag" in proc.stdout
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram") as c:
        assert c.entries() == []
