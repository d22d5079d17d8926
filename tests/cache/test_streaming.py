"""`rq preload` fetches a listing's first pages while later ones are still being listed.

The origin here is a real directory whose listing is made to pause after its first page until an
object has landed (or 60 s pass): a preloader that waits for the whole listing before fetching
cannot see one land, and the pause runs out. The same origin then fails after its first page."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cache.preload as preload_module
from cache import Cache
from cache import events as ev
from cache.errors import CacheError, OriginError
from cache.landing import ObjectInfo
from cache.origins import LocalOrigin

PAGE = 5


class PausingOrigin(LocalOrigin):
    """Lists PAGE objects, then waits until `landed` is set (or 60 s); optionally fails there."""

    def __init__(self, root: Path, landed: threading.Event, fail: bool = False):
        super().__init__(root)
        self.landed, self.fail = landed, fail
        self.saw_a_landing: bool | None = None

    def list(self) -> Iterator[ObjectInfo]:
        for n, info in enumerate(super().list()):
            if n == PAGE:
                self.saw_a_landing = self.landed.wait(60)
                if self.fail:
                    raise OriginError("the store went away after the first page")
            yield info


@pytest.fixture
def origin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "origin"
    d.mkdir()
    for i in range(3 * PAGE):
        (d / f"f{i:02d}").write_bytes(os.urandom(64 << 10))
    return d


def run(
    tmp_path: Path, ram_dir: Path, origin: PausingOrigin, monkeypatch: pytest.MonkeyPatch
) -> tuple[Cache, Any, list[ev.Event]]:
    monkeypatch.setattr(preload_module, "PAGE", PAGE)
    monkeypatch.setattr(preload_module, "parse_source", lambda source, settings: origin)
    events: list[ev.Event] = []

    def on_event(event: ev.Event) -> None:
        events.append(event)
        if isinstance(event, ev.Landed):
            origin.landed.set()

    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    try:
        return c, c.preload([str(origin.root)], on_event=on_event), events
    except Exception as exc:
        return c, exc, events


def test_fetching_starts_before_the_listing_ends(
    tmp_path: Path, ram_dir: Path, origin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin = PausingOrigin(origin_dir, threading.Event())
    c, result, events = run(tmp_path, ram_dir, origin, monkeypatch)
    assert origin.saw_a_landing is True  # an object of page 1 landed while page 2 was being listed
    assert result.objects == 3 * PAGE and not result.failed
    planned = [e for e in events if isinstance(e, ev.Planned)]
    assert len(planned) == 3 and planned[-1].objects == 3 * PAGE  # totals so far, page by page
    assert planned[-1].bytes == 3 * PAGE * (64 << 10)
    checked, problems = c.verify()
    assert checked == 3 * PAGE and problems == []
    c.close()


def test_a_listing_that_fails_midway_stops_the_run_and_keeps_what_landed(
    tmp_path: Path, ram_dir: Path, origin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin = PausingOrigin(origin_dir, threading.Event(), fail=True)
    c, result, _ = run(tmp_path, ram_dir, origin, monkeypatch)
    assert isinstance(result, OriginError) and "after the first page" in str(result)
    kept = c.entries()
    assert 1 <= len(kept) < 3 * PAGE  # some of page 1 landed, the unlisted rest never started
    assert c.verify() == (len(kept), [])
    c.close()
    # what landed before the failure is whole and indexed; a rerun fetches only the rest
    monkeypatch.setattr(preload_module, "parse_source", lambda source, settings: LocalOrigin(origin_dir))
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    again = c.preload([str(origin_dir)])
    assert (again.skipped, again.objects) == (len(kept), 3 * PAGE - len(kept))
    for i in range(3 * PAGE):
        url = str(origin_dir / f"f{i:02d}")
        assert c.path(url).read_bytes() == (origin_dir / f"f{i:02d}").read_bytes()
    c.close()


def test_a_bad_later_source_stops_the_run_before_anything_is_fetched(
    tmp_path: Path, ram_dir: Path, origin_dir: Path
) -> None:
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    for bad in (tmp_path / "no-such-dir", "ftp://x/y"):
        with pytest.raises(CacheError):
            c.preload([str(origin_dir), str(bad)])
        assert c.entries() == []  # the good first source was not fetched either
    c.close()


def test_a_symlink_loop_and_a_dangling_link_are_skipped(
    tmp_path: Path, ram_dir: Path, origin_dir: Path
) -> None:
    sub = origin_dir / "zsub"
    sub.mkdir()
    (sub / "a").symlink_to("b")
    (sub / "b").symlink_to("a")
    (sub / "gone").symlink_to("nowhere")
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    result = c.preload([str(origin_dir)])
    assert (result.objects, result.failed) == (3 * PAGE, [])
    c.close()


def test_an_unreadable_entry_is_one_cache_error_with_what_landed_kept(
    tmp_path: Path, ram_dir: Path, origin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError from a listing (here EIO from stat after the first page) ends the run as a
    CacheError, which the CLI reports with its --json summary, and what landed stays."""
    origin = PausingOrigin(origin_dir, threading.Event())

    def listing() -> Iterator[ObjectInfo]:
        for n, info in enumerate(LocalOrigin.list(origin)):
            if n == PAGE:
                origin.landed.wait(60)
                raise OSError(errno.EIO, "Input/output error")
            yield info

    monkeypatch.setattr(origin, "list", listing)
    c, result, _ = run(tmp_path, ram_dir, origin, monkeypatch)
    assert isinstance(result, CacheError) and "Input/output error" in str(result), result
    landed = c.entries()
    assert 1 <= len(landed) <= PAGE and c.verify() == (len(landed), [])
    c.close()


