"""cache.s3.Listing: ListObjectsV2 pages chained on the CRT's threads, against the real SeaweedFS."""

from __future__ import annotations

import itertools
import queue
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from cache.errors import AuthError, NotFoundError, OriginError
from cache.s3 import S3, Listing, S3Settings, shared_client, start_listings

KEYS = [
    f"p/{i:03d}-{name}"
    for i, name in enumerate(["a", "b b", "c+d", "é", "x%y", "z/deep", "k", "l", "m", "n"])
]


@pytest.fixture
def listed_bucket(s3_client: Any, bucket: str) -> str:
    for key in KEYS:
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    s3_client.put_object(Bucket=bucket, Key="other/1", Body=b"no")
    return bucket


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Listing, "page_size", 3)  # 10 keys: four pages


def client(services: Any) -> S3:
    return S3(S3Settings(endpoint_url=services.s3_endpoint))


def started_listing(s3: S3, bucket: str, pages: int) -> Listing:
    """Starts listing p/ and waits (up to 30 s: a loaded runner) until `pages` pages are queued unread."""
    s3.start_listing(bucket, "p/")
    listing = s3._listings[(bucket, "p/")]
    deadline = time.monotonic() + 30
    while listing._pages.qsize() < pages:
        assert time.monotonic() < deadline, f"{listing._pages.qsize()} of {pages} pages queued after 30 s"
        time.sleep(0.01)
    return listing


def test_every_page_in_order_with_odd_keys(
    aws_env: dict[str, str], services: Any, listed_bucket: str, small_pages: None, s3_client: Any
) -> None:
    got = list(client(services).list_objects(listed_bucket, "p/"))
    assert [key for key, _, _, _ in got] == KEYS
    sizes = {key: size for key, size, _, _ in got}
    assert sizes == {key: len(key.encode()) for key in KEYS}
    etag = s3_client.head_object(Bucket=listed_bucket, Key=KEYS[0])["ETag"].strip('"')
    assert got[0][2] == etag


