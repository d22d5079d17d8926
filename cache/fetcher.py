"""The fetch engine: many objects in flight, space reserved before bytes move, landings batched.

One main thread owns all bookkeeping; origin callbacks (CRT threads, copy threads) hand results to a
queue the main thread drains. A whole object is finished (read back, hashed, verified) on the
callback's own thread when batch syncs make it durable later (nothing there waits on the disk);
fsynced landings and big objects' pieces go to a small finisher pool (fsync blocks, so it stays
off the CRT event loop). A batch of verified objects is published (syncfs, link, syncfs) by one
publisher thread while the loop keeps requests flowing; the main thread indexes the batch only once
the publisher reports it durable. Concurrency is an AIMD window: it halves when the store throttles and
grows back by one request per window of successes.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import heapq
import itertools
import os
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cache import events as ev
from cache.digests import PIECE_SIZE, is_big
from cache.errors import (
    AuthError,
    BusyError,
    CacheError,
    CacheFullError,
    ChangedError,
    DeniedError,
    FileSystemFullError,
    NotFoundError,
    ThreadLimitError,
    UncacheableError,
    UnreachableError,
    VerifyError,
    error_kind,
)
from cache.index import Entry
from cache.landing import Landing, ObjectInfo, clean_version, piece_ranges
from cache.layout import Layout, blob_name
from cache.origins import Origin, same_version
from cache.sizes import format_size, no_space_under
from cache.store import (
    FILES_PER_OBJECT,
    FILES_TO_PUBLISH,
    HoldSpec,
    OverCapError,
    Store,
    fs_need,
    fs_room,
    fsync_dir,
    is_no_space,
    syncfs,
)

LAND_BATCH = 64
# landed objects waiting while a batch is published (one at a time): past this, no new requests
# start, so a slow publish (syncfs on a loaded disk) holds the run back instead of queueing without
# bound, and with it the listing, which is planned only as work starts
MAX_TO_LAND = 4 * LAND_BATCH
# Each object waiting to be published keeps its file open (an O_TMPFILE or a tmp file), so under a
# low open-files limit the wait is shorter: half the descriptors rq has, less what the rest of the
# run holds (the index, sockets, the listing). It was 256 whatever --workers said (pk).
FDS_KEPT_ASIDE = 48


def max_to_land() -> int:
    """MAX_TO_LAND, or fewer where the open-files limit cannot hold that many files open."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return MAX_TO_LAND
    if soft == resource.RLIM_INFINITY:
        return MAX_TO_LAND
    return max(8, min(MAX_TO_LAND, (soft - FDS_KEPT_ASIDE) // 2))


PRUNE_MIN = 4096  # the run's list of jobs sheds finished ones once it passes this many (and doubles)
# Whole objects under cache.digests.BIG_OBJECT (64 MiB) come through the CRT, which holds each body
# in a buffer (grown by doubling: up to twice the size) until it is written. 256 requests in flight
# of 20-60 MiB objects took rq preload to ~0.9 GiB of RSS (issue #3: <= 512 MiB); the sizes of such
# requests in flight stay under this budget (one request alone may pass it).
BODY_BUDGET = 128 << 20
MAX_ATTEMPTS = 5
# a body that stalled costs its attempt the watchdog's 30 s: a store that stalls on an object three
# times will not do better the next two (5 attempts took ~157 s for one object)
STALLED_ATTEMPTS = 3
# a store whose connections all drop (a proxy or port-forward whose backend died) is unreachable,
# even though it still accepts them: this many lost connections in a row, with no object landing
# in between, stop the run (exit 6) instead of retrying every object of a big prefix
LOST_IN_A_ROW = 16
WIND_DOWN_S = 30  # a stopping run waits this long at most for the requests it handed off to report


def out_of_files(exc: BaseException) -> bool:
    """Whether an error is, or was raised from, EMFILE/ENFILE: the process or the system ran out of
    open files."""
    seen: BaseException | None = exc
    for _ in range(8):  # (a chain that loops back on itself ends too)
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in (errno.EMFILE, errno.ENFILE):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


THREAD_LIMIT = "cannot start a thread (memory or thread limit: ulimit -u / -v)"


def cannot_start_thread(exc: BaseException) -> bool:
    """Whether an error is Thread.start's "can't start new thread"."""
    return isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)


def start_thread(thread: threading.Thread) -> None:
    """thread.start(), with "can't start new thread" raised as a ThreadLimitError (one clear line)."""
    try:
        thread.start()
    except RuntimeError as exc:
        if not cannot_start_thread(exc):
            raise
        raise ThreadLimitError(f"{THREAD_LIMIT}: {thread.name}") from exc


class Workers:
    """Up to `count` threads running calls from one queue.

    Not a ThreadPoolExecutor: its submit builds a Future (and a Condition) per call, ~3% of a
    small-object preload's Python time (py-spy), and nothing here reads a result: every task
    reports through the fetcher's own queue and catches its own errors."""

    def __init__(self, count: int, name: str):
        self._q: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._count, self._name = count, name
        self._threads: list[threading.Thread] = []  # started one per call until there are `count`
        self._lock = threading.Lock()
        self._stopped = False

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        task = functools.partial(fn, *args)
        if len(self._threads) < self._count:  # (callers are CRT threads too: start under the lock)
            with self._lock:
                if len(self._threads) < self._count and not self._stopped:
                    name = f"{self._name}_{len(self._threads)}"
                    thread = threading.Thread(target=self._run, name=name, daemon=True)
                    try:
                        thread.start()
                    except RuntimeError as exc:
                        if not cannot_start_thread(exc):
                            raise
                        # the memory or thread limit (ulimit -v / -u): go on with the threads that
                        # exist, as a run out of descriptors goes on with fewer requests. (The
                        # thread was listed before it started: a task queued for it waited forever
                        # for a thread that never ran, and Cache.open with it)
                        self._count = len(self._threads)
                    else:
                        self._threads.append(thread)
        if not self._threads:
            # no thread could start at all: the caller's thread runs it, as _run would
            with contextlib.suppress(Exception):  # (tasks report their own errors)
                task()
            return
        self._q.put(task)

    def _run(self) -> None:
        while (task := self._q.get()) is not None:
            with contextlib.suppress(BaseException):  # (tasks report their own errors)
                task()

    def shutdown(self) -> None:
        """Runs what was submitted before, then stops the threads."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        for _ in self._threads:
            self._q.put(None)
        for thread in self._threads:
            thread.join()


class Window:
    """Additive-increase, multiplicative-decrease limit on requests in flight."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self.size = float(self.limit)
        self.smallest = self.limit
        self.cuts = 0
        self._last_cut = 0.0

    @property
    def value(self) -> int:
        return max(1, int(self.size))

    def success(self) -> None:
        self.size = min(float(self.limit), self.size + 1.0 / self.size)

    def throttled(self) -> None:
        now = time.monotonic()
        if now - self._last_cut > 0.5:  # one cut per burst of throttling, not one per request
            self.size = max(1.0, self.size / 2)
            self.smallest = min(self.smallest, self.value)
            self.cuts += 1
            self._last_cut = now


@dataclass
class Job:
    info: ObjectInfo
    origin: Origin
    attempts: int = 0
    hold: int = 0
    landing: Landing | None = None
    outstanding: int = 0
    error: BaseException | None = None
    requests: list[Any] = field(default_factory=list)
    keep_open: bool = False  # Cache.open's own miss: land it already locked for that reader
    done: bool = False  # landed, or failed for good: the run lets go of it
    # where it lands when not the run's own tier: "disk" after the RAM tier's file system was full
    tier: str = ""
    made_room: bool = False  # the RAM file system was full once: LRU entries were evicted for it
    demoted: str = ""  # why it left the RAM tier for the disk tier (the file system error)

    @property
    def big(self) -> bool:
        return is_big(self.info.size)

    def finish(self) -> None:
        """Landed, or failed for good. Its CRT requests go: each one's callbacks hold this job,
        a cycle through native code the garbage collector cannot see, so every finished job of a
        run stayed alive (~15 KB an object: 821 MB of RSS for 50,000 objects)."""
        self.done = True
        self.requests.clear()


@dataclass
class FetchResult:
    objects: int = 0  # landed and indexed in this run
    landed_bytes: int = 0
    largest: int = 0  # the biggest object landed
    landed: list[Entry] = field(default_factory=list)  # their entries: only with Fetcher(keep_entries=True)
    # asked for in RAM, on disk (landed there, or a promotion left there): the RAM file system was
    # full (one events.Demoted each)
    demoted: int = 0
    failed: list[ev.Failed] = field(default_factory=list)
    bytes: int = 0
    resumed_bytes: int = 0  # pieces of big objects found durable from an earlier, interrupted run
    kept: dict[str, int] = field(default_factory=dict)  # url -> locked read fd (jobs with keep_open)
    throttled: int = 0  # objects the store throttled (SlowDown/503) beyond the client's own retries
    smallest_window: int = 0  # the fewest requests in flight the AIMD window went down to

    def fail(self, failure: ev.Failed) -> None:
        """Keeps one object's failure. Only the first keeps its error's traceback (the one a
        one-object call raises again): a traceback holds the frames that raised and their locals,
        ~10 KB a failure, so a run failing 60,000 objects grew by 600 MB it never gave back."""
        if self.failed and failure.error is not None and failure.error is not self.failed[0].error:
            _drop_tracebacks(failure.error)
        self.failed.append(failure)


def _drop_tracebacks(exc: BaseException) -> None:
    """exc and the exceptions it was raised from or during, without their tracebacks."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__]


Landed = tuple[int, Entry, Job]  # (hold id, index entry, job) of a verified object waiting to land


class Feed(Protocol):
    """Jobs that arrive while the run goes on: the preloader's listing, a page at a time, so the
    first objects are fetched while later pages are still being listed."""

    def start(self, deliver: Callable[[object], None]) -> None:
        """Starts producing on a thread of its own: deliver(page) for each page, then deliver(None)
        at the end, or deliver(exception) when producing failed (its last call either way)."""

    def jobs(self, page: object) -> list[Job]:
        """On the run's own thread: the jobs of one delivered page (may be none). The run calls it
        only when its jobs waiting to start run low, so a feed may wait for it before delivering
        more (backpressure)."""

    def stop(self) -> None:
        """The run is over: deliver nothing more."""


@dataclass
class Published:
    """What publishing one batch did, as plain results: the I/O runs on the publisher thread, the
    bookkeeping (index, holds, events) on the main thread, which alone touches the SQLite index."""

    durable: list[Landed] = field(default_factory=list)  # under final names, durable: index them
    failed: list[tuple[Landed, BaseException]] = field(default_factory=list)  # publish() gave up
    dropped: list[Landed] = field(default_factory=list)  # not indexed (a sync failed), holds to release
    # RAM landings whose publish met a full file system (ENOSPC: the objects/xx/ mkdir or the link,
    # tmpfs out of inodes): not failures, unless they cannot go elsewhere (Fetcher._book decides)
    full: list[tuple[Landed, FileSystemFullError]] = field(default_factory=list)
    error: BaseException | None = None  # what stops the run, if anything


class Fetcher:
    def __init__(
        self,
        store: Store,
        layout: Layout,
        tier: str,
        workers: int,
        on_event: ev.EventSink = ev.ignore,
        durable: bool = True,
        batch_sync: bool = False,
        keep_entries: bool = False,
    ):
        self.store, self.layout, self.tier = store, layout, tier
        # a preload of millions of objects must not keep an entry per object (issue 3: memory stays
        # bounded however big the dataset); a caller fetching a few asks for them
        self.keep_entries = keep_entries
        self.durable = durable
        # durable and many objects: verify each, then one syncfs per landing batch before publishing
        # (and one after), instead of an fsync per file and per objects/xx/ directory
        self.batch_sync = durable and batch_sync
        self.window = Window(workers)
        self.on_event = on_event
        # (SimpleQueue: a C queue; queue.Queue's Python locks and Condition cost every message)
        self._q: queue.SimpleQueue[tuple[str, Any, int | None, Any]] = queue.SimpleQueue()
        # finishing = read back + hash (+ fsync + rename unless a batch makes them durable): off
        # the CRT loop. With batch syncs or no fsync at all it never waits on the disk (a
        # page-cache read and the hashing): two threads keep up, and more only woke up and
        # passed the GIL around (8 of them: ~10% more CPU on 2,000 x 256 KiB). fsyncs: eight.
        self._finisher = Workers(2 if self.batch_sync or not durable else 8, "rq-finish")
        self._inline = self.batch_sync or not durable  # whole objects finish on the callback thread
        # syncfs, link, syncfs for a batch: mostly waiting on the disk, so it runs beside the loop,
        # which meanwhile keeps requests flowing (it was blocked ~1/3 of a 2,000-object run)
        # (Workers, not a ThreadPoolExecutor: its thread failing to start raised out of the run as
        # "unexpected RuntimeError: can't start new thread"; this one publishes on the loop's thread)
        self._publisher = Workers(1, "rq-publish")
        self._max_to_land = max_to_land()
        self._bytes = 0
        self._bytes_lock = threading.Lock()
        self._seq = itertools.count()
        # requests handed off and not yet reported, by key: added by the loop as it hands one to
        # an origin or a finisher, dropped by the thread that reports it, after its message is in
        # the queue. A stopping run waits on this, not on its own count of messages: a Ctrl-C
        # landing between a queue get and that count (or between the count and the hand-off) lost
        # one, and the wind-down waited out its 30 s deadline with every worker idle.
        self._live: set[int] = set()
        self._keys = itertools.count()
        self.resumed_bytes = 0
        self.throttled = 0
        self._lost_in_a_row = 0  # objects failed on a dropped connection since one last landed
        self._held_bytes = 0  # bytes reserved by this run for work not yet landed
        self.starved = False  # the tier budget is spent by our own work in flight
        self._over_cap: list[tuple[Job, OverCapError]] = []  # refused by _admit: failed by run()
        self._body_bytes = 0  # sizes of whole-object requests in flight whose origin holds bodies
        self._demoted = 0  # asked for in RAM, on disk: the RAM file system was full (FetchResult.demoted)
        self._room_made: list[Job] = []  # RAM room made for these (_elsewhere), not yet reserved

    # --- callbacks from other threads ----------------------------------------------------------

    def _count(self, n: int) -> None:
        with self._bytes_lock:
            self._bytes += n

    def _report(self, key: int, message: tuple[str, Any, int | None, Any]) -> None:
        """A handed-off request's one message; then it is no longer live (see _live)."""
        try:
            self._q.put(message)
        finally:
            self._live.discard(key)

    def _request_done(self, job: Job, piece: int | None, err: BaseException | None, key: int) -> None:
        if piece is None and self._inline:
            # a whole object, finished here on the origin's callback thread: with batch syncs (or
            # no fsync) finishing never waits on the disk (a page-cache read-back and the hashing),
            # and handing it to a finisher thread cost a queue message, a futex wake and one more
            # GIL hand-off per object
            self._complete(job, piece, err, key)
        else:
            self._finisher.submit(self._complete, job, piece, err, key)

    def _complete(self, job: Job, piece: int | None, err: BaseException | None, key: int) -> None:
        if err is not None:
            self._report(key, ("error", job, piece, err))
            return
        try:
            landing = job.landing
            assert landing is not None
            if piece is None:
                message: tuple[str, Any, int | None, Any] = ("landed", job, None, landing.finish())
            else:
                landing.piece_done(piece)
                message = ("piece", job, piece, None)
        except BaseException as exc:
            message = ("error", job, piece, exc)
        self._report(key, message)

    def _finish_big(self, job: Job, key: int) -> None:
        try:
            assert job.landing is not None
            job.landing.checksums = job.origin.checksums(job.info)
            message: tuple[str, Any, int | None, Any] = ("landed", job, None, job.landing.finish())
        except BaseException as exc:
            message = ("error", job, None, exc)
        self._report(key, message)

    def _hand_to_finisher(self, job: Job) -> None:
        """_finish_big on a finisher thread, live until it reports."""
        key = next(self._keys)
        self._live.add(key)
        try:
            self._finisher.submit(self._finish_big, job, key)
        except BaseException:
            self._live.discard(key)  # (never queued: nothing will report it)
            raise

    # --- the loop ------------------------------------------------------------------------------

    def run(self, jobs: list[Job], feed: Feed | None = None) -> FetchResult:
        """Fetches `jobs`, and those `feed` delivers meanwhile; a feed that fails stops the run."""
        # every job not yet done: a failure must reach each one that may hold a landing, a hold or
        # requests. It grows with what the feed delivers and sheds finished jobs as it goes, so a run
        # over millions of objects holds only what is in flight or waiting
        jobs = list(jobs)
        prune_at = 4 * len(jobs) + PRUNE_MIN
        self._room_made = []
        result = FetchResult()
        ready: deque[Job] = deque(jobs)
        delayed: list[tuple[float, int, Job]] = []
        requests: deque[tuple[Job, int | None, tuple[int, int] | None]] = deque()
        to_land: list[Landed] = []
        inflight = 0
        publishing = False  # one batch at a time on the publisher thread
        fatal: BaseException | None = None
        last_land = last_progress = time.monotonic()
        feeding = feed is not None
        # pages the feed delivered and this loop has not planned yet: one is planned only when the
        # jobs waiting to start run low, so the listing stays a few pages ahead and no further
        waiting: deque[object] = deque()
        pending: deque[tuple[str, Any, int | None, Any]] = deque()  # messages taken, not yet handled
        low = max(LAND_BATCH, 2 * self.window.limit)
        try:
            if feed is not None:
                feed.start(lambda page: self._q.put(("feed", None, None, page)))
            while True:
                now = time.monotonic()
                while delayed and delayed[0][0] <= now:
                    ready.append(heapq.heappop(delayed)[2])
                while feed is not None and fatal is None and waiting and len(ready) < low:
                    try:
                        new = feed.jobs(waiting.popleft())
                    except CacheError as exc:
                        fatal = exc
                        self._halt(requests, jobs)
                    else:
                        ready.extend(new)
                        jobs.extend(new)
                if fatal is None:
                    while requests and inflight < self.window.value and self._body_fits(*requests[0]):
                        job, piece, rng = requests.popleft()
                        inflight += 1
                        self._body_bytes += self._body_size(job, piece)
                        self._start(job, piece, rng)
                    # admit in batches (one reservation transaction each), not one object per slot
                    room = self.window.value - inflight
                    if (
                        not requests
                        and ready
                        and not self.starved
                        and len(to_land) < self._max_to_land
                        and (room >= min(32, self.window.value // 4 + 1) or inflight == 0)
                    ):
                        batch = self._take(ready, self.window.value - inflight)
                        try:
                            self._admit(batch, ready, requests, delayed)
                        except CacheError as exc:
                            fatal = exc
                            self._drop_unstarted(requests)
                        while self._over_cap:
                            self._refuse(*self._over_cap.pop(), result)
                        continue
                if (
                    inflight == 0
                    and not requests
                    and not publishing
                    and (fatal is not None or (not ready and not delayed and not feeding and not waiting))
                ):
                    break
                timeout = 0.05 if delayed or to_land else 0.25
                with contextlib.suppress(queue.Empty):
                    pending.append(self._q.get(timeout=timeout))
                    # and whatever else is waiting: one pass of the checks above per message was
                    # a good part of this thread's time, and this thread is the run's bottleneck
                    while len(pending) < LAND_BATCH:
                        pending.append(self._q.get_nowait())
                while pending:
                    kind, job, piece, payload = pending.popleft()
                    if kind == "feed":
                        assert feed is not None
                        if payload is None or isinstance(payload, BaseException):
                            feeding = False
                            if payload is not None and fatal is None:
                                fatal = payload  # a listing that failed: stop, as when the store goes away
                                self._halt(requests, jobs)
                        elif fatal is None:
                            waiting.append(payload)
                    elif kind == "published":
                        publishing = False
                        book = functools.partial(
                            self._book, payload, result, ready if fatal is None else None
                        )
                        fatal = self._settle(book, fatal, requests, jobs)
                    elif kind:
                        self.starved = False
                        inflight -= 1
                        self._body_bytes -= self._body_size(job, piece)
                        job.outstanding -= 1
                        if kind == "piece":
                            if job.outstanding == 0 and job.error is None:
                                if len(job.landing.done_pieces) == job_piece_count(job):
                                    job.outstanding += 1
                                    inflight += 1
                                    self._hand_to_finisher(job)
                            elif job.outstanding == 0:
                                fatal = self._failed(job, job.error, ready, delayed, result, fatal)
                        elif kind == "landed":
                            self.window.success()
                            self._lost_in_a_row = 0
                            to_land.append((job.hold, payload, job))
                        else:
                            job.error = job.error or payload
                            if job.outstanding == 0:
                                fatal = self._failed(job, job.error, ready, delayed, result, fatal)
                            elif isinstance(payload, UnreachableError | CacheFullError | AuthError):
                                self._cancel(job)
                        if fatal is not None and requests:
                            self._halt(requests, jobs)
                if len(jobs) > prune_at:
                    jobs = [j for j in jobs if not j.done]
                    prune_at = 2 * len(jobs) + PRUNE_MIN
                now = time.monotonic()
                if (
                    to_land
                    and not publishing
                    and (len(to_land) >= LAND_BATCH or now - last_land > 0.2 or inflight == 0)
                ):
                    landing_now, to_land = to_land, []
                    last_land = now
                    if self.batch_sync:
                        publishing = True
                        self._publisher.submit(self._publish_async, landing_now)
                    else:
                        step = functools.partial(self._land, landing_now, result)
                        fatal = self._settle(step, fatal, requests, jobs)
                if now - last_progress > 0.2:
                    self.on_event(ev.Progress(self._bytes))
                    last_progress = now
        except BaseException as exc:  # KeyboardInterrupt, SystemExit, bugs: stop cleanly, then re-raise
            fatal = exc
            self._drop_unstarted(requests)
            for j in jobs:
                self._cancel(j)
            while pending:
                inflight -= self._wind_down(pending.popleft(), to_land, result)
            # every request handed off reports once (its message is queued before it stops being
            # live): wait for those, whatever this loop's own count says (a message taken but not
            # counted when the interruption landed)
            deadline = time.monotonic() + WIND_DOWN_S
            while self._live and time.monotonic() < deadline:
                try:
                    message = self._q.get(timeout=0.05)
                except queue.Empty:
                    continue
                inflight -= self._wind_down(message, to_land, result)
            # a batch being published must finish, and be booked, before anything is abandoned
            self._publisher.shutdown()
            while True:
                try:
                    message = self._q.get_nowait()
                except queue.Empty:
                    break
                inflight -= self._wind_down(message, to_land, result)
            if to_land:
                with contextlib.suppress(BaseException):  # the first error is the one raised
                    self._land(to_land, result)
            self._abandon(jobs, keep_partials=True)
            raise
        finally:
            if feed is not None:
                feed.stop()
            self._finisher.shutdown()
            self._publisher.shutdown()
        if to_land:
            try:
                self._land(to_land, result)
            except BaseException as exc:
                fatal = fatal or exc
        result.bytes = self._bytes
        result.resumed_bytes = self.resumed_bytes
        result.throttled = self.throttled
        result.demoted = self._demoted
        result.smallest_window = self.window.smallest
        self.on_event(ev.Progress(self._bytes))
        if fatal is not None:
            self._abandon(jobs, keep_partials=True)
            if isinstance(fatal, OSError):
                # the library's boundary: a landing step's own I/O (fsync_dir of objects/xx/ meeting
                # EMFILE under a low ulimit -n) reached Cache.open's caller as a bare OSError
                raise CacheError(
                    f"could not land objects in the {self.tier} tier under {self.layout.tier_root(self.tier)}: {fatal}"
                ) from fatal
            raise fatal
        return result

    @staticmethod
    def _body_size(job: Job, piece: int | None) -> int:
        """What one request holds in memory until its object is written (0: streamed to the file)."""
        if piece is None and not job.big and job.origin.holds_bodies:
            return job.info.size
        return 0

    def _body_fits(self, job: Job, piece: int | None, _rng: tuple[int, int] | None) -> bool:
        size = self._body_size(job, piece)
        return size == 0 or self._body_bytes == 0 or self._body_bytes + size <= BODY_BUDGET

    @staticmethod
    def _take(ready: deque[Job], room: int) -> list[Job]:
        batch = [ready.popleft()]
        while (
            ready
            and len(batch) < min(room, LAND_BATCH)
            and not batch[-1].big
            and not ready[0].big
            and ready[0].tier == batch[0].tier  # (one reservation, in one tier, per batch)
        ):
            batch.append(ready.popleft())
        return batch

    def _admit(
        self,
        batch: list[Job],
        ready: deque[Job],
        requests: deque[tuple[Job, int | None, tuple[int, int] | None]],
        delayed: list[tuple[float, int, Job]],
    ) -> list[Job]:
        """Reserves space for a batch (one transaction), opens landings, queues their requests."""
        self._check_ram_fs(batch, ready)
        if not batch:
            return []
        tier = self._tier(batch[0])
        new = [j for j in batch if not j.hold]
        while new:
            # Space this run holds for work in flight may not pass half the cap: the rest stays free
            # for landed entries (which can be evicted) so a small cap never fills with our own
            # reservations. (The cap as reserve() last read it: another process may lower it.)
            budget = self.store.caps[tier] // 2 - self._held_bytes
            while new and sum(j.info.size for j in new) > budget and (len(new) > 1 or self._held_bytes > 0):
                back = new.pop()
                batch.remove(back)
                ready.appendleft(back)
                self.starved = True  # admit nothing more until something lands
            if not new:
                break
            try:
                holds = self.store.reserve(
                    tier,
                    [
                        HoldSpec(
                            j.info.size, blob_name(j.info.url, clean_version(j.info.version)), j.info.url
                        )
                        for j in new
                    ],
                    # with our own work in flight, do not wait inside reserve: it lands only when
                    # this loop runs, so give up at once and retry after the next landing
                    patience=0.0 if self._held_bytes else 10.0,
                )
            except OverCapError as exc:
                if exc.count > 1:
                    continue  # a lower cap set meanwhile by another rq: smaller batches, not a stop
                if new[0].demoted:
                    raise self._nowhere(new[0], exc) from exc
                # one object bigger than the cap another rq set since it was planned: it fails
                # alone (no_space), as planning fails one bigger than the cap it knew
                batch.remove(new[0])
                self._over_cap.append((new[0], exc))
                self.starved = False  # (what was put back waited for it: nothing of it will land)
                new = []
                holds = []
            except OSError as exc:
                # reserve() reads the RAM file system's room (a listdir of its tmp/): EMFILE there
                # left the library as a bare OSError (Cache.open under a low ulimit -n with a
                # prefetch running). Our own work in flight holds the descriptors: admit again
                # once some of it landed, fewer at a time, as a landing that met EMFILE does
                if out_of_files(exc) and self._held_bytes:
                    self.window.throttled()
                    for job in reversed(new):
                        batch.remove(job)
                        heapq.heappush(delayed, (time.monotonic() + 0.1, next(self._seq), job))
                    new = []
                    holds = []
                else:
                    raise CacheError(
                        f"could not reserve space in the {tier} tier under {self.layout.tier_root(tier)}: {exc}"
                    ) from exc
            except CacheFullError as exc:
                if self._held_bytes == 0 and new[0].demoted:
                    raise self._nowhere(new[0], exc) from exc
                if self._held_bytes == 0:
                    raise
                # full of our own in-flight work: wait for it to land (then it can be evicted)
                for job in reversed(new):
                    batch.remove(job)
                    ready.appendleft(job)
                self.starved = True
                new = []
                holds = []
            for job, hid in zip(new, holds, strict=True):
                job.hold = hid
                self._held_bytes += job.info.size
            break
        started = []
        for job in batch:
            ranges = piece_ranges(job.info.size, PIECE_SIZE) if job.big else []
            try:
                job.landing = Landing(
                    self.layout,
                    tier,
                    job.info,
                    blob_name(job.info.url, clean_version(job.info.version)),
                    job.hold,
                    pieces=max(1, len(ranges)),
                    piece_size=PIECE_SIZE,
                    on_bytes=self._count,
                    durable=self.durable,
                    batch_dir_sync=True,
                    keep_open=job.keep_open,
                    defer_publish=self.batch_sync,
                )
            except BusyError:
                self._release(job, keep=False)
                heapq.heappush(delayed, (time.monotonic() + 0.5, next(self._seq), job))
                continue
            except FileSystemFullError as exc:  # a big object's blocks, allocated up front
                self._release(job, keep=self._has_partial(job))
                if job.demoted:
                    raise self._nowhere(job, exc) from exc
                if not self._elsewhere(job, exc, ready):
                    raise
                continue
            except OSError as exc:
                # the tier's tmp/ gone (an emptied /dev/shm) or unwritable: a partial that was never
                # opened is no reason to keep a hold, which would count as in flight until a clear
                self._release(job, keep=self._has_partial(job))
                if out_of_files(exc) and self._held_bytes:
                    # our own work in flight holds the descriptors: start it again once some of
                    # it landed (and fewer at a time)
                    self.window.throttled()
                    heapq.heappush(delayed, (time.monotonic() + 0.1, next(self._seq), job))
                    continue
                raise CacheError(
                    f"could not start {job.info.url} in the {tier} tier under "
                    f"{self.layout.tier_root(tier)}: {exc}"
                ) from exc
            job.error = None
            if job.big:
                todo = [(i, r) for i, r in enumerate(ranges) if i not in job.landing.done_pieces]
                resumed = sum(r[1] - r[0] + 1 for i, r in enumerate(ranges) if i in job.landing.done_pieces)
                self.resumed_bytes += resumed
                self._count(resumed)
                if not todo:  # every piece already durable from an earlier run
                    job.outstanding += 1
                    requests.append((job, -1, None))
                for i, rng in todo:
                    job.outstanding += 1
                    requests.append((job, i, rng))
            else:
                job.outstanding += 1
                requests.append((job, None, None))
            started.append(job)
        return started

    def _start(self, job: Job, piece: int | None, rng: tuple[int, int] | None) -> None:
        assert job.landing is not None
        if piece == -1:
            self._hand_to_finisher(job)
            return
        # One report per request, whoever is first: a fetch that raised may still have queued its
        # copy (a ThreadPoolExecutor's submit queues the call, then raises "can't start new
        # thread"; a thread it already has runs the call later). That copy's report came on top of
        # the error below: in flight was counted down twice, went below 0, and the run, which
        # ends when it reaches 0, waited forever.
        report = [piece]
        key = next(self._keys)

        def done(err: BaseException | None) -> None:
            try:
                report.pop()
            except IndexError:
                return  # fetch raised: its error was the report
            self._request_done(job, piece, err, key)

        try:
            self._live.add(key)  # (an interruption before it: the report below discards nothing)
            req = job.origin.fetch(job.info, job.landing, done, rng)
        except Exception as exc:
            try:
                report.pop()
            except IndexError:
                return  # the copy ran and reported before fetch raised
            if cannot_start_thread(exc):
                # the origin's copy thread could not start (ulimit -v / -u): every object would
                # fail so, one warning each, so the run stops with one line
                err = ThreadLimitError(THREAD_LIMIT)
                err.__cause__ = exc
                exc = err
            self._report(key, ("error", job, piece, exc))
            return
        except BaseException as exc:  # Ctrl-C: the run stops (exit 130), it is not this object's failure
            try:
                report.pop()
            except IndexError:
                pass  # done() has it: it reports
            else:
                self._report(key, ("error", job, piece, exc))  # (the wind-down books it)
            raise
        if req is not None:
            job.requests.append(req)

    def _cancel(self, job: Job) -> None:
        for req in job.requests:
            try:
                req.cancel()
            except Exception:
                pass

    def _settle(
        self,
        step: Callable[[], None],
        fatal: BaseException | None,
        requests: deque[tuple[Job, int | None, tuple[int, int] | None]],
        jobs: list[Job],
    ) -> BaseException | None:
        """Runs one landing step; a failure halts the run but never replaces its first error."""
        self.starved = False
        try:
            step()
        except Exception as exc:
            self._halt(requests, jobs)
            return fatal or exc
        return fatal

    def _halt(self, requests: deque[tuple[Job, int | None, tuple[int, int] | None]], jobs: list[Job]) -> None:
        """The run is failing: start nothing more, cancel what is in flight (results still come back)."""
        self._drop_unstarted(requests)
        for j in jobs:
            self._cancel(j)

    @staticmethod
    def _drop_unstarted(requests: deque[tuple[Job, int | None, tuple[int, int] | None]]) -> None:
        while requests:
            job, _, _ = requests.popleft()
            job.outstanding -= 1

    def _drop_superseded(self, job: Job) -> None:
        """An object that failed for good drops the cached copy of an older version of it: the
        store named a newer one (its listing or HEAD), so that copy is known superseded and a read
        while the store is down must not serve it as merely unchecked (ServedStale). Only S3's:
        a directory origin's entries are never served stale, and their racy marks differ from the
        stat's version without being older. Best effort: the failure reported stays the object's."""
        if not job.info.url.startswith("s3://"):
            return
        try:
            entry = self.store.index.get(job.info.url)
            if entry is not None and not same_version(entry.version, job.info.version):
                self.store.retire(entry)  # never a landing made since
        except CacheError:
            pass  # (a full or read-only index: the next read's revalidation finds it superseded)

    def _failed(
        self,
        job: Job,
        err: BaseException,
        ready: deque[Job],
        delayed: list[tuple[float, int, Job]],
        result: FetchResult,
        fatal: BaseException | None,
    ) -> BaseException | None:
        """Decides what one failed object means: retry it, fail it alone, or stop the run."""
        job.requests.clear()
        landing = job.landing
        job.landing = None
        # a full RAM file system: its partial would only keep taking the room it lacks
        elsewhere = isinstance(err, FileSystemFullError) and fatal is None and self._may_leave_ram(job)
        resumable = job.big and not isinstance(err, VerifyError | ChangedError) and not elsewhere
        if landing is not None:
            if resumable:
                landing.keep_for_resume()
            else:
                landing.abort()
        if fatal is None and out_of_files(err) and (self.window.value > 1 or job.attempts < MAX_ATTEMPTS - 1):
            # the process's open-files limit, not the object: fewer in flight (each holds a temp
            # file, a source file or a socket) and again shortly, as for a throttling store. Not
            # counted as an attempt while the window can still shrink
            self._release(job, keep=resumable)
            if self.window.value <= 1:
                job.attempts += 1
            self.window.throttled()
            delay = random.uniform(0.05, 0.2) * (1 + job.attempts)
            heapq.heappush(delayed, (time.monotonic() + delay, next(self._seq), job))
            return fatal
        if getattr(err, "lost_connection", False):
            self._lost_in_a_row += 1
            if self._lost_in_a_row >= LOST_IN_A_ROW:
                err = UnreachableError(
                    f"{err}; {self._lost_in_a_row} connections in a row dropped with nothing landing"
                )
        if elsewhere:
            self._release(job, keep=False)
            self._elsewhere(job, err, ready)
            return fatal
        if isinstance(err, CacheFullError) and job.demoted and fatal is None:
            cause, err = err, self._nowhere(job, err)
            err.__cause__ = cause
        if (
            isinstance(err, UnreachableError | CacheFullError | AuthError | ThreadLimitError)
            or fatal is not None
        ):
            self._release(job, keep=resumable)
            return fatal or err
        if isinstance(err, NotFoundError | DeniedError | UncacheableError) or not isinstance(err, CacheError):
            self._release(job, keep=False)
            job.finish()
            self._drop_superseded(job)
            failure = ev.Failed(job.info.url, error_kind(err), str(err) or type(err).__name__, err)
            result.fail(failure)
            self.on_event(failure)
            return fatal
        job.attempts += 1
        if job.attempts >= (STALLED_ATTEMPTS if getattr(err, "stalled", False) else MAX_ATTEMPTS):
            self._release(job, keep=resumable)
            job.finish()
            self._drop_superseded(job)
            # every attempt ended with the connection lost or stalled: the store went away for
            # this object (exit 6, re-run to continue), not an answer refusing it
            kind = "unreachable" if getattr(err, "lost_connection", False) else error_kind(err)
            failure = ev.Failed(job.info.url, kind, str(err), err if kind == error_kind(err) else None)
            result.fail(failure)
            self.on_event(failure)
            return fatal
        if isinstance(err, ChangedError):
            try:
                job.info = job.origin.stat(job.info.url)
            except CacheError as exc:
                return self._failed(job, exc, ready, delayed, result, fatal)
            self._release(job, keep=False)
        elif not resumable:
            self._release(job, keep=False)
        if getattr(err, "throttled", False):
            self.throttled += 1
            self.window.throttled()
        delay = min(8.0, 0.2 * 2**job.attempts) * random.uniform(0.5, 1.0)
        self.on_event(ev.Retrying(job.info.url, job.attempts, delay, str(err)))
        heapq.heappush(delayed, (time.monotonic() + delay, next(self._seq), job))
        return fatal

    def _refuse(self, job: Job, err: CacheFullError, result: FetchResult) -> None:
        job.finish()
        failure = ev.Failed(job.info.url, error_kind(err), f"{err}; raise --{self._tier(job)}-limit")
        result.fail(failure)
        self.on_event(failure)

    def _tier(self, job: Job) -> str:
        return job.tier or self.tier

    def _may_leave_ram(self, job: Job) -> bool:
        """Whether a RAM landing that met a full file system may evict, then land on disk."""
        return self._tier(job) == "ram" and self.store.caps.get("disk", 0) > 0

    def _elsewhere(
        self,
        job: Job,
        err: BaseException,
        ready: deque[Job],
        promised: tuple[int, int] = (0, 0),
        counted: list[Job] | None = None,
    ) -> bool:
        """The RAM tier's file system is full below its cap (its hold released, nothing of it
        left in the tier): once, evict LRU RAM entries (demoted to disk, as for the cap) to make
        room and try RAM again; then, or when nothing can be evicted, land it on disk. False: it
        cannot leave (not a RAM landing, or no disk tier). `promised`: Store.make_room's (the
        objects `counted` there, of the batch being admitted); the room made for other objects
        still waiting to be admitted again is added to it."""
        if not self._may_leave_ram(job):
            return False
        if not job.made_room:
            job.made_room = True
            made = self._room_made_for_others(job, counted or [])
            if self.store.make_room("ram", job.info.size, (promised[0] + made[0], promised[1] + made[1])):
                self._room_made.append(job)
                ready.appendleft(job)  # next, before the rest take the room
                return True
        if getattr(job.origin, "promotes", False):
            job.finish()  # a promotion from disk: it stays cached there, nothing to copy
            self._demoted += 1
            self.on_event(ev.Demoted(job.info.url, job.info.size, "disk", str(err)))
            return True
        job.tier, job.demoted = "disk", str(err)
        ready.appendleft(job)
        return True

    def _room_made_for_others(self, job: Job, counted: list[Job]) -> tuple[int, int]:
        """The bytes and files of the RAM file system's room made (_elsewhere) for objects that
        wait to be admitted again, other than `job` and those `counted` by the caller already:
        that room is theirs. Left out, the next object short of room found it free, made none and
        took it at the next admission; the first then found no room again and, its room made
        once, went to disk said to be short of "files that are not rq's". Objects that got their
        hold (counted in flight by Store.room from then on), finished or left RAM drop out."""
        self._room_made = [j for j in self._room_made if not j.hold and not j.done and self._tier(j) == "ram"]
        others = [j for j in self._room_made if j is not job and all(j is not c for c in counted)]
        if not others:
            return 0, 0
        room = fs_room(self.layout.tier_root("ram"))
        block = room.block if room is not None else 4096
        return sum(fs_need(j.info.size, block) for j in others), FILES_PER_OBJECT * len(others)

    def _check_ram_fs(self, batch: list[Job], ready: deque[Job]) -> None:
        """A RAM batch's objects that its file system has no room for (statvfs; the batch's own
        objects counted one after another) go to _elsewhere before they start: found out by
        ENOSPC, each cost a download into RAM that was thrown away (a small object's whole body)
        before the one that landed on disk. In-flight landings of earlier batches are not counted:
        one that loses that race still meets ENOSPC and goes the same way."""
        if self._tier(batch[0]) != "ram" or not self._may_leave_ram(batch[0]):
            return
        root = self.layout.tier_root("ram")
        room = fs_room(root)
        if room is None:
            return  # the landing says what is wrong with the tier
        free = room.free
        files = None if room.files is None else room.files - FILES_TO_PUBLISH
        files_before = files or 0
        fitted: list[Job] = []  # (the batch's objects counted so far: their room is promised)
        for job in self._within_budget(batch):
            need = fs_need(job.info.size, room.block)
            if need > free:
                lack = f"{format_size(free)} free, {format_size(need)} needed"
            elif files is not None and files < FILES_PER_OBJECT:
                lack = f"{max(0, files)} free files (inodes), {FILES_PER_OBJECT} needed"
            else:
                free -= need
                if files is not None:
                    files -= FILES_PER_OBJECT
                fitted.append(job)
                continue
            batch.remove(job)
            full = FileSystemFullError(
                f"no space left on the file system under {root} for {job.info.url}: {lack}"
            )
            # (the room the batch's objects before it take is not there to be found free)
            self._elsewhere(job, full, ready, (room.free - free, files_before - (files or 0)), fitted)

    def _within_budget(self, batch: list[Job]) -> list[Job]:
        """The batch's objects without a hold (a held one's blocks are taken already) that _admit's
        budget (half the cap, less this run's work in flight) lets start now. The rest go back to
        wait, and their room is looked at when their turn comes, once the cap has moved earlier
        landings out of the tier: counted here all at once against the free space, a dataset
        bigger than the file system sent its tail to disk as "no space left" (finding B: 15 of 30
        4 MiB objects on a 64 MiB /dev/shm with 48 MiB free, under a 16 MiB cap)."""
        new = [j for j in batch if not j.hold]
        budget = self.store.caps[self._tier(batch[0])] // 2 - self._held_bytes
        taken: list[Job] = []
        for job in new:
            if budget < job.info.size and (taken or self._held_bytes):
                break  # (with nothing in flight, one object starts whatever its size, as there)
            budget -= job.info.size
            taken.append(job)
        return taken

    def _nowhere(self, job: Job, err: CacheFullError) -> CacheFullError:
        """A demoted object the disk tier cannot take either: one error naming both tiers (its
        cause is `err`, which the caller sets; never the error itself: rqcli walks the chain)."""
        return CacheFullError(
            f"no space left for {job.info.url} in either tier: the RAM tier's file system under "
            f"{self.layout.tier_root('ram')} is full, and the disk tier under "
            f"{self.layout.tier_root('disk')} cannot take it: {err}"
        )

    def _release(self, job: Job, keep: bool) -> None:
        if job.hold:
            self._held_bytes -= job.info.size
            try:
                if keep:
                    self.store.orphan([job.hold])
                else:
                    self.store.release([job.hold])
            except CacheError:
                pass  # index unwritable (disk full): the hold is ours, the next collect() clears it
            job.hold = 0

    def _abandon(self, jobs: list[Job], keep_partials: bool) -> None:
        """After a fatal error: nothing half-written stays visible; big partials stay resumable."""
        for job in jobs:
            landing = job.landing
            if landing is not None and landing.placed:
                # published under its final name, not indexed (an interrupt between the two, in
                # _book): nothing is left to resume, and dropped (or orphaned) with its hold, the
                # file stayed on disk counted by nothing
                self._take_back(job)
            elif landing is not None:
                keep = keep_partials and job.big
                if keep:
                    landing.keep_for_resume()
                else:
                    landing.abort()
                job.landing = None
                self._release(job, keep=keep)
            elif job.hold:
                self._release(job, keep=self._has_partial(job))

    def _has_partial(self, job: Job) -> bool:
        """A big object's hold is kept for a later run to resume only if its partial file is there:
        kept without one (its landing never opened) it would count as in flight until a clear."""
        blob = blob_name(job.info.url, clean_version(job.info.version))
        return job.big and self.layout.tmp_path(self._tier(job), blob, ".part").exists()

    def _land(self, items: list[Landed], result: FetchResult) -> None:
        """Lands a batch here and now (the end of a run, and the path without batch syncs)."""
        if self.batch_sync:
            self._book(self._publish(items), result)
            return
        items = [item for item in items if item[2].landing is not None]  # (not landed already)
        if self.durable:
            # the renames must be durable before the index names them: one fsync per directory per
            # batch (ext4 commits them together) instead of one per object
            for directory in {self.layout.blob_path(e.tier, e.blob).parent for _, e, _ in items}:
                fsync_dir(directory)
        self._book(Published(durable=items), result)

    def _publish_async(self, items: list[Landed]) -> None:
        """Publisher thread: always answers the loop, whatever happens."""
        try:
            outcome = self._publish(items)
        except BaseException as exc:  # a bug or an interrupt: nothing of this batch is indexed
            outcome = Published(dropped=items, error=exc)
        self._q.put(("published", None, None, outcome))

    def _publish(self, items: list[Landed]) -> Published:
        """Verified temp files -> durable -> final names -> durable names. I/O only: no index, no
        holds, no events (those are booked by the main thread in _book)."""
        items = [item for item in items if item[2].landing is not None]  # (not landed already)
        # the run's tier, and the disk tier too when the RAM file system was full for some
        roots = {self.layout.tier_root(e.tier): e.tier for _, e, _ in items}
        root = self.layout.tier_root(self.tier)
        try:
            for root, tier in roots.items():
                if not syncfs(root, self._held_fd(items, tier)):
                    for _, entry, job in items:
                        if entry.tier == tier:
                            os.fsync(job.landing.fd)  # type: ignore[union-attr]
        except OSError as exc:
            for _, _, job in items:
                job.landing.abort()  # type: ignore[union-attr]
            return Published(dropped=items, error=self._disk_error(root, exc))
        out = Published()
        for item in items:
            try:
                item[2].landing.publish(item[1].xxh3)  # type: ignore[union-attr]
            except Exception as exc:  # publish() has removed the temp file
                if isinstance(exc, FileSystemFullError) and item[1].tier == "ram":
                    out.full.append((item, exc))
                    continue
                out.failed.append((item, exc))
                if isinstance(exc, CacheFullError):
                    out.error = out.error or exc
                continue
            out.durable.append(item)
        if out.durable:
            try:
                for root, tier in roots.items():
                    if not syncfs(root, self._held_fd(out.durable, tier)):
                        for directory in {
                            self.layout.blob_path(tier, e.blob).parent
                            for _, e, _ in out.durable
                            if e.tier == tier
                        }:
                            fsync_dir(directory)
            except OSError as exc:
                # under final names but not durably named: not indexed, and taken back in _book
                out.dropped.extend(out.durable)
                out.durable = []
                out.error = self._disk_error(root, exc)
        return out

    @staticmethod
    def _held_fd(items: list[Landed], tier: str) -> int:
        """A descriptor one of the batch's landings in `tier` holds open: syncfs needs one on the
        file system, and opening the tier's root for it is one more open file (EMFILE under a low
        limit stopped the run there)."""
        for _, entry, job in items:
            if entry.tier == tier and job.landing is not None and (fd := job.landing.open_fd()) >= 0:
                return fd
        return -1

    def _wind_down(
        self, message: tuple[str, Any, int | None, Any], to_land: list[Landed], result: FetchResult
    ) -> int:
        """One queue message while stopping: books a published batch (errors ignored: the run's
        first error is the one raised), keeps landed objects for the last landing. Returns how many
        requests in flight it accounts for."""
        kind, job, _, payload = message
        if kind == "feed":
            return 0  # more of the listing: the run is stopping, so it is not fetched
        if kind == "published":
            with contextlib.suppress(BaseException):
                self._book(payload, result)
            return 0
        job.outstanding -= 1
        if kind == "landed":
            to_land.append((job.hold, payload, job))
        return 1

    def _take_back(self, job: Job) -> None:
        """A landing that will not be indexed: its published file (if it placed one), its temp
        file, descriptors and hold all go."""
        landing = job.landing
        if landing is not None:
            landing.release_kept()  # our own shared lock would make take_back see "a reader has it"
            if landing.placed:
                landing.placed = False
                hold, job.hold = job.hold, 0
                if hold:
                    self._held_bytes -= job.info.size
                # the file goes before its hold (take_back drops it, or keeps it as garbage while
                # a reader has the file open); an index that cannot be written keeps the hold,
                # ours, counting the file until this process ends (then collect() removes both).
                # (The hold was released whatever happened, and the file could stay, counted by
                # nothing, over the cap)
                with contextlib.suppress(Exception):
                    self.store.take_back(landing.tier, landing.blob, hold)
            landing.abort()
        job.landing = None
        self._release(job, keep=False)

    def _book(self, outcome: Published, result: FetchResult, ready: deque[Job] | None = None) -> None:
        """Main thread: index what is durable, release the holds of the rest, report; then raise
        the batch's error, if any. With `ready` (the run goes on), a RAM landing its file system
        had no room to publish goes to _elsewhere (evict, or the disk tier) and is fetched again:
        its verified temp file is gone already."""
        for _, _, job in outcome.dropped:
            self._take_back(job)
        failed = list(outcome.failed)
        for item, full in outcome.full:
            self._take_back(item[2])
            if ready is None or not self._elsewhere(item[2], full, ready):
                failed.append((item, full))  # nowhere else: stops the run, as any full file system
                outcome.error = outcome.error or full
        for (_, entry, job), exc in failed:
            self._take_back(job)
            if ready is not None and out_of_files(exc) and job.attempts < MAX_ATTEMPTS - 1:
                # publishing opens the file once more: the open-files limit, not the object.
                # Fetched again, with fewer in flight
                job.attempts += 1
                self.window.throttled()
                ready.append(job)
                continue
            job.finish()
            failure = ev.Failed(entry.url, error_kind(exc), str(exc) or type(exc).__name__, exc)
            result.fail(failure)
            self.on_event(failure)
        items = outcome.durable
        if items:
            try:
                self.store.land([(hid, entry) for hid, entry, _ in items])
            except BaseException as exc:
                # an interrupt (or an error) after the index's commit, as land() collects the
                # garbage of superseded versions: those entries are cached, and are counted and
                # reported as this run's (the aborted summary counted only what was reported,
                # and missed a committed batch; tests/cache/test_sx_aborted_summary.py)
                if self._indexed(items):
                    self._booked(items, result)
                    raise
                if isinstance(exc, Exception):
                    # not indexed (the index's disk is full, say): take the files back, keep it
                    # consistent. (Not on an interrupt: a commit may have happened; at worst a
                    # file waits unindexed under its final name, and the next run finds it as an
                    # identical twin.)
                    for _, _, job in items:
                        self._take_back(job)
                raise
        self._booked(items, result)
        if outcome.error is not None:
            raise outcome.error

    def _indexed(self, items: list[Landed]) -> bool:
        """Whether the index names a batch's blobs (land() writes the batch in one transaction)."""
        try:
            found = self.store.index.get_many(entry.url for _, entry, _ in items)
        except BaseException:
            return False
        return all(_same_landing(found.get(entry.url), entry) for _, entry, _ in items)

    def _booked(self, items: list[Landed], result: FetchResult) -> None:
        """Counts and reports a batch the index has committed. Every object is counted before an
        event goes out, and each gets its event even where one before it raised (an interrupt in
        the caller's on_event): an aborted run's summary, counted from the events, is what the
        index holds. The first such error is raised after the last event."""
        error: BaseException | None = None
        for _, entry, job in items:
            if job.landing is not None and job.landing.kept_fd >= 0:
                if job.keep_open:
                    result.kept[entry.url] = job.landing.kept_fd
                else:  # (locked only until the index named it)
                    job.landing.release_kept()
            self._held_bytes -= job.info.size
            job.hold = 0
            job.landing = None
            job.finish()
            result.objects += 1
            result.landed_bytes += entry.size
            result.largest = max(result.largest, entry.size)
            if self.keep_entries:
                result.landed.append(entry)
            if job.demoted:
                self._demoted += 1
        for _, entry, job in items:
            try:
                if job.demoted:
                    self.on_event(ev.Demoted(entry.url, entry.size, entry.tier, job.demoted))
                self.on_event(ev.Landed(entry.url, entry.size))
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error

    @staticmethod
    def _disk_error(root: Any, exc: OSError) -> CacheError:
        if is_no_space(exc):
            return FileSystemFullError(no_space_under(root, exc))
        return CacheError(f"could not make the cache durable under {root}: {exc}")


def _same_landing(found: Entry | None, entry: Entry) -> bool:
    """Whether the index's entry is this landing's (not an older one of the same URL)."""
    if found is None:
        return False
    return (found.blob, found.tier, found.version, found.created) == (
        entry.blob,
        entry.tier,
        entry.version,
        entry.created,
    )


def job_piece_count(job: Job) -> int:
    return len(piece_ranges(job.info.size, PIECE_SIZE))
