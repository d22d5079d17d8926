"""Listings a store should never send: a page that is not a ListBucketResult (a proxy's HTML error
page with 200), a truncated page with no token to go on with, a token handed out twice, 5xx. Each
used to end the listing quietly (exit 0 with part of the prefix cached) or say the wrong thing."""

from __future__ import annotations

from pathlib import Path

import pytest
from rqtest import run_rq
from s3fake import ENV, HTML, FakeS3, list_page, object_reply

A, B = b"first object\n", b"second object\n"


@pytest.fixture(autouse=True)
def objects(store: FakeS3) -> None:
    store.objects = {"p/a": object_reply(A), "p/b": object_reply(B)}


def preload(store: FakeS3, cache: Path, *args: str) -> tuple[int, str]:
    proc = run_rq(
        "preload", "s3://b/p/", "--endpoint-url", store.endpoint, "--cache-dir", str(cache), *args,
        env=ENV, timeout=90,
    )  # fmt: skip
    return proc.returncode, proc.stderr.decode()


@pytest.mark.parametrize(
    "second",
    [
        pytest.param(HTML, id="html-page"),
        pytest.param(list_page({"p/b": B}, truncated=True), id="truncated-without-token"),
    ],
)
def test_a_bad_page_in_the_middle_of_a_listing_stops_the_run(
    store: FakeS3, tmp_path: Path, second: object
) -> None:
    store.pages = {None: list_page({"p/a": A}, token="T2"), "T2": second}  # type: ignore[dict-item]
    code, err = preload(store, tmp_path / "c")
    # exit 6, as a store that went away part-way (docs/cache.md); it used to be exit 0 with p/b
    # never listed (the page taken for an empty last one)
    assert code == 6, err
    assert "unreadable listing" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_an_html_first_page_is_an_unreadable_listing_not_an_empty_prefix(
    store: FakeS3, tmp_path: Path
) -> None:
    store.pages = {None: HTML}
    code, err = preload(store, tmp_path / "c")
    assert code == 6, err  # it was exit 3 "no objects under s3://b/p/"
    assert "unreadable listing" in err and "not a ListBucketResult" in err
    assert not (tmp_path / "c").exists()  # asked before the cache is made: nothing made


def test_a_repeated_token_says_the_store_misbehaves(store: FakeS3, tmp_path: Path) -> None:
    store.pages = {None: list_page({"p/a": A}, token="T"), "T": list_page({"p/b": B}, token="T")}
    code, err = preload(store, tmp_path / "c")
    assert code == 6, err
    # a re-run meets the same token: "re-run to continue" alone would send people round in circles
    assert "repeats itself" in err and "misbehaving" in err


def test_a_listing_that_keeps_failing_with_5xx_names_its_error_once(store: FakeS3, tmp_path: Path) -> None:
    error = b"<Error><Code>InternalError</Code><Message>m</Message></Error>"
    store.pages = {None: (500, {"Content-Type": "application/xml"}, error)}
    code, err = preload(store, tmp_path / "c")
    assert code == 6, err
    assert "internal error" in err
    assert err.count("AWS_ERROR_S3_INTERNAL_ERROR") <= 1, err  # it read "X X: Response code …"