class CountingOrigin(LocalOrigin):
    """Counts what its listing handed out, and how far that ran ahead of what had landed."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.landed = 0
        self.most_ahead = 0

    def list(self) -> Iterator[ObjectInfo]:
        for n, info in enumerate(super().list()):
            self.most_ahead = max(self.most_ahead, n + 1 - self.landed)
            yield info


def preload_counting(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch, files: int
) -> tuple[Any, CountingOrigin]:
    """Preloads `files` tiny local files listed in pages of 50 through a CountingOrigin."""
    d = tmp_path / "many"
    d.mkdir()
    for i in range(files):
        (d / f"f{i:04d}").write_bytes(b"%d" % i)
    monkeypatch.setattr(preload_module, "PAGE", 50)
    origin = CountingOrigin(d)
    monkeypatch.setattr(preload_module, "parse_source", lambda source, settings: origin)

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.Landed):
            origin.landed += 1

    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    try:
        result = c.preload([str(d)], workers=4, on_event=on_event)
    finally:
        c.close()
    assert result.objects == files and not result.failed
    return result, origin


def test_the_listing_stays_a_few_pages_ahead_of_the_fetching(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 3: memory stays bounded however big the dataset. Listing runs far faster than
    # fetching (here: thousands of tiny files, each fsynced and indexed), so without backpressure
    # the whole listing is in memory long before the last objects land.
    result, origin = preload_counting(tmp_path, ram_dir, monkeypatch, 3000)
    assert result.planned == [] and result.planned_objects == 3000  # counts, not a list per object
    # planned and waiting to start (< 64 + a page), two pages delivered, one being built, a batch
    # waiting to land (64) and the requests in flight: well under a thousand
    assert origin.most_ahead < 1000, origin.most_ahead


def test_a_slow_publish_holds_back_new_work_instead_of_queueing_it(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Landed objects wait for the one batch being published (syncfs, link, syncfs); while a
    # publish is slow (a loaded disk), fetching kept going and the objects waiting to land grew
    # without bound (1,182 listed ahead of the landed in a loaded run). New work now waits.
    import cache.fetcher as fetcher_module

    publish = fetcher_module.Fetcher._publish

    def slow_publish(self: Any, items: Any) -> Any:
        time.sleep(0.3)
        return publish(self, items)

    monkeypatch.setattr(fetcher_module.Fetcher, "_publish", slow_publish)
    _, origin = preload_counting(tmp_path, ram_dir, monkeypatch, 1500)
    # a batch being published, at most MAX_TO_LAND waiting, the pages and requests of the test above
    assert origin.most_ahead < 1000, origin.most_ahead


class PagingOrigin(LocalOrigin):
    """Records how many objects each list() call yielded; on call `pause_on` it waits after PAGE
    objects until `go` is set (or 60 s) and records whether it was."""

    def __init__(self, root: Path, go: threading.Event, pause_on: int):
        super().__init__(root)
        self.go, self.pause_on = go, pause_on
        self.yielded: list[int] = []
        self.went: bool | None = None

    def list(self) -> Iterator[ObjectInfo]:
        self.yielded.append(0)
        for n, info in enumerate(super().list()):
            if n == PAGE and len(self.yielded) == self.pause_on:
                self.went = self.go.wait(60)
            self.yielded[-1] += 1
            yield info


def _preload(
    tmp_path: Path, ram_dir: Path, origin: LocalOrigin, monkeypatch: pytest.MonkeyPatch, **kwargs: Any
) -> tuple[Cache, Any, list[ev.Event]]:
    monkeypatch.setattr(preload_module, "PAGE", PAGE)
    monkeypatch.setattr(preload_module, "parse_source", lambda source, settings: origin)
    events: list[ev.Event] = []
    c = Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit=kwargs.pop("ram_limit", None))
    return c, c.preload([str(origin.root)], on_event=events.append, **kwargs), events


def test_a_dry_run_reports_each_page_as_it_is_listed(
    tmp_path: Path, ram_dir: Path, origin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dry run over millions of objects must not hold them all: the first page's plan is out
    while the second is being listed (it used to list everything, then report)."""
    go = threading.Event()
    origin = PagingOrigin(origin_dir, go, pause_on=1)

    def seen(event: ev.Event) -> None:
        if isinstance(event, ev.WouldFetch):
            go.set()

    monkeypatch.setattr(preload_module, "PAGE", PAGE)
    monkeypatch.setattr(preload_module, "parse_source", lambda source, settings: origin)
    events: list[ev.Event] = []
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    result = c.preload(
        [str(origin_dir)], dry_run=True, keep_planned=False, on_event=lambda e: (events.append(e), seen(e))
    )
    assert origin.went is True
    plan = [e for e in events if isinstance(e, ev.WouldFetch)]
    assert sorted(e.url for e in plan) == sorted(str(p) for p in origin_dir.iterdir())
    assert result.planned == [] and result.planned_objects == 3 * PAGE  # counted, not kept
    assert c.entries() == []
    c.close()


