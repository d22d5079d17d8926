"""The preload planner: list every source, filter, skip what is cached at the same version, fetch the rest."""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cache import events as ev
from cache.errors import BadSourceError, CacheError, NotFoundError
from cache.fetcher import Fetcher, FetchResult, Job, start_thread
from cache.landing import ObjectInfo, clean_version
from cache.origins import LocalOrigin, Origin, S3Origin, parse_source, same_version
from cache.s3 import Listing, S3Settings, list_prefix, split_s3_url
from cache.sizes import format_size


@dataclass
class PreloadResult:
    objects: int = 0  # fetched in this run
    bytes: int = 0
    skipped: int = 0  # already cached at the same version
    skipped_bytes: int = 0
    resumed_bytes: int = 0  # bytes of big objects resumed from an interrupted run's pieces
    throttled: int = 0  # objects the store throttled past the client's own retries
    smallest_window: int = 0  # fewest requests in flight after backing off
    failed: list[ev.Failed] = field(default_factory=list)
    seconds: float = 0.0
    planned_objects: int = 0  # to fetch (or promote) after the skips
    planned_bytes: int = 0
    # the objects a dry run would fetch; a real run keeps no list per object (issue 3: memory stays
    # bounded however big the dataset), only the counts above
    planned: list[ObjectInfo] = field(default_factory=list)
    evicted_own: int = 0  # landed by this run, then evicted by it again (the tier's cap is too small)
    demoted_own: int = 0  # landed in RAM by this run, then moved to disk to make room
    # asked for in RAM, on disk: the RAM tier's file system was full below its cap (others' files)
    # and evicting RAM entries could not make room, so they landed on disk, or (cached there
    # already) stayed there (events.Demoted, one per object)
    demoted_full: int = 0
    # keys the store listed outside a source's prefix, or twice: not fetched (events.Ignored for
    # the first IGNORED_REPORTED, all counted here)
    ignored: int = 0
    # (tier="ram") objects of the set cached before this run that it leaves in the disk tier: on
    # disk already and not promoted (the set is bigger than the RAM cap, so promoting would only
    # trade places with itself), or in RAM when it started and moved to disk by its own landings
    # or by a lowered --ram-limit. Not in evicted_own/demoted_own/demoted_full, which count only
    # what this run landed: a script that needs the whole set in RAM checks all four are 0
    not_resident: int = 0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


# a store that ignores the prefix may list a whole bucket: an event for each key would be a flood
IGNORED_REPORTED = 10
PAGE = 1000  # objects handed to the fetcher at once: one ListObjectsV2 page


def matches(key: str, include: Iterable[str], exclude: Iterable[str]) -> bool:
    """--include/--exclude globs match the key relative to the source (`*` crosses `/`); pages()
    drops a leading `/` (rclone's way of anchoring a pattern at the source: keys already are)."""
    inc = list(include)
    if inc and not any(fnmatch.fnmatchcase(key, g) for g in inc):
        return False
    return not any(fnmatch.fnmatchcase(key, g) for g in exclude)


Page = list[tuple[ObjectInfo, Origin]]


def check_sources(sources: list[str], settings: S3Settings) -> None:
    """Raises BadSourceError for a source that is no URL or path rq can read (a bad scheme, an
    s3:// URL with no bucket), before anything is created: no cache dir, no RAM root."""
    for source in sources:
        parse_source(source, settings)


