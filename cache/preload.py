"""The preload planner: list every source, filter, skip what is cached at the same version, fetch the rest."""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from cache import events as ev
from cache.errors import NotFoundError
from cache.fetcher import Fetcher, Job
from cache.landing import ObjectInfo
from cache.origins import LocalOrigin, Origin, parse_source
from cache.s3 import S3Settings


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
    planned: list[ObjectInfo] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def matches(key: str, include: Iterable[str], exclude: Iterable[str]) -> bool:
    """--include/--exclude globs match the key relative to the source (`*` crosses `/`)."""
    inc = list(include)
    if inc and not any(fnmatch.fnmatchcase(key, g) for g in inc):
        return False
    return not any(fnmatch.fnmatchcase(key, g) for g in exclude)


def plan(
    sources: list[str], settings: S3Settings, include: Iterable[str], exclude: Iterable[str], workers: int
) -> list[tuple[ObjectInfo, Origin]]:
    out: list[tuple[ObjectInfo, Origin]] = []
    seen: set[str] = set()
    for source in sources:
        origin = parse_source(source, settings)
        if isinstance(origin, LocalOrigin):
            origin.workers = min(workers, 32)
        n = 0
        for info in origin.list():
            n += 1
            if info.url in seen or not matches(info.key, include, exclude):
                continue
            seen.add(info.url)
            out.append((info, origin))
        if n == 0 and source.startswith("s3://"):
            raise NotFoundError(f"no objects under {source}")
    return out


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
    on_event: ev.EventSink = ev.ignore,
) -> PreloadResult:
    from cache.api import Cache, _PromoteOrigin

    assert isinstance(cache, Cache)
    started = time.monotonic()
    state = cache._state()
    state.store.collect()
    if not dry_run:
        state.store.shrink()
    result = PreloadResult()
    items = []
    for info, origin in plan(sources, cache.s3_settings, include, exclude, workers):
        if _utf8(info.url):
            items.append((info, origin))
        else:  # the index keys entries by URL text; such a name cannot be one (rename the file)
            shown = info.url.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            failure = ev.Failed(shown, "bad_name", "file name is not valid UTF-8; rename it to cache it")
            result.failed.append(failure)
            on_event(failure)
    cached = state.index.get_many(info.url for info, _ in items)
    # Asked for RAM, cached on disk: promote the disk copy (verified, local) when the whole set
    # fits the RAM cap. A set that does not fit would only trade places with itself on every run.
    promote = tier == "ram" and sum(info.size for info, _ in items) <= state.store.cap("ram")
    todo: list[Job] = []
    fresh: list[str] = []
    for info, origin in items:
        entry = cached.get(info.url)
        if entry is not None and entry.version == info.version:
            if promote and entry.tier == "disk":
                path = cache.layout.blob_path(entry.tier, entry.blob)
                todo.append(Job(info, _PromoteOrigin(path, entry, fallback=origin)))
                result.planned.append(info)
                continue
            result.skipped += 1
            result.skipped_bytes += info.size
            fresh.append(info.url)
            continue
        todo.append(Job(info, origin))
        result.planned.append(info)
    on_event(ev.Planned(len(todo), sum(j.info.size for j in todo), result.skipped, result.skipped_bytes))
    if fresh:
        state.index.mark_checked(fresh, time.time())
    if dry_run or not todo:
        result.smallest_window = workers
        result.seconds = time.monotonic() - started
        return result
    # small objects first in listing order, then big ones: small ones fill the pipe while big ones stream
    todo.sort(key=lambda j: j.big)
    fetcher = Fetcher(
        state.store, cache.layout, tier, workers, on_event, durable=cache.durable, batch_sync=True
    )
    fetched = fetcher.run(todo)
    result.objects = len(fetched.landed)
    result.bytes = sum(e.size for e in fetched.landed)
    result.failed += fetched.failed
    result.resumed_bytes = fetched.resumed_bytes
    result.throttled = fetched.throttled
    result.smallest_window = fetched.smallest_window
    result.seconds = time.monotonic() - started
    return result