def test_the_ram_tier_streams_after_asking_whether_the_set_fits(
    tmp_path: Path, ram_dir: Path, origin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--tier ram used to hold the whole listing to ask whether the set fits the RAM cap. Now a
    first pass keeps only a sum, and the second streams like the disk tier: an object of page 1
    lands while page 2 is being listed."""
    landed = threading.Event()
    origin = PagingOrigin(origin_dir, landed, pause_on=2)
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    c.preload([str(origin_dir)], tier="disk")  # disk copies to promote
    c.close()
    monkeypatch.setattr(preload_module, "PAGE", PAGE)
    monkeypatch.setattr(preload_module, "parse_source", lambda source, settings: origin)
    c = Cache(tmp_path / "c", ram_dir=ram_dir)

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.Landed):
            landed.set()

    result = c.preload([str(origin_dir)], tier="ram", on_event=on_event)
    assert origin.went is True and origin.yielded == [3 * PAGE, 3 * PAGE]
    assert result.objects == 3 * PAGE and not result.failed  # the set fits: all promoted
    assert {e.tier for e in c.entries()} == {"ram"}
    c.close()


def test_a_set_bigger_than_the_ram_cap_is_not_listed_twice(
    tmp_path: Path, ram_dir: Path, origin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fit pass stops once the sum passes the cap: here after the first page."""
    origin = PagingOrigin(origin_dir, threading.Event(), pause_on=0)
    c, result, _ = _preload(tmp_path, ram_dir, origin, monkeypatch, tier="ram", ram_limit=2 * (64 << 10))
    assert origin.yielded[0] <= PAGE + 1 and origin.yielded[1:] == [3 * PAGE]
    assert result.objects == 3 * PAGE and not result.failed
    c.close()