def check_sources_exist(
    sources: list[str], settings: S3Settings, include: Iterable[str] = (), exclude: Iterable[str] = ()
) -> None:
    """Raises the listing's own error for a source that is not there (a missing directory or
    bucket, a prefix with no keys, credentials refused), and pages()'s "none of the N objects
    listed matches" for filters that select nothing, as pages() would: `rq preload` asks before it
    makes a new cache, so such a typo creates nothing. Each source is looked at up to one page
    (an S3 listing's first page, started by start_listings and left for pages() to take; a
    directory's first PAGE files): filters that match nothing there, on a source listed further,
    pass, and pages() finds it out after the cache is made."""
    include, exclude = _anchored(include), _anchored(exclude)
    listed, selected, whole = 0, not (include or exclude), True
    for source in sources:
        origin = parse_source(source, settings)
        if isinstance(origin, LocalOrigin):
            infos = [i for i in itertools.islice(_listed(source, origin), PAGE + 1) if i is not None]
            last = len(infos) <= PAGE
            del infos[PAGE:]
            missing = f"no files under {source}"
        else:
            origin.list_prefix = list_prefix(origin.prefix, include)
            items, error, last = origin.client.first_listing_page(origin.bucket, origin.list_prefix)
            if error is not None:
                raise error
            infos = [info for info in origin.objects(items) if info is not None]
            missing = ""  # (_nothing_selected tells)
        if not infos and not last:
            whole = False  # siblings of s3://b/name on the first page: the rest may hold it
            continue
        if not infos:
            raise (
                NotFoundError(missing)
                if isinstance(origin, LocalOrigin)
                else _nothing_selected(source, origin)
            )
        listed += len(infos)
        whole = whole and last
        selected = selected or any(_offered(info, include, exclude) for info in infos)
    if not selected and whole:
        raise NotFoundError(f"none of the {listed} objects listed matches --include/--exclude")


class _OnePage(Listing):
    ahead = 1


def _nothing_selected(source: str, origin: S3Origin) -> NotFoundError:
    """The error for an S3 source whose narrowed listing (list_prefix) gave nothing: the source is
    empty or missing ("no objects under SRC"), or its keys are there and the filter selects none,
    which must not read as a missing source. One page of the source's own prefix tells."""
    if origin.list_prefix == origin.prefix:
        return _no_objects(source, origin)
    # one page of the source's own prefix, and no more asked for (ahead=1: the next is asked for
    # only when this one is read through marked(), which first_page() does not)
    items, error, _ = _OnePage(origin.client, origin.bucket, origin.prefix).first_page()
    any_key = error is None and any(not (key.endswith("/") and size == 0) for key, size, *_ in items)
    if not any_key:
        return _no_objects(source, origin)
    lit = origin.list_prefix[len(origin.prefix) :]
    return NotFoundError(
        f"none of the objects under {source} matches --include/--exclude (no key there starts with {lit!r})"
    )


def _no_objects(source: str, origin: S3Origin) -> NotFoundError:
    """An S3 source with no keys. `s3://b/key.bin/` names the prefix `key.bin/`, as for s5cmd and
    aws (nothing there): where `key.bin` is an object, the error names it without the slash, as a
    local `dir/file.bin/` is refused (LocalOrigin.list)."""
    prefix = origin.prefix
    if len(prefix) > 1 and prefix.endswith("/") and not prefix.endswith("//"):
        try:
            origin.client.head(origin.bucket, prefix[:-1])
        except CacheError:
            pass  # (not there, or not to be asked: the source is empty as it stands)
        else:
            url = f"s3://{origin.bucket}/{prefix[:-1]}"
            return NotFoundError(
                f"no objects under {source}: {url} is an object, not a prefix (drop the trailing /)"
            )
    return NotFoundError(f"no objects under {source}")


def _anchored(globs: Iterable[str]) -> list[str]:
    """rclone anchors a pattern at the source with a leading `/`: keys already are."""
    return [g.lstrip("/") for g in globs]


def _offered(info: ObjectInfo, include: list[str], exclude: list[str]) -> bool:
    # what a listing could not offer is reported whatever the filters: it may hold matches
    return info.problem is not None or matches(info.key, include, exclude)


