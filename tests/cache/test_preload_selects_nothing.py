"""`check_sources_exist` (what `rq preload` asks before it makes a new cache) also refuses filters
that select nothing, when the source's first page tells: `rq preload SRC --include '*.zip'` of a
source without one exits 3 as before and now creates no cache either. A source listed past its
first page passes (the planner's own listing finds it out), as does a match on a later page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cachekit import local_source

import cache.preload
from cache.errors import NotFoundError
from cache.preload import check_sources_exist
from cache.s3 import Listing, S3Settings, shared_client


def test_a_directory_whose_files_match_no_filter_is_refused(tmp_path: Path) -> None:
    src = str(local_source(tmp_path / "src", 3, 10))
    settings = S3Settings()
    with pytest.raises(NotFoundError, match="none of the 3 objects listed matches"):
        check_sources_exist([src], settings, include=["*.zip"])
    with pytest.raises(NotFoundError, match="none of the 3 objects listed matches"):
        check_sources_exist([src], settings, exclude=["/*"])  # (a leading / anchors, as pages())
    check_sources_exist([src], settings, include=["f1"])
    with pytest.raises(NotFoundError, match="none of the 6 objects listed matches"):
        check_sources_exist([src, str(local_source(tmp_path / "b", 3, 10))], settings, include=["*.zip"])
    # one source's match is enough, as for the planner
    check_sources_exist([src, str(tmp_path / "b" / "f2")], settings, include=["f2"])


def test_a_directory_listed_past_one_page_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache.preload, "PAGE", 2)
    src = str(local_source(tmp_path / "src", 3, 10))  # f0 f1 | f2
    check_sources_exist([src], S3Settings(), include=["f2"])  # the match is past the first page
    check_sources_exist([src], S3Settings(), include=["*.zip"])  # cannot tell from one page


@pytest.mark.integration
def test_an_s3_listing_of_one_page_tells_filters_and_siblings(
    aws_env: dict[str, str], services: Any, s3_client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Listing, "page_size", 2)
    for key in ("one/a.bin", "many/0.bin", "many/1.bin", "many/2.bin"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"x")
    settings = S3Settings(endpoint_url=services.s3_endpoint)
    with pytest.raises(NotFoundError, match="none of the 1 objects listed matches"):
        check_sources_exist([f"s3://{bucket}/one/"], settings, include=["*.zip"])
    check_sources_exist([f"s3://{bucket}/one/"], settings, include=["a.*"])
    # three pages: a match past the first one, and none at all, both pass (the planner tells)
    check_sources_exist([f"s3://{bucket}/many/"], settings, include=["2.bin"])
    check_sources_exist([f"s3://{bucket}/many/"], settings, include=["*.zip"])
    # and the waited-for page is still left to the planner's listing
    client = shared_client(settings)
    assert [k for k, *_ in client.list_objects(bucket, "many/")] == ["many/0.bin", "many/1.bin", "many/2.bin"]


@pytest.mark.integration
def test_s3_name_whose_one_page_holds_only_siblings_is_not_there(
    aws_env: dict[str, str], services: Any, s3_client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented gap of 2f46650, closed where that page is the listing's last: the page's keys
    are read as the planner reads them (`name`, `name/…`), not counted raw."""
    monkeypatch.setattr(Listing, "page_size", 2)
    for key in ("name2", "name.bak", "many/name-a", "many/name.b", "many/name/x"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"x")
    settings = S3Settings(endpoint_url=services.s3_endpoint)
    with pytest.raises(NotFoundError, match=f"no objects under s3://{bucket}/name$"):
        check_sources_exist([f"s3://{bucket}/name"], settings)
    check_sources_exist([f"s3://{bucket}/many/name"], settings)  # many/name/x sorts onto page 2
