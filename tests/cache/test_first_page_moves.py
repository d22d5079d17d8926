"""What a listing page gives is fetched while later pages are still being listed (docs/cache.md),
even when a page brings fewer than a thousand objects to fetch: a sparse --include, or a store
that sends empty pages. Pages were grouped by count, so nothing moved until 1,000 objects matched
or the listing ended (a store sending empty pages with new tokens: 0 objects in 40 s)."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest
from s3fake import FakeS3, list_page, object_reply, write_reply

from cache import Cache

A = b"the one object that matters\n"


@pytest.mark.parametrize("include", [[], ["*.tar"]])
def test_a_page_is_fetched_before_the_listing_ends(store: FakeS3, tmp_path: Path, include: list[str]) -> None:
    fetched = threading.Event()
    served = object_reply(A)

    def the_object(handler: http.server.BaseHTTPRequestHandler, head: bool) -> None:
        write_reply(handler, served, head)
        fetched.set()

    def last_page(handler: http.server.BaseHTTPRequestHandler, head: bool) -> None:
        # the listing's end waits for the first page's object to be fetched (20 s at most)
        store.waited = fetched.wait(20)  # type: ignore[attr-defined]
        write_reply(handler, list_page({}), head)

    first = {"p/a.tar": A, **{f"p/skip{i:03d}.txt": b"x" for i in range(50)}} if include else {"p/a.tar": A}
    store.pages = {None: list_page(first, token="T1")}
    store.pages.update({f"T{i}": list_page({}, token=f"T{i + 1}") for i in range(1, 6)})  # empty pages
    store.pages["T6"] = last_page
    store.objects = {"p/a.tar": the_object}
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", endpoint_url=store.endpoint) as c:
        result = c.preload(["s3://b/p/"], include=include)
        assert result.objects == 1 and result.failed == []
    assert store.waited, "the first page's object was fetched only once the listing had ended"  # type: ignore[attr-defined]