def pages(
    sources: list[str],
    settings: S3Settings,
    include: Iterable[str],
    exclude: Iterable[str],
    workers: int,
    stopped: Callable[[], bool] = lambda: False,
    skip_dirs: frozenset[tuple[int, int]] = frozenset(),
    on_ignored: Callable[[str, str], None] | None = None,
) -> Iterator[Page]:
    """Every source's objects that pass the filters, each once, up to PAGE at a time. Local
    sources do not descend into `skip_dirs` ((st_dev, st_ino): the cache's own directories).

    Every source is checked before the first page is handed on (a URL it cannot parse, a directory
    that is not there, a bucket or prefix with no objects): a typo in the last source must stop the
    run before the first one's objects are fetched, and maybe other entries evicted for them."""
    include, exclude = _anchored(include), _anchored(exclude)
    listings = []
    for source in sources:
        origin = parse_source(source, settings)
        if isinstance(origin, LocalOrigin):
            origin.workers = min(workers, 32)
            origin.skip_dirs = skip_dirs
        else:
            origin.list_prefix = list_prefix(origin.prefix, include)
            if on_ignored is not None:
                origin.on_ignored = on_ignored
        listed = _listed(source, origin, marked=True)
        first = next((info for info in listed if info is not None), None)
        if first is None:
            # an empty source is a typo far more often than an intent: say so, as for a pattern
            if isinstance(origin, S3Origin):
                raise _nothing_selected(source, origin)
            raise NotFoundError(f"no files under {source}")
        listings.append((origin, first, listed))
    listed_count = offered = 0
    # one source lists each object once; only several (which may overlap) need the names seen so far
    seen: set[str] | None = set() if len(listings) > 1 else None
    for origin, first, listed in listings:
        if first is None:
            continue
        page: Page = []
        for info in itertools.chain([first], listed):
            if stopped():
                return
            if info is None:
                # a page of the store's listing ended: what it gave moves now, not once a
                # thousand more match (a sparse --include, a store sending empty pages)
                if page:
                    yield page
                    page = []
                continue
            listed_count += 1
            if not _offered(info, include, exclude):
                continue
            offered += 1
            if seen is not None:
                if info.url in seen:
                    continue
                seen.add(info.url)
            page.append((info, origin))
            if len(page) >= PAGE:
                yield page
                page = []
        if page:
            yield page
    if not offered and (include or exclude):
        # CI scripts must not pass on a pattern that matched nothing (a typo, a wrong anchor)
        raise NotFoundError(f"none of the {listed_count} objects listed matches --include/--exclude")


def _dir_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _listed(source: str, origin: Origin, marked: bool = False) -> Iterator[ObjectInfo | None]:
    """An origin's listing; an OSError from it is the cache's one-line error, not a bare one.
    `marked`: with None where a page of an S3 listing ends (S3Origin.marked)."""
    try:
        yield from origin.marked() if marked and isinstance(origin, S3Origin) else origin.list()
    except OSError as exc:
        raise CacheError(f"cannot list {source}: {exc.strerror or exc}") from None


