"""`rq preload --tier ram` of a set bigger than the RAM cap reported all of evicted_own,
demoted_own and demoted_full as 0, exit 0, while objects of the set stayed on disk: docs/cli.md
tells a script that needs the whole set resident to check those counts. Those entries were
counted as `skipped` (cached before the run, left on disk because the set does not fit).
`PreloadResult.not_resident` now counts them. And a clock stepped back during a run made its own
landings look older than the run: they were counted as evicted by it (a false warning)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cache import Cache

SIZE = 1000  # + 1 byte each (cachekit-style local files): five of them do not fit in 2500 bytes


def _source(root: Path, n: int = 5) -> Path:
    root.mkdir()
    for i in range(n):
        (root / f"f{i}").write_bytes(os.urandom(SIZE) + bytes([i]))
    return root


def _resident(c: Cache, src: Path) -> list[str]:
    return sorted(e.url for e in c.entries(str(src) + "/") if e.tier == "ram")


def _counts(result: object) -> tuple[int, int, int, int]:
    r = result
    return (r.evicted_own, r.demoted_own, r.demoted_full, r.not_resident)  # type: ignore[attr-defined]


def test_disk_entries_left_on_disk_by_a_ram_preload_are_counted(tmp_path: Path, ram_dir: Path) -> None:
    src = _source(tmp_path / "src")
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        assert c.preload([str(src)], tier="disk").objects == 5
    with Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit=2500) as c:
        result = c.preload([str(src)], tier="ram")
        assert result.skipped == 5 and not result.failed
        assert _counts(result) == (0, 0, 0, 5)  # (old: (0, 0, 0) and no not_resident)
        assert _resident(c, src) == []


def test_a_second_ram_preload_of_a_set_too_big_counts_what_is_on_disk(tmp_path: Path, ram_dir: Path) -> None:
    src = _source(tmp_path / "src")
    with Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit=2500) as c:
        first = c.preload([str(src)], tier="ram")
        assert (first.objects, first.demoted_own) == (5, 3)
        second = c.preload([str(src)], tier="ram")
        assert second.skipped == 5
        assert _counts(second) == (0, 0, 0, 3)
        assert len(_resident(c, src)) == 2


def test_a_lowered_ram_limit_counts_what_it_moved_to_disk(tmp_path: Path, ram_dir: Path) -> None:
    src = _source(tmp_path / "src")
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        assert c.preload([str(src)], tier="ram").objects == 5
    with Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit=2500) as c:
        result = c.preload([str(src)], tier="ram")  # the lower cap demotes 3 before the run
        assert result.skipped == 5
        assert _counts(result) == (0, 0, 0, 3)


def test_resident_entries_pushed_out_by_the_runs_own_landings_are_counted(
    tmp_path: Path, ram_dir: Path
) -> None:
    src = _source(tmp_path / "src", 2)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        assert c.preload([str(src)], tier="ram").objects == 2
    (src / "f2").write_bytes(os.urandom(SIZE) + b"2")
    with Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit=2500) as c:
        result = c.preload([str(src)], tier="ram")
        # f2 lands in RAM and pushes f0 (least recently used) to disk: of this run's own landing
        # nothing moved, so demoted_own is 0, but the set is not all in RAM
        assert (result.objects, result.skipped) == (1, 2)
        assert _counts(result) == (0, 0, 0, 1)
        assert len(_resident(c, src)) == 2


def test_a_set_that_fits_reports_nothing_left_behind(tmp_path: Path, ram_dir: Path) -> None:
    src = _source(tmp_path / "src")
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        c.preload([str(src)], tier="disk")
        assert _counts(c.preload([str(src)], tier="ram")) == (0, 0, 0, 0)  # promoted, all of it
        assert _counts(c.preload([str(src)], tier="ram")) == (0, 0, 0, 0)
        assert len(_resident(c, src)) == 5


def test_a_clock_stepped_back_mid_run_is_no_eviction(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's landings are stamped an hour before the run started; none was evicted."""
    src = _source(tmp_path / "src")
    with Cache(tmp_path / "c", ram_dir=ram_dir, disk_limit=5 * (SIZE + 1)) as c:
        real = time.time
        calls = [0]

        def stepped() -> float:
            calls[0] += 1
            return real() if calls[0] == 1 else real() - 3600.0  # the first: the run's start

        monkeypatch.setattr(time, "time", stepped)
        result = c.preload([str(src)], tier="disk")
        monkeypatch.setattr(time, "time", real)
        assert result.objects == 5
        assert (result.evicted_own, result.demoted_own) == (0, 0)  # (old: evicted_own 5)
        assert len(c.entries(str(src) + "/")) == 5
