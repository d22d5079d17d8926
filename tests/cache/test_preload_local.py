"""Preload semantics on a local directory origin: tiers, lowered limits, names that cannot be keys.
Each case was found by an exploratory test or an independent review."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cache import Cache

MIB = 1 << 20


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    d = tmp_path / "origin"
    d.mkdir()
    for i in range(4):
        (d / f"f{i}").write_bytes(os.urandom(MIB))
    return d


def test_preload_into_ram_promotes_what_is_cached_on_disk(
    tmp_path: Path, ram_dir: Path, origin: Path
) -> None:
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    assert c.preload([str(origin)]).objects == 4
    result = c.preload([str(origin)], tier="ram")
    assert (result.objects, result.skipped) == (4, 0)  # it said "skipped 4" and left them on disk
    for i in range(4):
        entry = c.stat(str(origin / f"f{i}"))
        assert entry.tier == "ram" and c.path(entry.url).read_bytes() == (origin / f"f{i}").read_bytes()
    assert c.usage()["disk"]["bytes"] == 0  # the disk copies went
    assert c.preload([str(origin)], tier="ram").skipped == 4
    assert c.preload([str(origin)]).skipped == 4  # a RAM copy serves a disk request: no refetch
    c.close()


def test_promotion_falls_back_to_the_origin_when_the_disk_copy_is_gone(
    tmp_path: Path, ram_dir: Path, origin: Path
) -> None:
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    c.preload([str(origin)])
    c.path(str(origin / "f0")).unlink()  # evicted by another process after the plan was made
    result = c.preload([str(origin)], tier="ram")
    assert (result.objects, result.failed) == (4, [])
    assert c.path(str(origin / "f0")).read_bytes() == (origin / "f0").read_bytes()
    c.close()


def test_a_set_bigger_than_ram_is_not_promoted_round_and_round(
    tmp_path: Path, ram_dir: Path, origin: Path
) -> None:
    c = Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit=2 * MIB)
    c.preload([str(origin)])
    result = c.preload([str(origin)], tier="ram")
    assert (result.objects, result.skipped) == (0, 4)  # 4 MiB cannot all be in a 2 MiB tier
    c.close()


def test_a_lower_limit_shrinks_the_tier_at_once(tmp_path: Path, ram_dir: Path, origin: Path) -> None:
    c = Cache(tmp_path / "c", ram_dir=ram_dir, disk_limit=10 * MIB)
    c.preload([str(origin)])
    other = Cache(tmp_path / "c", ram_dir=ram_dir)  # a process started before the limit changed
    c.close()
    c = Cache(tmp_path / "c", ram_dir=ram_dir, disk_limit=2 * MIB)
    result = c.preload([str(origin)], include=["f0"])
    assert result.skipped == 1 or result.objects == 1
    assert c.usage()["disk"]["bytes"] <= 2 * MIB  # was 4 MiB of a 2 MiB cap
    other.open(str(origin / "f3")).read()  # the older process honours the new cap too
    assert other.usage()["disk"]["bytes"] <= 2 * MIB
    other.close()
    c.close()


def test_a_name_that_is_not_utf8_fails_alone(tmp_path: Path, ram_dir: Path, origin: Path) -> None:
    bad = os.fsdecode(bytes(origin) + b"/\xff\xfe.bin")
    Path(bad).write_bytes(b"x" * 10)
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    result = c.preload([str(origin)])
    assert result.objects == 4  # the whole preload used to abort with UnicodeEncodeError
    assert [(f.kind, f.url.endswith("\\xff\\xfe.bin")) for f in result.failed] == [("bad_name", True)]
    c.close()


def test_pinned_ram_over_a_lowered_cap_does_not_stop_a_disk_preload(
    tmp_path: Path, ram_dir: Path, origin: Path
) -> None:
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    c.preload([str(origin)], tier="ram")
    c.pin(str(origin) + "/")
    c.close()
    other = tmp_path / "other"
    other.mkdir()
    (other / "x").write_bytes(b"x" * 1000)
    c = Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit=2 * MIB)  # below the 4 MiB pinned
    assert c.preload([str(other)]).objects == 1  # it failed with exit 7 (ram cap) for a disk preload
    c.close()
