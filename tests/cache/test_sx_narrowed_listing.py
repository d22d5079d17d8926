"""`--include 'shard-00*'` narrows the S3 listing as s5cmd and aws do: ListObjectsV2's Prefix is
the source's prefix and the literal start every include pattern shares, not the whole source
listed and filtered here. What the filter selects is the same; a narrowed listing that finds
nothing in a source that has keys says the filter selected nothing, not that the source is missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cache import Cache
from cache.errors import NotFoundError
from cache.preload import check_sources_exist, list_prefix
from cache.s3 import Listing, S3Settings

KEYS = (
    "p/shard-000.bin",
    "p/shard-001.bin",
    "p/shard-010.bin",
    "p/shard-00/x.bin",
    "p/other.bin",
    "p/a/b.bin",
)


def test_the_prefix_is_the_source_and_the_shared_literal_start() -> None:
    assert list_prefix("p/", ["shard-00*"]) == "p/shard-00"
    assert list_prefix("p/", ["shard-00*", "shard-01?"]) == "p/shard-0"
    assert list_prefix("p/", ["/shard-[01]*"]) == "p/shard-"  # (a leading / anchors at the source)
    assert list_prefix("p/", ["shard-00*", "*.bin"]) == "p/"  # one pattern starts with a glob
    assert list_prefix("p/", []) == "p/"  # (--exclude never narrows: it is not passed)
    assert list_prefix("", ["shard*"]) == "shard"
    # s3://b/name is the object `name` (matched by its base name) and what is under name/
    assert list_prefix("p/name", ["x*"]) == "p/name"
    # no narrowing across `//` (SeaweedFS names the object `d//x` listed for `d//x`, `d/x` for `d//`)
    assert list_prefix("d//", ["x"]) == "d//" and list_prefix("d/", ["/x//y*"]) == "d/"


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The Prefix of each ListObjectsV2 sent (each page of each listing)."""
    prefixes: list[str] = []
    ask = Listing._ask

    def counted(self: Listing, token: str | None) -> None:
        prefixes.append(self._prefix)
        ask(self, token)

    monkeypatch.setattr(Listing, "_ask", counted)
    return prefixes


@pytest.mark.integration
def test_preload_lists_only_the_narrowed_prefix(
    cache_env: dict[str, str], services: Any, s3_client: Any, bucket: str, asked: list[str]
) -> None:
    for key in KEYS:
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    settings = S3Settings(endpoint_url=services.s3_endpoint)
    check_sources_exist([f"s3://{bucket}/p/"], settings, include=["shard-00*"])
    with Cache(Path(cache_env["RQ_CACHE_DIR"])) as c:
        result = c.preload([f"s3://{bucket}/p/"], include=["shard-00*"], exclude=["*/x.bin"])
        assert result.objects == 2 and not result.failed
        with c.open(f"s3://{bucket}/p/shard-001.bin") as fh:
            assert fh.read() == b"p/shard-001.bin"
        # (`*` crosses `/`: shard-00/x.bin is selected without the --exclude)
        assert c.preload([f"s3://{bucket}/p/"], include=["shard-00*"]).objects == 1
    assert asked and set(asked) == {"p/shard-00"}, asked


@pytest.mark.integration
def test_a_filter_that_selects_nothing_is_not_a_missing_source(
    cache_env: dict[str, str],
    services: Any,
    s3_client: Any,
    bucket: str,
    asked: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Listing, "page_size", 2)
    for key in KEYS:
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"x")
    settings = S3Settings(endpoint_url=services.s3_endpoint)
    nothing = (
        r"none of the objects under s3://\S+/p/ matches --include/--exclude \(no key there starts with 'zz'\)"
    )
    with pytest.raises(NotFoundError, match=nothing):
        check_sources_exist([f"s3://{bucket}/p/"], settings, include=["zz*"])
    with Cache(Path(cache_env["RQ_CACHE_DIR"])) as c, pytest.raises(NotFoundError, match=nothing):
        c.preload([f"s3://{bucket}/p/"], include=["zz*"])
    # an empty source still reads as one
    with pytest.raises(NotFoundError, match=r"^no objects under s3://\S+/q/$"):
        check_sources_exist([f"s3://{bucket}/q/"], settings, include=["zz*"])
    # one page of the source's own prefix tells (three pages of two keys: no second one asked for)
    assert asked == ["p/zz", "p/", "p/zz", "p/", "q/zz", "q/"]
