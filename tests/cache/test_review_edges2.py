"""Edge cases found by a second review with real files and a real S3 store: verify racing other
preloads, preloads interrupted early, demotions counted for the disk tier, failed runs leaving
a cache behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import cache.api
from cache import Cache


def _relanding_check(cache_: Cache, url: str, tier: str) -> Any:
    """A `_check_blob` that, the first time it looks at `url`, first lets another process evict
    the entry and then lands it again (same URL and version: the same file name) before the
    index is read again: the window a verify beside busy preloads falls into."""
    real = cache.api._check_blob
    done: list[str] = []

    def check(path: Path, entry: Any) -> str | None:
        if entry.url != url or done:
            return real(path, entry)
        done.append(url)
        evicted, _ = cache_.evict(url)
        assert evicted == 1
        problem = real(path, entry)  # the file is gone just now
        assert problem == "missing file"
        cache_.preload([url], tier=tier)
        return problem

    return check


@pytest.mark.parametrize("tier", ["ram", "disk"])
@pytest.mark.parametrize("repair", [False, True])
def test_verify_does_not_call_an_entry_landed_again_meanwhile_corrupt(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch, tier: str, repair: bool
) -> None:
    """`rq cache verify` beside preloads that fill and evict the cache exited 5 ('N corrupt
    entries … missing file') on a healthy cache: an entry evicted and landed again between the
    file check and the index re-read names the same (tier, blob, xxh3), so the missing file was
    reported, and --repair dropped the good new entry. The landing's `created` stamp now tells
    them apart: nothing is reported and the entry stays."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}").write_bytes(os.urandom(5000) + bytes([i]))
    url = str(src / "f2")
    c = Cache(tmp_path / "cache", ram_dir=ram_dir)
    try:
        c.preload([str(src)], tier=tier)
        before = c.stat(url)
        monkeypatch.setattr(cache.api, "_check_blob", _relanding_check(c, url, tier))
        checked, problems = c.verify(repair=repair)
        assert checked == 4
        assert problems == []
        after = c.stat(url)  # landed again (a new stamp), kept, sound
        assert (after.tier, after.blob) == (before.tier, before.blob) and after.created != before.created
        with c.open(url) as f:
            assert f.read() == (src / "f2").read_bytes()
        monkeypatch.undo()
        assert c.verify() == (4, [])
    finally:
        c.close()


def test_verify_still_reports_a_file_that_is_really_missing(tmp_path: Path, ram_dir: Path) -> None:
    """The other side: a file gone under an entry the index still names is reported, and
    --repair drops that entry (only that one)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}").write_bytes(os.urandom(3000) + bytes([i]))
    c = Cache(tmp_path / "cache", ram_dir=ram_dir)
    try:
        c.preload([str(src)], tier="disk")
        url = str(src / "f1")
        c.path(url).unlink()
        checked, problems = c.verify(repair=True)
        assert checked == 3 and [(p.url, p.problem) for p in problems] == [(url, "missing file")]
        assert sorted(e.url for e in c.entries()) == [str(src / "f0"), str(src / "f2")]
    finally:
        c.close()