class ListingFeed:
    """The sources listed on a thread of their own and handed to the fetcher a page at a time, so
    fetching starts with the first page: a prefix of a million objects is a thousand pages, seconds
    of listing that used to pass before the first byte moved. Pages are planned (checked against
    the index) on the fetcher's thread, which alone uses the index.

    At most AHEAD pages are delivered and not yet planned: listing is far faster than fetching, and
    a prefix of millions of objects must not pile up in memory (issue 3: memory stays bounded
    however big the dataset). The fetcher plans a page only when its queue of jobs runs low."""

    AHEAD = 2

    def __init__(
        self, listing: Callable[[Callable[[], bool]], Iterator[Page]], prepare: Callable[[Page], list[Job]]
    ):
        self._listing = listing
        self._prepare = prepare
        self._stopped = False
        self._credit = threading.Semaphore(self.AHEAD)

    def start(self, deliver: Callable[[object], None]) -> None:
        def run() -> None:
            try:
                for page in self._listing(lambda: self._stopped):
                    while not self._credit.acquire(timeout=0.1):
                        if self._stopped:
                            return
                    deliver(page)
            except BaseException as exc:  # reported to the fetcher, which stops the run with it
                deliver(exc)
            else:
                deliver(None)

        # (a listing thread that cannot start: ThreadLimitError, exit 1 with one line, not
        # "unexpected RuntimeError")
        start_thread(threading.Thread(target=run, name="rq-list", daemon=True))

    def jobs(self, page: object) -> list[Job]:
        self._credit.release()
        return self._prepare(page)  # type: ignore[arg-type]

    def stop(self) -> None:
        self._stopped = True


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def run_preload(
    cache: object,
    sources: list[str],
    *,
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
    tier: str = "disk",
    workers: int = 256,
    dry_run: bool = False,
    keep_planned: bool = True,
    on_event: ev.EventSink = ev.ignore,
) -> PreloadResult:
    """`keep_planned=False`: a dry run reports its plan only through WouldFetch events, without
    a list in `PreloadResult.planned` (rq preload --dry-run over millions of objects)."""
    from cache.api import Cache, _check_tier, _PromoteOrigin

    assert isinstance(cache, Cache)
    # one string where a list belongs would be read a character at a time: include="*.tar" as
    # ["*", ".", …] matched every key and fetched the whole dataset
    for name, value in (("sources", sources), ("include", include), ("exclude", exclude)):
        if isinstance(value, str | bytes):
            raise BadSourceError(f"{name} takes a list of strings, not one string: [{value!r}]")
    _check_tier(tier)
    # before the cache is touched (its sweeps, a RAM root made again): sources=[""] named the
    # current directory and cached whatever was there
    check_sources(sources, cache.s3_settings)
    started = time.monotonic()
    started_wall = time.time()
    state = cache._state()
    if tier == "ram" and not dry_run:
        # a RAM root removed under a long-running process (a tmp cleaner, RemoveIPC) is made
        # again, as Cache.open does: every landing into it failed on the missing tmp/
        cache._ensure_ram_root()
    state.store.collect()
    # a lowered cap evicts down to itself once the listing has delivered its first page, not
    # before: a typo'd bucket with --disk-limit lowered the cap, evicted the cache and failed
    # (restore_limits put the old cap back, but not the evicted entries)
    shrunk = dry_run
    result = PreloadResult()
    promote = False  # (decided below for the RAM tier, before anything is planned)

    def prepare(page: Page) -> list[Job]:
        """One page: skip what is cached at the same version, report what is not UTF-8, and return
        the rest to fetch, small objects first (they fill the pipe while big ones stream)."""
        nonlocal shrunk
        if not shrunk:
            shrunk = True
            state.store.shrink()
        items = []
        cap = state.store.cap(tier)

        def fail(info: ObjectInfo, kind: str, why: str) -> None:
            shown = info.url.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            failure = ev.Failed(shown, kind, why)
            result.failed.append(failure)
            on_event(failure)

        for info, origin in page:
            if info.problem is not None:
                fail(info, info.problem_kind, info.problem)
            elif not _utf8(info.url):  # the index keys entries by URL text: rename such a file
                fail(info, "bad_name", "file name is not valid UTF-8; rename it to cache it")
            elif info.size > cap:  # fails alone: the rest of the set may well fit
                fail(
                    info,
                    "no_space",
                    f"{format_size(info.size)} is more than the {tier} tier's cap of "
                    f"{format_size(cap)}; raise --{tier}-limit",
                )
            else:
                items.append((info, origin))
        cached = state.index.get_many(info.url for info, _ in items)
        todo: list[Job] = []
        fresh: list[str] = []
        for info, origin in items:
            entry = cached.get(info.url)
            # an entry whose file is gone (deleted by hand, or an emptied /dev/shm) is a miss: a
            # stat each is the price of never reporting "already cached" for data that is not there
            # (a racy entry, its directory origin file changed within its timestamp tick of being
            # read: the origin file is hashed again, Cache._current; changed, it is fetched again)
            if (
                entry is not None
                and same_version(clean_version(entry.version), info.version)
                and os.path.exists(cache.layout.blob_path(entry.tier, entry.blob))
                and cache._current(entry, info)
            ):
                if promote and entry.tier == "disk":
                    path = cache.layout.blob_path(entry.tier, entry.blob)
                    # a copy of a racy entry stays racy
                    as_cached = dataclasses.replace(info, version=entry.version)
                    todo.append(Job(as_cached, _PromoteOrigin(path, entry, fallback=origin)))
                    continue
                result.skipped += 1
                result.skipped_bytes += info.size
                fresh.append(info.url)
                continue
            todo.append(Job(info, origin))
        if dry_run:
            for job in todo:
                on_event(ev.WouldFetch(job.info.url, job.info.size))
            if keep_planned:
                result.planned += [j.info for j in todo]
        result.planned_objects += len(todo)
        result.planned_bytes += sum(j.info.size for j in todo)
        on_event(
            ev.Planned(result.planned_objects, result.planned_bytes, result.skipped, result.skipped_bytes)
        )
        if fresh:
            state.index.mark_checked(fresh, time.time())
        todo.sort(key=lambda j: j.big)
        return todo

    # a cache dir inside a local source must not cache itself (its index changes as it is copied)
    own_dirs = frozenset(d for d in map(_dir_id, (cache.root, cache.layout.ram_root)) if d)

    def ignored(url: str, why: str) -> None:
        result.ignored += 1
        if result.ignored <= IGNORED_REPORTED:
            on_event(ev.Ignored(url, why))

    def listing(stopped: Callable[[], bool] = lambda: False, report: bool = True) -> Iterator[Page]:
        return pages(
            sources,
            cache.s3_settings,
            include,
            exclude,
            workers,
            stopped,
            own_dirs,
            ignored if report else None,
        )

    fetcher = Fetcher(
        state.store, cache.layout, tier, workers, on_event, durable=cache.durable, batch_sync=True
    )
    if tier == "ram":
        # RAM promotes disk copies (verified, local) only when the whole set fits its cap: a set
        # that does not would only trade places with itself on every run. Asked by a listing pass
        # of its own that keeps nothing but a sum and stops once the sum passes the cap, so memory
        # stays bounded however many objects there are (a second LIST per 1,000 objects)
        promote = _fits(listing, state.store.cap("ram"))
    if dry_run:
        for page in listing():
            prepare(page)  # reports each object (WouldFetch) and counts; nothing is fetched
        result.smallest_window = workers
        result.seconds = time.monotonic() - started
        return result
    fetched = fetcher.run([], feed=ListingFeed(listing, prepare))
    result.objects = fetched.objects
    result.bytes = fetched.landed_bytes
    since = _since(started_wall, started)
    result.evicted_own, result.demoted_own = _pushed_out(state, tier, sources, since, fetched)
    result.demoted_full = fetched.demoted
    if tier == "ram":
        result.not_resident = _left_on_disk(state, sources, since, fetched, promote)
    result.failed += fetched.failed
    result.resumed_bytes = fetched.resumed_bytes
    result.throttled = fetched.throttled
    result.smallest_window = fetched.smallest_window
    result.seconds = time.monotonic() - started
    return result


