"""The library checks what a training script passes before it fetches anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache import Cache, CacheError
from cache.errors import BadSourceError


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    root = tmp_path / "origin"
    root.mkdir()
    for name in ("big1.tar", "big2.tar", "small.txt"):
        (root / name).write_bytes(name.encode() * 10)
    return root


@pytest.mark.parametrize("arg", ["include", "exclude"])
def test_one_string_as_a_filter_is_refused_not_read_a_character_at_a_time(
    tmp_path: Path, origin: Path, arg: str
) -> None:
    c = Cache(tmp_path / "cache")
    with pytest.raises(BadSourceError, match=f"{arg} takes a list"):
        c.preload([f"{origin}/"], **{arg: "big*"})
    assert c.entries() == []
    # the list form is what it means
    planned = c.preload([f"{origin}/"], include=["big*"], dry_run=True).planned
    assert len(planned) == 2


def test_one_string_as_the_sources_is_refused(tmp_path: Path, origin: Path) -> None:
    c = Cache(tmp_path / "cache")
    with pytest.raises(BadSourceError, match="sources takes a list"):
        c.preload(f"{origin}/")  # type: ignore[arg-type]
    assert c.entries() == []


def test_a_tier_rq_does_not_have_is_a_cache_error(tmp_path: Path, origin: Path) -> None:
    c = Cache(tmp_path / "cache")
    for call in (
        lambda: c.open(f"{origin}/small.txt", tier="gpu"),
        lambda: c.prefetch([f"{origin}/small.txt"], tier="x"),
        lambda: c.preload([f"{origin}/"], tier="gpu"),
    ):
        with pytest.raises(CacheError, match="tier must be one of"):
            call()
        with pytest.raises(ValueError):  # still a ValueError, as before
            call()
    assert c.entries() == []