def test_a_listing_runs_only_a_few_pages_ahead_of_its_reader(
    aws_env: dict[str, str], services: Any, listed_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a prefix of millions of objects lists far faster than it is fetched: the pages must not all
    # pile up in memory while the reader is still busy with the first ones
    monkeypatch.setattr(Listing, "page_size", 2)  # 10 keys: five pages
    monkeypatch.setattr(Listing, "ahead", 2)
    asks, handled = itertools.count(1), itertools.count(1)
    asked, done = [0], [0]
    ask, on_page = Listing._ask, Listing._on_page

    def counted_ask(self: Listing, token: str | None) -> None:
        asked[0] = next(asks)
        ask(self, token)

    def counted_on_page(self: Listing, *args: Any) -> None:
        on_page(self, *args)  # (a chain that goes on asks for the next page in here)
        done[0] = next(handled)

    monkeypatch.setattr(Listing, "_ask", counted_ask)
    monkeypatch.setattr(Listing, "_on_page", counted_on_page)
    s3 = client(services)
    listing = started_listing(s3, listed_bucket, pages=2)
    # no sleep to give the other pages time: once page 2's reply has been handled, whether it
    # asked for page 3 is settled (a timed wait proves nothing on a loaded runner)
    deadline = time.monotonic() + 30
    while done[0] < 2:
        assert time.monotonic() < deadline, "page 2's reply was never handled"
        time.sleep(0.01)
    assert asked[0] == 2, "the listing ran ahead of its reader"
    assert listing._pages.qsize() == 2
    got = [key for key, _, _, _ in s3.list_objects(listed_bucket, "p/")]
    assert got == KEYS  # taking pages asks for the next ones, in order


def test_a_started_listing_fetches_its_pages_before_anyone_asks(
    aws_env: dict[str, str], services: Any, listed_bucket: str, small_pages: None
) -> None:
    s3 = client(services)
    listing = started_listing(s3, listed_bucket, pages=4)
    assert listing._pages.qsize() == 4, "the pages did not chain by themselves"
    assert [key for key, _, _, _ in s3.list_objects(listed_bucket, "p/")] == KEYS
    assert not s3._listings  # taken over once; the next listing starts afresh
    assert len(list(s3.list_objects(listed_bucket, "p/"))) == len(KEYS)


def test_a_reader_that_stops_early_ends_the_chain(
    aws_env: dict[str, str], services: Any, listed_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # page 2's reply is held on its CRT thread until the reader has gone: only the reader's close
    # can stop the chain then (a timed wait let CI's loaded runner queue 4 pages before the close)
    monkeypatch.setattr(Listing, "page_size", 1)  # 10 keys: ten pages
    monkeypatch.setattr(Listing, "ahead", 100)  # so that `ahead` cannot be what stops it
    gate, replies, arrivals = threading.Event(), queue.SimpleQueue[int](), itertools.count(1)
    on_page = Listing._on_page

    def held(self: Listing, *args: Any) -> None:
        page = next(arrivals)  # (page 2 arrives while page 1's callback is still asking for it)
        if page == 2:
            assert gate.wait(10), "the test never let page 2 through"
        on_page(self, *args)
        replies.put(page)

    monkeypatch.setattr(Listing, "_on_page", held)
    listing = Listing(client(services), listed_bucket, "p/")
    reader = iter(listing)
    next(reader)
    reader.close()  # what a preload that failed does to its listing (generator close)
    gate.set()
    assert sorted([replies.get(timeout=10), replies.get(timeout=10)]) == [1, 2]
    with pytest.raises(queue.Empty):
        replies.get(timeout=1.0)  # a chain that went on asks page 3 within a few ms
    assert listing._pages.qsize() == 1  # page 2, arrived after the reader left


def test_a_missing_bucket_is_raised_when_the_listing_is_read(aws_env: dict[str, str], services: Any) -> None:
    s3 = client(services)
    s3.start_listing("rq-no-such-bucket-4c1d", "")
    with pytest.raises(NotFoundError):
        list(s3.list_objects("rq-no-such-bucket-4c1d", ""))


def test_start_listings_leaves_errors_to_the_planner(
    services: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    settings = S3Settings(endpoint_url=services.s3_endpoint, region="us-east-1")
    start_listings(settings, ["s3://b/p/", "/local/dir"])  # no credentials: nothing raised here
    with pytest.raises(AuthError):
        shared_client(settings)


def test_starting_the_same_listing_twice_sends_it_once(
    aws_env: dict[str, str], services: Any, listed_bucket: str
) -> None:
    s3 = client(services)
    s3.start_listing(listed_bucket, "p/")
    first = s3._listings[(listed_bucket, "p/")]
    s3.start_listing(listed_bucket, "p/")
    assert s3._listings[(listed_bucket, "p/")] is first
    assert len(list(s3.list_objects(listed_bucket, "p/"))) == len(KEYS)


@pytest.mark.parametrize(
    "body", [b"<not xml", b"<ListBucketResult><Contents><Size>x</Size></Contents></ListBucketResult>"]
)
def test_an_unreadable_page_is_an_error_for_the_reader_not_a_hang(
    aws_env: dict[str, str], services: Any, monkeypatch: pytest.MonkeyPatch, body: bytes
) -> None:
    s3 = client(services)
    monkeypatch.setattr(S3, "_send", lambda *a, **k: None)  # the reply is handed in below
    listing = Listing(s3, "b", "p/")
    listing._on_page(200, [], body, None)  # what the CRT thread calls with the reply
    with pytest.raises(OriginError, match="unreadable listing"):
        list(listing)


def test_the_package_still_offers_everything_it_imports_lazily() -> None:
    # in a fresh interpreter: `import cache` no longer imports the read API up front (so cache.s3
    # stays light), yet everything a user reached through the package is still there
    script = (
        "import sys, cache\n"
        "assert 'cache.api' not in sys.modules\n"
        "assert {'Cache', 'Prefetcher', 'PreloadResult', 'CacheError'} <= set(dir(cache))\n"
        "assert cache.Cache is cache.api.Cache and cache.preload.PreloadResult is cache.PreloadResult\n"
        "assert cache.fetcher.Fetcher and cache.s3.S3\n"
        "try:\n    cache.no_such_thing\nexcept AttributeError:\n    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