def _fits(listing: Callable[[Callable[[], bool], bool], Iterator[Page]], cap: int) -> bool:
    """Whether the sources' objects together fit in `cap` bytes; stops listing once they do not."""
    total = 0

    def over() -> bool:
        return total > cap

    for page in listing(over, False):  # (what the listing ignores is reported by the run's own)
        total += sum(info.size for info, _ in page)
    return not over()


def _since(started_wall: float, started: float) -> float:
    """The wall-clock time from which the index's stamps (`created`, `checked_at`: time.time()
    when written) are this run's. A clock stepped back during the run (NTP, a resumed VM) stamps
    this run's landings before `started_wall`: they would count as pushed out (a false warning)
    and its skips as not this run's. Lowered by the step, read as the wall clock's lag behind the
    monotonic one; a step forward needs nothing (later stamps are still >= started_wall)."""
    lag = (time.time() - started_wall) - (time.monotonic() - started)
    return started_wall + min(0.0, lag)


def _left_on_disk(state: Any, sources: list[str], since: float, fetched: FetchResult, promote: bool) -> int:
    """(tier="ram") How many objects of the set that were cached before the run are in the disk
    tier now: entries under the sources' prefixes that this run checked (a skip stamps
    `checked_at`) but did not land (`created` before the run). A demotion keeps both stamps, so an
    entry that was in RAM when the run started and was pushed out by the run's own landings (or
    by the lowered cap, before any of them) counts too. Skipped when nothing can be there: every
    disk copy was promoted, and the RAM tier stayed below its cap by more than an object."""
    if promote:
        if not fetched.objects:
            return 0
        usage = state.index.usage()["ram"]
        if usage["bytes"] + usage["held"] + fetched.largest <= state.store.cap("ram"):
            return 0
    prefixes = _disjoint(p for source in sources for p in _url_prefixes(source))
    return int(state.index.checked_not_created_since(since, prefixes).get("disk", 0))


def _pushed_out(
    state: Any, tier: str, sources: list[str], since: float, fetched: FetchResult
) -> tuple[int, int]:
    """(evicted, demoted): how many objects this run landed and then pushed out of `tier` again,
    counted without a list of what landed (a run may land millions). LRU evicts this run's
    entries last, and only just enough of them, so when it did the tier stays within one object
    of its cap: below that, nothing was. Otherwise the index counts this run's entries by landing
    time under the sources' URL prefixes (another process landing under them at the same time
    would make the counts low). Demoted applies to the RAM tier only."""
    if not fetched.objects:
        return 0, 0
    usage = state.index.usage()[tier]
    if usage["bytes"] + usage["held"] + fetched.largest <= state.store.cap(tier):
        return 0, 0
    prefixes = _disjoint(p for source in sources for p in _url_prefixes(source))
    counts = state.index.created_since(since, prefixes)
    here = counts.get(tier, 0)
    # an entry of ours in the other tier is still cached, not evicted; only RAM demotes (to disk):
    # new RAM entries beside a disk run are another process's landings (a parallel --tier ram
    # preload) or ours promoted by a reader, never moved there by this run
    elsewhere = sum(n for t, n in counts.items() if t != tier)
    # (those that landed on disk because the RAM file system was full were never in RAM: neither
    # demoted nor evicted, they are counted apart, fetched.demoted; subtracted from `elsewhere`
    # before the eviction count, they were counted evicted)
    demoted = min(max(0, elsewhere - fetched.demoted), fetched.objects) if tier == "ram" else 0
    return max(0, fetched.objects - here - elsewhere), demoted


def _url_prefixes(source: str) -> list[str]:
    """What the URLs of a source's objects start with (the index keys entries by URL). A
    directory's ends with a separator, so that /d does not also cover /d2. An S3 prefix with `//`
    also covers the same prefix with the slashes merged: what a store like SeaweedFS lists for it."""
    if source.startswith("s3://"):
        bucket, prefix = split_s3_url(source)
        # (a prefix without a slash lists p* too: so it covers it)
        return sorted({f"s3://{bucket}/{prefix}", f"s3://{bucket}/{re.sub('/{2,}', '/', prefix)}"})
    path = os.path.abspath(source)
    return [path.rstrip(os.sep) + os.sep if os.path.isdir(path) else path]


def _disjoint(prefixes: Iterable[str]) -> list[str]:
    """The prefixes that no other one covers: overlapping sources (/d and /d/sub) must not count
    an entry twice."""
    kept: list[str] = []
    for prefix in sorted(set(prefixes)):  # a prefix sorts before everything it covers
        if not kept or not prefix.startswith(kept[-1]):
            kept.append(prefix)
    return kept
