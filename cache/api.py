"""The read API for training code: `Cache(dir).open(url)` read-through, `prefetch`, and the
inspection calls behind `rq cache …`. Safe in forked DataLoader workers: per-process state (SQLite
connection, CRT client, threads) is rebuilt in a child the first time it is used there."""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import fnmatch
import functools
import importlib
import io
import itertools
import os
import pickle
import random
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import xxhash

from cache import events as ev
from cache import orphans, procs
from cache.digests import file_digest
from cache.errors import (
    BadSourceError,
    CacheError,
    CacheFullError,
    NotFoundError,
    OriginError,
    RamTierUnavailableError,
    UnreachableError,
    UnsafeDirError,
    VerifyError,
    error_for,
)
from cache.index import Entry, Index
from cache.landing import Checksums, ObjectInfo, clean_version, is_racy, racy_at
from cache.layout import (
    INDEX_NAME,
    NO_RAM_ERRNOS,
    TIERS,
    Layout,
    check_cache_dir,
    check_private_dir,
    default_ram_root,
    dir_error,
    make_private,
)
from cache.origins import (
    LocalOrigin,
    Origin,
    local_origin_for_url,
    local_version,
    normalise_pattern,
    normalise_url,
    origin_for_url,
    same_version,
)
from cache.sizes import (
    cgroup_memory_limit,
    cgroup_memory_used,
    format_size,
    parse_size,
    ram_fs_share,
    stored_size,
)
from cache.store import Store

if TYPE_CHECKING:
    from cache.preload import PreloadResult
    from cache.s3 import S3Settings

# cache.fetcher and cache.s3 (with the CRT behind it) are imported where they are first needed: a
# fetch, an s3:// URL. A read of a cached entry of a directory, `rq cache ls/du/stat`, do not pay
# for them (~15 ms). cache.s3's at-fork handling comes with it, as before: every S3 client is made there.

SMALL_READ = 16 << 20  # objects up to this size are read into memory on open (no lease kept)
DEFAULT_MAX_AGE = 60.0
OPEN_PATIENCE = 30.0  # seconds Cache.open keeps retrying an entry that keeps being evicted
# The longest close() waits for other threads' calls under way (a prefetch window warming, a verify
# of a big cache, a read stuck on a dead mount) before it closes the index all the same, as
# Prefetcher.stop() bounds its join: a close() in a signal handler or at exit must end.
CLOSE_WAIT_S = 30.0
GONE_BEFORE_FETCH = 20  # lookups that found the cached file gone before reading through the origin
# after a freshness check found the store unreachable, stale entries of that bucket are served
# without asking again for this long: each check of a store that is down costs seconds (refused:
# ~1.6 s of retries; silent: the watchdog's 30 s), which a training step must not pay per file
UNREACHABLE_RECHECK_S = 10.0
_T = TypeVar("_T")
_P = ParamSpec("_P")


def default_cache_dir() -> Path:
    env = os.environ.get("RQ_CACHE_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_path

    return user_cache_path("rq") / "cache"


def _check_apart(ram_dir: Path, root: Path) -> None:
    """The RAM tier's directory must not be the cache dir, inside it, or hold it: each tier
    sweeps what it does not know, so the two would delete each other's files."""
    a, b = ram_dir.resolve(), root.resolve()
    if a == b or a in b.parents or b in a.parents:
        raise UnsafeDirError(f"the RAM tier directory {ram_dir} must be apart from the cache dir {root}")


class CachedBytes(io.BytesIO):
    """What `Cache.open` returns for an object of up to SMALL_READ bytes: its verified bytes in
    memory, read-only like the file object a bigger one comes back as (a write used to be taken
    and then lost). `getvalue()` returns the bytes without a copy (CPython shares them)."""

    def writable(self) -> bool:
        return False

    def write(self, _b: Any) -> int:
        raise io.UnsupportedOperation("write: a cached object is read-only")

    def writelines(self, _lines: Any) -> None:
        raise io.UnsupportedOperation("writelines: a cached object is read-only")

    def truncate(self, _size: int | None = None) -> int:
        raise io.UnsupportedOperation("truncate: a cached object is read-only")

    def getbuffer(self) -> memoryview:
        """A read-only view of the bytes (BytesIO's own is writable), without a copy."""
        return memoryview(self.getvalue())


# What Cache.open returns: both take read, readinto and seek (and work with `with`), and both are
# a BinaryIO to a type checker; IO[bytes] hid readinto, which docs/cache.md shows.
CachedFile = io.BufferedReader | CachedBytes


class _Gone(Exception):
    """The entry vanished between the index lookup and the open (evicted or replaced): look again."""


@dataclass
class _ProcState:
    pid: int
    index: Index
    store: Store
    # operations using it (Cache._use): close() detaches the state at once but closes its index
    # only once they ended, so none of them meets a closed index halfway (its landing's hold
    # stranded in the index, a raw sqlite3 error)
    # The threads with an operation under way on it, by ident: adding and discarding a thread's
    # own ident are each one step and discarding twice is harmless, so a signal (a Ctrl-C, a
    # handler that raises) landing between the steps of taking or ending a use can leave no use
    # counted for ever (a count did: every later close() then waited on it, dr4).
    users: set[int] = field(default_factory=set)
    idle: threading.Condition = field(default_factory=threading.Condition)
    closing: bool = False  # closed by the thread holding its last use: that use's end closes it

    def release(self, user: int) -> None:
        self.users.discard(user)  # first, outside the lock: one step a signal cannot cut in two
        with self.idle:
            last = self.closing and not self.users
            self.closing = self.closing and not last
            self.idle.notify_all()
        if last:
            self.index.close()


def _in_use(method: Callable[Concatenate[Cache, _P], _T]) -> Callable[Concatenate[Cache, _P], _T]:
    """Runs a Cache method under one use of the per-process state (Cache._use)."""

    @functools.wraps(method)
    def using(self: Cache, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        with self._use():
            return method(self, *args, **kwargs)

    return using


@dataclass
class Problem:
    url: str
    problem: str

    @property
    def kind(self) -> str:
        """ "unreadable" (the cached copy could not be read back: EIO) or "corrupt" (the rest)."""
        return "unreadable" if self.problem.startswith(UNREADABLE) else "corrupt"


def _squatted(ram_root: Path) -> bool:
    """Whether a name in /dev/shm, which anyone can predict from the cache's path, was taken by
    something a new cache must not adopt: not a directory, or another user's. The next name in the
    sequence is used then, rather than refusing the cache (exit 2) until someone removes it."""
    try:
        st = os.lstat(ram_root)
    except OSError as exc:
        # no /dev/shm (ENOENT, ENOTDIR) or none we may look in (EACCES): nobody's name either,
        # and making it tells the machine has no usable RAM tier (Cache.ram_unavailable)
        return exc.errno not in NO_RAM_ERRNOS
    return not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid()


def _make_ram_dir(path: Path, tighten: bool) -> bool:
    """Makes a new cache's RAM directory with its tiers' subdirectories and the checks of
    Layout.create; True when it was not there before (so a failure after it may remove it)."""
    existed = path.exists()
    try:
        check_private_dir(path, tighten)
        for sub in ("objects", "tmp"):
            make_private(path / sub)
    except OSError as exc:
        if not existed:
            _unmake_ram_dir(path)
        raise dir_error(path, "RAM tier directory", exc) from None
    return not existed


# where every program of the node (DataLoader workers, NCCL) makes its shared memory
SHARED_SHM = "/dev/shm"


def cgroup_room() -> tuple[int, int] | None:
    """(memory limit, what the group uses now) of this process's cgroup where a limit is set,
    else None. RAM-tier files count against the limit beside every process of the group."""
    limit = cgroup_memory_limit()
    return None if limit is None else (limit, min(cgroup_memory_used(limit), limit))


def cgroup_ram_bound(held: int = 0) -> int | None:
    """The most RAM-tier bytes this process's cgroup leaves room for, or None (no limit): half its
    limit, and half of what the group's use leaves of it, the tier's `held` bytes (counted in that
    use when this group wrote them) taken as room, as the tier's own. Half, not all: rq itself,
    and the trainer beside it, grow after this look (finding A: a 150 MiB group with a 70 MiB
    trainer got a 75 MiB cap and the trainer was OOM-killed)."""
    room = cgroup_room()
    if room is None:
        return None
    limit, used = room
    return min(limit // 2, max(0, limit - used + held) // 2)


def default_ram_cap(fs_size: int) -> int:
    """A new cache's RAM cap: a quarter of the RAM file system, and within what the process's
    cgroup leaves room for (cgroup_ram_bound) where a limit is set (a container's): tmpfs pages
    count against that limit, and a RAM tier filled up to a quarter of the node's /dev/shm got the
    run OOM-killed."""
    cap = fs_size // 4
    room = cgroup_room()
    # Half the limit only: this cap is recorded, and what the group uses at this moment (a busy
    # minute, page cache) would have stayed the cache's cap for good, down to 0 B (dr5). What the
    # group uses is applied at each open instead (cgroup_ram_bound, in _caps), never recorded.
    return cap if room is None else min(cap, room[0] // 2)


def _unmake_cache_dir(root: Path, keep_root: bool = False) -> None:
    """Removes a cache directory this process made moments ago and failed to set up: what rq
    put in it and the directory, and only that (rmdir: a file someone else put there stays).
    `keep_root`: the directory was there (empty) before: only what rq put in it goes."""
    for name in (INDEX_NAME, INDEX_NAME + "-wal", INDEX_NAME + "-shm", INDEX_NAME + "-journal", "ram"):
        with contextlib.suppress(OSError):
            (root / name).unlink()
    for sub in ("objects", "tmp") if keep_root else ("objects", "tmp", ""):
        with contextlib.suppress(OSError):
            (root / sub).rmdir()


def _unmake_ram_dir(path: Path) -> None:
    """Removes what _make_ram_dir made, and only that (rmdir: never a file someone put there)."""
    for sub in ("objects", "tmp", ""):
        with contextlib.suppress(OSError):
            (path / sub).rmdir()


class Cache:
    """A tiered cache directory. Thread-safe; usable from many processes at once."""

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        ram_dir: str | os.PathLike[str] | None = None,
        ram_limit: int | float | str | None = None,
        disk_limit: int | float | str | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        max_age: float = DEFAULT_MAX_AGE,
        tier: str = "disk",
        durable: bool = True,
        require_ram: bool = False,
        on_event: ev.EventSink = ev.ignore,
    ):
        # arguments first: a bad one must not leave a new cache dir and /dev/shm root behind
        if cache_dir is not None and not isinstance(cache_dir, str | os.PathLike):
            raise BadSourceError(f"cache_dir must be a path, not {type(cache_dir).__name__}")
        for given in (ram_limit, disk_limit):
            if given is not None:
                parse_size(given)
        if isinstance(max_age, bool) or not isinstance(max_age, int | float) or not max_age >= 0:
            raise BadSourceError(f"max_age must be seconds (a number >= 0), not {max_age!r}")
        self.durable = durable
        self.on_event = on_event  # ServedStale, Demoted, Damaged: from open(), path() and prefetch()
        self._unreachable: dict[str, tuple[float, str]] = {}  # bucket: (ask again after, why)
        self._tighten = ram_dir is None  # rq's own default root: see Layout.create
        self._ram_pid = 0  # the process whose hold on the RAM root this object counts in (cache.orphans)
        # absolute once: a training launcher that changes directory (Hydra's run dirs) must not
        # move the blobs' paths away from the index that names them
        self.root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()).absolute()
        ram_given = Path(ram_dir).absolute() if ram_dir else None
        check_cache_dir(self.root)
        # a cache this Cache makes (in a new or an empty directory): a failure removes what it made
        new_cache = not (self.root / INDEX_NAME).exists()
        made_ram = ram_checked = False
        if ram_given is not None:
            _check_apart(ram_given, self.root)
            if not (self.root / INDEX_NAME).exists():
                ram_checked = True
                # a new cache's RAM directory is made (and so proven usable) before the cache
                # directory and its index: one that cannot be made or is not safe creates nothing
                check_cache_dir(ram_given, "RAM tier directory")
                made_ram = _make_ram_dir(ram_given, self._tighten)
        try:
            made_root = make_private(self.root)  # 0700 whatever the umask: the cache is one user's
        except (OSError, CacheError) as exc:
            if made_ram and ram_given is not None:
                _unmake_ram_dir(ram_given)
            if isinstance(exc, CacheError):
                raise
            raise dir_error(self.root, "cache directory", exc) from None
        self._s3_given = (endpoint_url, profile)
        self._s3_settings: S3Settings | None = None  # (self.s3_settings, made on first use)
        self.max_age = max_age
        _check_tier(tier)
        self.default_tier = tier
        self._proc: _ProcState | None = None
        self._lock = threading.RLock()
        # .active: this thread is inside an operation (_use); .state: the state it uses
        self._held = threading.local()
        self._touched: dict[str, float] = {}
        self._last_flush = 0.0  # a process's first read is recorded at once
        self._flush_pending_pid = 0  # the process whose deferred flush is scheduled
        self._verified: set[tuple[str, int, int]] = set()
        self._prefetcher: Prefetcher | None = None
        self._endpoint_memo: tuple[int, str | None] | None = None  # (pid, _endpoint())
        # why this machine has no usable RAM tier (rq's own root in /dev/shm cannot be made: no
        # /dev/shm, read-only, not ours to write), or None: the disk tier works without it, RAM's
        # cap is 0 and asking for the RAM tier raises RamTierUnavailableError (rq: exit 10)
        self.ram_unavailable: str | None = None
        try:
            self._open_index(ram_given, ram_checked, ram_limit, disk_limit)
            if require_ram:
                # (`rq preload --tier ram`): refused before a new cache directory is left behind
                self._need_ram("ram")
        except BaseException:
            if made_root or new_cache:
                # a failed create leaves no half-made cache behind
                _unmake_cache_dir(self.root, keep_root=not made_root)
            raise

    def _open_index(
        self,
        ram_given: Path | None,
        ram_checked: bool,
        ram_limit: int | float | str | None,
        disk_limit: int | float | str | None,
    ) -> None:
        index = Index(self.root / INDEX_NAME)
        try:
            known = index.setting("ram_root")
            # the root the index names, gone (a reboot) and its name then taken by another user or
            # by something that is not a directory: its entries' files are gone anyway, so the
            # cache passes over it to a fresh name as a new cache does, rather than being refused
            # until someone (not the CLI user) removes it
            # A relative name (a damaged or edited index) would put the RAM tier under whatever
            # directory the process runs in: passed over the same way
            squatted = (
                ram_given is None
                and known is not None
                and (not Path(known).is_absolute() or _squatted(Path(known)))
            )
            if squatted:
                known_path = Path(known or "")
                ram_root = self._new_ram_root(avoid=known_path)
            else:
                ram_root = ram_given or Path(known or self._new_ram_root())
            if known != str(ram_root) and ram_given is not None and not ram_checked:
                check_cache_dir(ram_root, "RAM tier directory")  # a directory given to us: empty
            self.layout = Layout(self.root, ram_root)
            wiped = known == str(ram_root) and not ram_root.exists()
            self._hold_ram_root(tighten=self._tighten)
            if self.ram_unavailable is not None:
                if wiped:
                    self._forget_ram_tier(index)  # its files went with /dev/shm
            elif known != str(ram_root):
                self._adopt_ram_root(index, ram_root)
                if squatted:
                    self._forget_ram_tier(index)  # their files were under the lost root
            elif wiped:
                self._forget_ram_tier(index)
            if self.ram_unavailable is None:
                self._claim_ram_root()
            self.caps = self._caps(index, ram_limit, disk_limit)
        finally:
            index.close()

    def _new_ram_root(self, avoid: Path | None = None) -> Path:
        """rq's root for a new cache: named after its path, unless a cache moved away from this
        path still uses that name (its root is not ours to sweep); then the next name in a
        sequence every process opening this new cache computes alike."""
        me = self.root.resolve()
        for n in range(16):
            ram_root = default_ram_root(self.root, n)
            if ram_root != avoid and not _squatted(ram_root) and not orphans.claimed_by_another(ram_root, me):
                return ram_root
        raise UnsafeDirError(
            f"no free RAM tier directory name for {self.root} in /dev/shm (all 16 are taken, some by "
            "other users?): remove those of yours no cache uses (rq cache orphans --remove), or "
            "give the cache a RAM tier directory of your own (the library's Cache(ram_dir=...))"
        )

    def _hold_ram_root(self, tighten: bool) -> None:
        """Makes the tiers' directories and holds the RAM root's shared lock until close() (one
        descriptor per process: cache.orphans). A root nobody holds, whose cache directory is
        gone, may be removed by `rq cache orphans --remove`."""
        for _ in range(5):
            if not self._make_tiers(tighten):
                return  # no usable RAM tier: nothing to hold
            if orphans.acquire(self.layout.ram_root):
                self._ram_pid = os.getpid()
                return
            # it was being removed as an orphan while we waited for it: make it again
        raise CacheError(
            f"RAM tier directory {self.layout.ram_root} keeps disappearing; is something deleting it?"
        )

    def _make_tiers(self, tighten: bool) -> bool:
        """Makes the disk tier's directories, then the RAM root's; False (and `ram_unavailable`
        set) when rq's own RAM root cannot be made on this machine at all. A RAM directory given
        to the cache (`ram_dir`) that cannot be made stays an error, as does one that is there but
        unsafe (another user's, a symlink, writable by others: check_private_dir)."""
        try:
            self.layout.create(ram=False)
        except OSError as exc:
            raise dir_error(self.root, "cache directory", exc) from None
        try:
            self.layout.create(tighten=tighten)
        except OSError as exc:
            if self._tighten and exc.errno in NO_RAM_ERRNOS:
                self.ram_unavailable = f"cannot make {self.layout.ram_root}: {exc.strerror or exc}"
                return False
            raise dir_error(self.layout.ram_root, "RAM tier directory", exc) from None
        return True

    def _need_ram(self, tier: str | None) -> None:
        """Refuses the RAM tier on a machine without a usable one (exit 10 in rq)."""
        if tier == "ram" and self.ram_unavailable is not None:
            raise RamTierUnavailableError(
                f"no RAM tier on this machine ({self.ram_unavailable}); use the disk tier (--tier disk)"
            )

    def _claim_ram_root(self) -> None:
        """Writes this cache's directory into its RAM root's `owner` (a moved cache claims it back)."""
        try:
            orphans.mark_owner(self.layout.ram_root, self.root.resolve())
        except OSError:
            pass  # a root we cannot write to: `rq cache orphans` calls it unclaimed, never removes it

    def _let_go_of_ram_root(self) -> None:
        with self._lock or contextlib.nullcontext():
            if self._ram_pid != os.getpid():
                return
            self._ram_pid = 0  # two threads closing at once release once
        orphans.release(self.layout.ram_root)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._let_go_of_ram_root()

    def _adopt_ram_root(self, index: Index, ram_root: Path) -> None:
        """Records the RAM root. rq's default root is named after the cache dir, so one that has
        files while this index knows none of them is left by a cache removed with `rm -rf`:
        those files are nobody's, and would sit on tmpfs outside any cap. The check runs in the
        index's write lock, so files another process is landing under its holds are never taken.
        A read-only index (a cache on read-only media) records nothing and sweeps nothing."""
        if index.readonly:
            return
        with index.write() as db:
            if index.setting("ram_root") == str(ram_root):
                return  # another process adopted it meanwhile
            ours = db.execute("SELECT COUNT(*) FROM entries WHERE tier = 'ram'").fetchone()[0]
            held = db.execute("SELECT COUNT(*) FROM holds WHERE tier = 'ram'").fetchone()[0]
            if not ours and not held and ram_root == default_ram_root(self.root):
                Store.sweep_tree(ram_root)
            Index.put_setting(db, "ram_root", str(ram_root))

    def _forget_ram_tier(self, index: Index) -> None:
        """The RAM root this index knows was gone when we came (a reboot, a container restart, a
        tmp cleaner emptied /dev/shm): its entries would count against the cap, look warm to
        prefetch and be skipped by preload while none of their files exists. They are dropped, pins
        and all (the data they pinned is gone); the next preload or read fetches them again. Only
        entries whose file is missing: another process may have made the root again and landed
        something since we looked. Landing holds of live processes are theirs; dead ones collect()'s.
        A read-only index keeps them: their reads find the files gone."""
        if index.readonly:
            return
        with index.write() as db:
            rows = db.execute("SELECT url, blob FROM entries WHERE tier = 'ram'").fetchall()
            for url, blob in rows:
                if not self.layout.blob_path("ram", blob).exists():
                    Index.delete(db, url)

    def _ram_root_lost(self) -> bool:
        root = self.layout.ram_root
        return not ((root / "tmp").is_dir() and (root / "objects").is_dir())

    def _ensure_ram_root(self) -> bool:
        """Makes the RAM root again if it was removed under this running process (a tmp cleaner,
        systemd's RemoveIPC, a container restart): __init__ does this only for a root gone before
        the cache was opened, and without it every RAM landing failed on the missing tmp/. The
        same checks as there (a real directory of ours, 0700), the lock held on the new directory,
        and the RAM entries whose files went with it dropped. True when it was made again."""
        if self.ram_unavailable is not None or not self._ram_root_lost():
            return False
        with self._lock:
            if not self._ram_root_lost():
                return False  # another thread of ours made it again meanwhile
            index = self._state().index
            for _ in range(5):
                self._make_tiers(self._tighten)
                if self._ram_pid == os.getpid():
                    taken = orphans.renew(self.layout.ram_root)  # our lock is on the deleted one
                else:
                    taken = orphans.acquire(self.layout.ram_root)
                if taken:
                    self._ram_pid = os.getpid()
                    break
            else:
                raise CacheError(
                    f"RAM tier directory {self.layout.ram_root} keeps disappearing; is something deleting it?"
                )
            self._forget_ram_tier(index)
            self._claim_ram_root()
            return True

    def _caps(
        self, index: Index, ram_limit: int | float | str | None, disk_limit: int | float | str | None
    ) -> dict[str, int]:
        caps: dict[str, int] = {}
        # half this process's cgroup memory limit, the most RAM it caches whatever cap is recorded
        # (None: no limit, or a ram_limit given to this Cache, which is the user's own choice);
        # `ram_cap_note` says so in one line when it lowers the recorded cap (rq cache du, doctor)
        self.ram_bound: int | None = None
        self.ram_cap_note: str | None = None
        # (cap to put back or None, cap given) of each tier whose limit this Cache asked for:
        # restore_limits() puts the first back, keep_limits() (close) keeps the second
        self._replaced: dict[str, tuple[int | None, int]] = {}
        # a limit set here takes effect at this Cache's first use (_state), evicting (RAM:
        # demoting) down to it as `rq preload --ram-limit` does; its preload does so itself
        self._shrink_due = False
        self._claim = f"{os.getpid()}:{procs.start_time(os.getpid()) or 0}:{os.urandom(6).hex()}"
        for tier, given in (("ram", ram_limit), ("disk", disk_limit)):
            if tier == "ram" and self.ram_unavailable is not None:
                caps[tier] = 0  # (a limit stored or given is kept for a machine that has one)
                continue
            stored = stored_size(index.setting(f"{tier}_limit"))
            if stored is None:
                fs = os.statvfs(self.layout.tier_root(tier))
                # defaults: a quarter of the RAM file system; 80% of what the disk has free now
                stored = (
                    default_ram_cap(fs.f_blocks * fs.f_frsize)
                    if tier == "ram"
                    else int(fs.f_bavail * fs.f_frsize * 0.8)
                )
                if not index.readonly:
                    index.set_setting(f"{tier}_limit", str(stored))
            caps[tier] = stored
            if tier == "ram" and given is None:
                # a cap recorded where more memory was allowed (a cache made on the host, opened in
                # a container with a memory limit, or one whose group has since filled): this
                # process keeps within what its cgroup leaves room for
                self.ram_bound = cgroup_ram_bound(self._ram_held(index))
                if self.ram_bound is not None and stored > self.ram_bound:
                    caps[tier] = self.ram_bound
                    if self.ram_bound < stored * 0.9:  # (not for a hair: the use moves a little)
                        self.ram_cap_note = self._cgroup_note(stored)
            if given is not None and not (index.readonly and parse_size(given) == stored):
                caps[tier] = self._claim_limit(index, tier, parse_size(given))
            if tier == "ram":
                self._keep_shm_headroom(caps, given is not None)
        return caps

    def _ram_held(self, index: Index) -> int:
        """The bytes the RAM tier holds now (entries and landings), 0 if the index cannot say."""
        try:
            usage = index.usage()["ram"]
            return int(usage["bytes"]) + int(usage["held"])
        except (CacheError, sqlite3.Error, KeyError, TypeError, ValueError):
            return 0

    def _cgroup_note(self, recorded: int) -> str:
        room = cgroup_room()
        figures = (
            "" if room is None else f" of {format_size(room[0])}, {format_size(room[1])} of it in use now"
        )
        return (
            f"RAM cap {format_size(recorded)} recorded, {format_size(self.ram_bound or 0)} used by this "
            f"process: half of what its cgroup's memory limit{figures} leaves for the RAM tier "
            "(--ram-limit sets a cap of your own)"
        )

    def _keep_shm_headroom(self, caps: dict[str, int], given: bool) -> None:
        """rq's own RAM root is in /dev/shm, which DataLoader workers and NCCL need too: a cap
        above ram_fs_share of its file system (Docker's default 64 MiB, a Kubernetes memory
        emptyDir) acts as that share, given or recorded (finding C: --ram-limit 200M on a 64 MiB
        /dev/shm filled it to 60 MiB and another user of it then failed ENOSPC). A RAM root on a
        file system of its own (a `ram_dir` on a private tmpfs) is nobody else's: left as capped."""
        if self.ram_unavailable is not None:
            return
        try:
            if os.stat(self.layout.ram_root).st_dev != os.stat(SHARED_SHM).st_dev:
                return
            fs = os.statvfs(self.layout.ram_root)
        except OSError:
            return
        size = fs.f_blocks * fs.f_frsize
        share = ram_fs_share(size)
        if size <= 0 or caps["ram"] <= share:
            return
        asked = caps["ram"]
        caps["ram"] = share
        self.ram_bound = share if self.ram_bound is None else min(self.ram_bound, share)
        what = f"--ram-limit {format_size(asked)}" if given else f"RAM cap {format_size(asked)}"
        self.ram_cap_note = (
            f"{what} is more than the RAM file system under {SHARED_SHM} "
            f"({format_size(size)}) can spare: rq uses {format_size(share)} of it and leaves the rest "
            "to other programs there (DataLoader workers, NCCL); in a container, give it more room "
            "(docker --shm-size, a Kubernetes emptyDir with medium: Memory and a sizeLimit)"
        )

    def _claim_limit(self, index: Index, tier: str, given: int) -> int:
        """Sets a tier's limit (stored at once: every process using the cache obeys the last limit
        set, Store.cap) and makes this Cache its owner: the one whose failure may put back the cap
        it replaced. Asking for the limit already set claims it too (a run asking 200M after a run
        that set it relies on it), taking over what that run, while it lasts, would put back:
        once all of them fail, the cap from before the first is back; one that succeeds keeps its
        own (keep_limits); a run whose limit was claimed since puts nothing back."""
        with index.write() as db:
            stored = stored_size(Index.setting_in(db, f"{tier}_limit"))
            if stored != given:
                before = stored
            else:
                before = None
                owner = Index.setting_in(db, f"{tier}_limit_owner") or ""
                prior = stored_size(Index.setting_in(db, f"{tier}_limit_prior"))
                if prior is not None and _claim_alive(owner):
                    before = prior  # the owner is still running: its failure is ours to undo
            Index.put_setting(db, f"{tier}_limit", str(given))
            Index.put_setting(db, f"{tier}_limit_owner", self._claim)
            Index.put_setting(db, f"{tier}_limit_prior", "" if before is None else str(before))
        self._replaced[tier] = (before, given)
        self._shrink_due = True
        return given

    def restore_limits(self) -> None:
        """Puts back the limits that this Cache's `ram_limit`/`disk_limit` replaced, unless another
        Cache (process or run) has asked for a limit since, even the same one: `rq preload
        --ram-limit …` that fails keeps no new cap, and takes none from a run still going."""
        self._release_limits(restore=True)

    def keep_limits(self) -> None:
        """The limits this Cache asked for stay (a run that succeeded; close() calls it): a later
        run asking for the same limit has nothing to put back when it fails."""
        self._release_limits(restore=False)

    @_in_use
    def _release_limits(self, restore: bool) -> None:
        replaced, self._replaced = self._replaced, {}
        if restore:
            self._shrink_due = False  # (a cap about to be put back: nothing to evict for it)
        if not replaced:
            return
        index = self._state().index
        with index.write() as db:
            for tier, (before, given) in replaced.items():
                if Index.setting_in(db, f"{tier}_limit_owner") != self._claim:
                    continue  # claimed by another since: theirs to keep or put back
                stored = stored_size(Index.setting_in(db, f"{tier}_limit"))
                if restore and before is not None and stored == given:
                    Index.put_setting(db, f"{tier}_limit", str(before))
                    self.caps[tier] = before
                Index.put_setting(db, f"{tier}_limit_owner", "")
                Index.put_setting(db, f"{tier}_limit_prior", "")

    # --- per-process state ---------------------------------------------------------------------

    def _state(self) -> _ProcState:
        held: _ProcState | None = getattr(self._held, "state", None)
        if held is not None and held.pid == os.getpid():
            return held  # the one this thread's operation uses, even once close() detached it
        proc = self._proc
        if proc is not None and proc.pid == os.getpid() and not getattr(self._held, "active", False):
            return proc
        with self._lock:
            if self._proc is None or self._proc.pid != os.getpid():
                self._keep_ram_root()
                index = Index(self.layout.index_path)
                index.endpoint = self._endpoint  # recorded on the s3:// entries landed or checked
                store = Store(self.layout, index, self.caps, ram=self.ram_unavailable is None)
                store.ram_bound = self.ram_bound
                self._proc = _ProcState(os.getpid(), index, store)
                self._prefetcher = None  # threads do not survive fork
                if self._shrink_due and not index.readonly:
                    self._shrink_due = False
                    self._proc.store.shrink()
            if getattr(self._held, "active", False):  # inside an operation (_use): counted
                self._held.state = self._proc  # first: the end of _use releases what this names
                with self._proc.idle:
                    self._proc.users.add(threading.get_ident())
            return self._proc

    @contextlib.contextmanager
    def _use(self) -> Iterator[None]:
        """One operation: the per-process state it takes (_state, made on first need, so its
        arguments are checked first as before) is kept from being closed until the block ends;
        close() called meanwhile (by another thread, or this one) closes its index after the
        last use. An operation inside another of the same thread is part of it."""
        if getattr(self._held, "active", False):
            yield
            return
        try:
            self._held.active = True
            yield
        finally:
            # The thread's marks go first: an interrupt after them leaves at most its ident in
            # the set, which its next call's end discards (the same ident), and close() bounds its
            # wait; one after the release left the thread marked active on a closed state (dr5).
            state = self._held.__dict__.get("state")
            self._held.state = None
            self._held.active = False
            if state is not None and state.pid == os.getpid():  # (a fork's child: not its to end)
                state.release(threading.get_ident())

    @property
    def s3_settings(self) -> S3Settings:
        """The settings of this Cache's S3 client (endpoint_url and profile as given): made on first
        use, so that a Cache that never sees an s3:// URL does not import cache.s3."""
        settings = self._s3_settings
        if settings is None:
            from cache.s3 import S3Settings

            endpoint_url, profile = self._s3_given
            settings = self._s3_settings = S3Settings(endpoint_url=endpoint_url, profile=profile)
        return settings

    @s3_settings.setter
    def s3_settings(self, settings: S3Settings) -> None:
        self._s3_settings = settings

    def _origin_for(self, url: str) -> Origin:
        """origin_for_url: a local URL's origin needs no S3 settings (nor cache.s3 imported)."""
        if url.startswith("s3://"):
            return origin_for_url(url, self.s3_settings)
        return local_origin_for_url(url)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(
            _proc=None,
            _lock=None,
            _held=None,
            _prefetcher=None,
            _touched={},
            _verified=set(),
            _flush_pending_pid=0,
            _ram_pid=0,
            _endpoint_memo=None,
            _unreachable={},
        )
        try:
            pickle.dumps(self.on_event)
        except Exception:  # a lambda or a closure: a spawned worker reports nothing rather than fail
            state["on_event"] = ev.ignore
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._held = threading.local()
        self._keep_ram_root()  # a spawned worker holds the RAM root too

    def _keep_ram_root(self) -> None:
        """Holds the RAM root in this process if this object does not yet (a spawned or forked
        worker, a cache used again after close())."""
        if self._ram_pid != os.getpid() and self.ram_unavailable is None:
            try:
                if orphans.acquire(self.layout.ram_root):
                    self._ram_pid = os.getpid()
            except (OSError, CacheError):
                pass  # used without the lock, as before it existed; the owner check still guards

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.stop()
        self._flush_touches(force=True)
        if self._replaced and self._claim.startswith(f"{os.getpid()}:"):
            with contextlib.suppress(CacheError):
                self.keep_limits()  # (not restored by now: the limits asked for stay)
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.pid == os.getpid():
            self._close_when_unused(proc)
        with self._lock:
            if self._proc is None:  # (else another thread's operation made a new state meanwhile)
                self._let_go_of_ram_root()

    def _close_when_unused(self, proc: _ProcState) -> None:
        """Closes a detached state's index once the operations using it ended (a read-through
        under way lands and drops its hold first). It waits for them at most CLOSE_WAIT_S (its
        own thread's use not at all: close() called from inside an operation, or from a signal
        handler that interrupted one); the end of the last use closes it then."""
        me = {threading.get_ident()}
        with proc.idle:
            proc.idle.wait_for(lambda: proc.users <= me, timeout=CLOSE_WAIT_S)
            # still in use (this thread's own call, or others' past the wait): the last of them
            # closes the index as it ends. Closed under them, a slow read-through failed "remove
            # ... to start the cache over" and left its hold counted (dr5).
            proc.closing = deferred = bool(proc.users)
        if not deferred:
            proc.index.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reading -------------------------------------------------------------------------------

    @_in_use
    def open(self, url: str | os.PathLike[str], *, tier: str | None = None) -> CachedFile:
        """A verified, read-only file object for `url`; a miss fetches it first.

        Objects up to 16 MiB come back as an in-memory buffer (hashed against the recorded xxh3 on
        every open); bigger ones as a real file kept from eviction until closed. A corrupt entry is
        dropped and fetched again, never served."""
        url = normalise_url(url)
        _check_tier(tier)
        self._need_ram(tier)
        _one_object(url)
        state = self._state()
        if self._prefetcher is not None:
            self._prefetcher.advance(url)
        # A tiny cache under many readers can evict an entry between lookup and lock again and again;
        # keep trying for a while (backing off) rather than failing a training step.
        deadline = time.monotonic() + OPEN_PATIENCE
        gone = 0
        for attempt in itertools.count():
            if attempt > 4:
                if time.monotonic() > deadline:
                    break
                time.sleep(min(0.05, 0.001 * attempt) * random.uniform(0.5, 1.5))
            entry = state.index.get(url)
            if entry is None:
                return self._open_fetched(url, tier or self.default_tier)
            stale_why = None
            if self._stale(entry):
                info, stale_why = self._revalidate(entry)
                if info is not None and not self._current(entry, info):
                    return self._superseded(
                        entry, functools.partial(self._open_fetched, url, tier or entry.tier, info)
                    )
                if info is not None:
                    self._mark_checked(state.index, url)
            try:
                handle = self._open_entry(entry)
            except _Gone:
                if entry.tier == "ram" and self._ensure_ram_root():
                    tier = tier or "ram"  # its entry is dropped: fetch it again where it was
                    continue
                gone += 1
                if gone >= GONE_BEFORE_FETCH:
                    # the cached copy keeps slipping away (evicted, replaced, or locked by a landing):
                    # read through from the origin instead, landing it already locked for this reader
                    return self._open_fetched(url, tier or entry.tier)
                continue
            except VerifyError as exc:
                state.store.retire(entry)  # never a good landing made since
                self._damaged(entry, exc)
                current = state.index.get(url)
                if current is not None and not _same_landing(current, entry):
                    # another process landed it again meanwhile: read (and verify) that one
                    if entry.pinned and not current.pinned:
                        state.index.set_pinned([url], True)
                    continue
                handle = self._open_fetched(url, tier or entry.tier)
                if entry.pinned:  # the refetched copy replaces the corrupt one, pin and all
                    state.index.set_pinned([url], True)
                return handle
            if stale_why is not None:
                self._served_stale(entry, stale_why)
            self._touch(url)
            return handle
        raise CacheError(f"could not open {url}: it kept changing or being evicted for {OPEN_PATIENCE:.0f} s")

    def read_bytes(self, url: str | os.PathLike[str]) -> bytes:
        with self.open(url) as fh:
            return fh.read()

    def _stale(self, entry: Entry) -> bool:
        if not entry.url.startswith("s3://"):
            return True  # a local stat costs microseconds: always check
        age = time.time() - entry.checked_at
        # a check stamped in the future means the clock stepped back since (NTP, a resumed VM): its
        # age is unknown, so it is stale; taken as negative it disabled revalidation, max_age=0 too
        if age < 0 or age > self.max_age:
            return True
        # fetched from (or last confirmed at) another S3 endpoint than this Cache asks (staging's
        # copy, read with AWS_ENDPOINT_URL at prod): its freshness says nothing of this endpoint's
        # object, so it is asked (a HEAD: the same version is served and this endpoint recorded;
        # another is fetched). One not recorded (landed by an older rq) is fresh within max_age
        # as before, and gets this endpoint at its next check: asking at once made every such
        # hit wait on the store, 30 s where it was silent (dr6). An endpoint this Cache cannot
        # name (its AWS config unreadable) compares with nothing, as before.
        return self._elsewhere(entry)

    def _endpoint(self) -> str | None:
        """The S3 endpoint this Cache's s3:// reads and fetches go to (its S3 client's, else as that
        client would resolve it: --endpoint-url, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, the
        profile's; AWS's regional one when none is set), once per process; None if it cannot be
        told (an AWS config that cannot be read: the fetch says why)."""
        memo = self._endpoint_memo
        if memo is not None and memo[0] == os.getpid():
            return memo[1]
        from cache.s3 import endpoint_for

        endpoint = endpoint_for(self.s3_settings)
        self._endpoint_memo = (os.getpid(), endpoint)
        return endpoint

    def _mark_checked(self, index: Index, url: str) -> None:
        """Stamps one entry as checked now. The S3 endpoint (which the index records on s3:// entries
        only) is asked for only for an s3:// URL: for a local one it would cost cache.s3's import and
        a read of the AWS config, for a value not recorded."""
        index.mark_checked([url], time.time(), endpoint=None if url.startswith("s3://") else "")

    def _elsewhere(self, entry: Entry) -> bool:
        """Whether an s3:// entry is known to come from another endpoint than this Cache's."""
        mine = self._endpoint()
        if entry.endpoint is None or mine is None:
            return False
        from cache.s3 import canonical_endpoint

        return canonical_endpoint(entry.endpoint) != mine

    def _revalidate(self, entry: Entry) -> tuple[ObjectInfo | None, str | None]:
        """(the origin's current info, None), or (None, why) when the origin cannot be asked and
        the verified cached copy is to be served as it is (what huggingface_hub does on a
        connection error). An answer stands: an object the origin says is gone is dropped here
        and NotFoundError raised; refused credentials and other 4xx are raised as they are."""
        # what goes down together: a bucket's store, or a directory (its mount: a dead FUSE daemon,
        # an NFS server away), so one failed stat spares the other entries there the wait
        bucket = (
            entry.url.split("/", 3)[2]
            if entry.url.startswith("s3://")
            else "file:" + os.path.dirname(entry.url)
        )
        down = self._unreachable.get(bucket)
        if down is not None and time.monotonic() < down[0]:
            return None, self._why_unchecked(entry, down[1])
        try:
            info = self._origin_for(entry.url).stat(entry.url)
        except NotFoundError:
            # only this landing: one made since (the object put back meanwhile) is not ours to drop
            self._state().store.retire(entry)
            raise
        except CacheError as exc:
            if not _cannot_ask(exc):
                raise
            why = str(exc) or type(exc).__name__
            self._unreachable[bucket] = (time.monotonic() + UNREACHABLE_RECHECK_S, why)
            return None, self._why_unchecked(entry, why)
        self._unreachable.pop(bucket, None)
        return info, None

    def _why_unchecked(self, entry: Entry, why: str) -> str:
        """The reason a ServedStale gives; a copy from another endpoint says so (served as any stale
        copy is, as before: a proxy or a second name in front of the same store is common)."""
        if self._elsewhere(entry):
            return f"cached from {entry.endpoint}, and {self._endpoint()} could not be asked: {why}"
        return why

    def _current(self, entry: Entry, info: ObjectInfo) -> bool:
        """Whether the origin's `info` still describes the cached entry. A racy entry (a directory
        origin's file changed within its timestamp tick of being read: cache.landing.racy_at) is
        not trusted on its stat: the origin file is hashed again and compared with the recorded
        digest. Equal: current, and the mark is dropped once the file is old enough; different
        (rewritten in the same tick, stat unchanged): the entry is dropped, to be fetched again."""
        if same_version(info.version, entry.version):
            return True
        if not is_racy(entry.version) or info.version != clean_version(entry.version):
            return False
        started = time.time_ns()
        if _origin_digest(entry.url, info) == entry.xxh3:
            if not racy_at(info.version, started) and self._state().store.clear_racy(entry, info.version):
                entry.version = info.version
            return True
        self._state().store.retire(entry)  # never a landing made since
        return False

    def _superseded(self, entry: Entry, fetch: Callable[[], _T]) -> _T:
        """Fetches the version the origin just named in place of `entry`'s. Should that fetch fail
        (a corrupt body, the store failing mid-GET), the entry is dropped all the same, as it is
        when the origin says the object is gone: the copy is known superseded, and a later read
        while the store cannot be asked must not serve it as merely unchecked (ServedStale)."""
        try:
            return fetch()
        except BaseException:
            self._state().store.retire(entry)  # never a landing made since
            raise

    def _read_event(self, event: ev.Event) -> None:
        """What a read-through's fetch tells the caller: only that an object asked for in RAM
        landed on disk (a full RAM file system); its landings and progress are not news there."""
        if isinstance(event, ev.Demoted):
            self.on_event(event)

    def _damaged(self, entry: Entry, exc: VerifyError) -> None:
        """A damaged copy dropped on the way to a read: the read goes on from the origin, but a
        disk that corrupts what it holds must not go unnoticed (it did: only a new `created` stamp
        showed it)."""
        path = self.layout.blob_path(entry.tier, entry.blob)
        self.on_event(ev.Damaged(entry.url, str(path), str(exc)))

    def _served_stale(self, entry: Entry, why: str) -> None:
        self.on_event(ev.ServedStale(entry.url, max(0.0, time.time() - entry.checked_at), why))

    def _open_fetched(self, url: str, tier: str, info: ObjectInfo | None = None) -> CachedFile:
        self._need_ram(tier)
        """A miss: fetch it, landing it already under this reader's shared lock, then serve it.
        A landed copy found damaged as it is opened is dropped and fetched once more, as a hit's
        is (the landing verified it: something changed it since); damaged again, VerifyError."""
        for again in (True, False):
            entry, fd = self._fetch_one(url, tier, info, keep_open=True)
            self._touch(url)
            try:
                return self._open_entry(entry, fd)
            except VerifyError as exc:
                if not again:
                    raise
                self._state().store.retire(entry)  # never a landing made since
                self._damaged(entry, exc)
        raise AssertionError("unreachable")

    def _open_entry(self, entry: Entry, locked_fd: int = -1) -> CachedFile:
        path = self.layout.blob_path(entry.tier, entry.blob)
        if locked_fd >= 0:
            fd = locked_fd
        else:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                raise _Gone from None
            except OSError as exc:
                if exc.errno == errno.EIO:
                    raise _unreadable(entry, path, exc) from exc
                # EMFILE under a low `ulimit -n`: the library raises CacheErrors
                raise CacheError(
                    f"cannot open the cached copy of {entry.url}: {exc.strerror or exc}"
                ) from exc
        try:
            return self._verified_file(entry, fd, locked_fd >= 0)
        except OSError as exc:
            if exc.errno in _NOT_THE_COPY:
                raise CacheError(
                    f"cannot read the cached copy of {entry.url}: {exc.strerror or exc}"
                ) from exc
            # the copy cannot be read back to be verified (EIO): a bad copy, dropped and fetched
            # again as a corrupt one is (a reader's own read() after this is its own OSError)
            raise _unreadable(entry, path, exc) from exc

    def _verified_file(self, entry: Entry, fd: int, locked: bool) -> CachedFile:
        """_open_entry's file object for `fd`, once its bytes match the entry (fd closed if not)."""
        locked_fd = fd if locked else -1
        try:
            if locked_fd < 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    time.sleep(0.001)  # an evictor holds it right now
                    raise _Gone from None
            st = os.fstat(fd)
            if st.st_nlink == 0 and locked_fd < 0:
                raise _Gone  # evicted or replaced between lookup and lock (our own landing: its twin won)
            if st.st_size != entry.size:
                raise VerifyError(f"{entry.url}: cached file has {st.st_size} bytes, expected {entry.size}")
            data: bytes | None = None
            if entry.size <= SMALL_READ:
                data = _read_all(fd, entry.size)
                if xxhash.xxh3_128(data).hexdigest() != entry.xxh3:
                    raise VerifyError(f"{entry.url}: cached bytes do not match their recorded digest")
            else:
                stamp = (entry.blob, st.st_ino, st.st_mtime_ns)
                if stamp not in self._verified:
                    if file_digest(fd, entry.size) != entry.xxh3:
                        raise VerifyError(f"{entry.url}: cached bytes do not match their recorded digest")
                    self._verified.add(stamp)
        except BaseException:
            os.close(fd)
            raise
        # Past the try: an interrupt (a signal whose handler raises) right after the fd was closed
        # or handed to its file object closed it a second time there (dr4: EBADF; in a threaded
        # process another thread's descriptor, reused by then).
        if data is not None:
            os.close(fd)
            return CachedBytes(data)
        return os.fdopen(fd, "rb")  # the shared lock lives as long as this file object

    def _touch(self, url: str) -> None:
        """Records a read for LRU. Stamps are batched (one index write per second, not one per
        open); a batch is written by the next open a second later or, if the process goes
        quiet, by a timer, so another process's eviction sees recent reads as recent."""
        self._touched[url] = time.time()
        if time.monotonic() - self._last_flush > 1.0:
            self._flush_touches()
        elif self._flush_pending_pid != os.getpid():
            self._flush_pending_pid = os.getpid()
            timer = threading.Timer(1.0, self._deferred_flush)
            timer.daemon = True
            timer.start()

    def _deferred_flush(self) -> None:
        self._flush_pending_pid = 0
        self._flush_touches()

    def _flush_touches(self, force: bool = False) -> None:
        if not self._touched:
            return
        with self._use():
            with self._lock:
                held = getattr(self._held, "state", None)
                if held is None and (self._proc is None or self._proc.pid != os.getpid()):
                    return  # no state to write to (closed, or a fork's): none is made for stamps
                state = self._state()
            self._write_touches(state, force)

    def _write_touches(self, state: _ProcState, force: bool) -> None:
        touched, self._touched = self._touched, {}
        self._last_flush = time.monotonic()
        try:
            state.index.touch(touched)
        except Exception as exc:
            if force and not isinstance(exc, CacheFullError):
                raise  # LRU order is advisory; losing a batch of stamps is fine mid-run, or when
                # the index's file system is full (close() must not fail for a stamp)

    def _fetch_one(
        self, url: str, tier: str, info: ObjectInfo | None = None, keep_open: bool = False
    ) -> tuple[Entry, int]:
        """Fetches one object into `tier`; with keep_open, also a read fd holding a shared lock."""
        from cache.fetcher import Fetcher, Job

        origin = self._origin_for(url)
        info = info or origin.stat(url)
        state = self._state()
        if tier == "ram":
            self._ensure_ram_root()
        for again in (True, False):
            fetcher = Fetcher(
                state.store, self.layout, tier, 16, self._read_event, durable=self.durable, keep_entries=True
            )
            try:
                result = fetcher.run([Job(info, origin, keep_open=keep_open)])
            except CacheError:
                if not (again and tier == "ram" and self._ensure_ram_root()):
                    raise
                continue  # the RAM root went while we fetched: once more into the new one
            if result.failed and again and tier == "ram" and self._ensure_ram_root():
                continue
            break
        if result.failed:
            failure = result.failed[0]
            raise error_for(failure.kind, failure.message, failure.error)
        entry = result.landed[0]
        return entry, result.kept.get(entry.url, -1)

    @_in_use
    def prefetch(
        self, urls: Iterable[str | os.PathLike[str]], ahead: int = 64, tier: str = "ram"
    ) -> Prefetcher:
        """Keeps the next `ahead` items of `urls` (in the order `open` will ask for them) cached in
        `tier`, fetching from the origin or promoting from disk in a background thread."""
        if isinstance(urls, str | bytes):
            raise BadSourceError("prefetch takes the URLs in the order they will be read, not one URL")
        _check_tier(tier)
        self._need_ram(tier)
        self._state()
        if self._prefetcher is not None:
            self._prefetcher.stop()
        self._prefetcher = Prefetcher(self, [normalise_url(u) for u in urls], ahead, tier)
        self._prefetcher.start()
        return self._prefetcher

    # --- preload and inspection ----------------------------------------------------------------

    @_in_use
    def preload(
        self,
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
        """Fetches every object under `sources` (s3:// prefixes, directories, files) into `tier`,
        skipping what is cached at the same version (rq preload; docs/cache.md)."""
        from cache.preload import run_preload

        _check_tier(tier)
        self._need_ram(tier)
        self._shrink_due = False  # the preload evicts down once its listing answered (preload.py)
        return run_preload(
            self,
            sources,
            include=include,
            exclude=exclude,
            tier=tier,
            workers=workers,
            dry_run=dry_run,
            keep_planned=keep_planned,
            on_event=on_event,
        )

    def entries(self, pattern: str | None = None) -> list[Entry]:
        """Entries whose URL is `pattern`, starts with it when it ends in `/`, or matches it as a
        glob. A local path is made absolute first, as the URLs of local entries are. All in one
        list: iter_entries() walks a cache of millions in bounded memory."""
        return list(self.iter_entries(pattern))

    def iter_entries(self, pattern: str | None = None) -> Iterator[Entry]:
        """entries(), in URL order, read from the index a page at a time (Index.pages: no read
        transaction held between pages). Only the URLs under the pattern's literal start (up to
        its first `*`, `?` or `[`) are read: `s3://b/train/*.tar` is a range of the index."""
        for page in self._pages(pattern):
            yield from page

    def _pages(self, pattern: str | None) -> Iterator[list[Entry]]:
        if pattern is not None:
            pattern = normalise_pattern(pattern)
        with self._use():
            index = self._state().index
            literal = pattern is not None and (not _GLOB.search(pattern) or _names_literally(index, pattern))
        if pattern is None:
            prefix = ""
        elif literal:
            # literal first: a PATTERN that names a cached entry (or a directory of them) as it is
            # written is that entry, even with `*`, `?` or `[` in it (`data/run[1]` listed nothing
            # and exited 3, or matched `data/run1` instead); it is read as a glob only otherwise
            prefix = pattern
        else:
            prefix = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
        for page in self._index_pages(prefix):
            if pattern is not None:
                page = [e for e in page if _match(e.url, pattern, glob=not literal)]
            if page:
                yield page

    def _index_pages(self, prefix: str) -> Iterator[list[Entry]]:
        """Index.pages, each page read under a use of its own: never one held while the caller
        has the page (close() would wait for a loop the caller may never finish), and a page
        after a close() is read from the state made again."""
        last: str | None = None
        while True:
            with self._use():
                page = next(self._state().index.pages(prefix, after=last), None)
            if page is None:
                return
            yield page
            last = page[-1].url

    @_in_use
    def stat(self, url: str | os.PathLike[str]) -> Entry:
        """The index's entry for one cached URL (NotFoundError when not cached; BadSourceError for
        a prefix or a bucket, as `open` refuses them)."""
        url = normalise_url(url)
        _one_object(url)
        entry = self._state().index.get(url)
        if entry is None:
            raise NotFoundError(f"not cached: {url}")
        return entry

    @_in_use
    def path(self, url: str | os.PathLike[str], *, fresh: bool = False) -> Path:
        """The file holding a cached URL (NotFoundError when not cached). With `fresh`, the entry is
        first revalidated the way `open` does (a local origin always, S3 after `max_age`), and
        fetched again when the origin has a new version or the cached file has gone; the bytes
        are not re-hashed (that is `open`'s or `verify`'s job)."""
        entry = self.stat(url)
        path = self.layout.blob_path(entry.tier, entry.blob)
        if not fresh:
            return path
        info = None
        superseded = False
        if self._stale(entry):
            info, stale_why = self._revalidate(entry)
            if info is None and stale_why is not None and path.exists():
                self._served_stale(entry, stale_why)
                return path
            if info is not None and self._current(entry, info):
                self._mark_checked(self._state().index, entry.url)
                if path.exists():
                    return path
            else:
                superseded = info is not None  # the origin named a newer version
        elif path.exists():
            return path
        # changed at the origin, or gone here
        if superseded:
            fetched, _ = self._superseded(
                entry, functools.partial(self._fetch_one, entry.url, entry.tier, info)
            )
        else:
            fetched, _ = self._fetch_one(entry.url, entry.tier, info)
        if entry.pinned:
            self._state().index.set_pinned([entry.url], True)
        return self.layout.blob_path(fetched.tier, fetched.blob)

    @_in_use
    def usage(self) -> dict[str, dict[str, int]]:
        self._ensure_ram_root()  # entries whose RAM root went are no usage
        state = self._state()
        # holds of processes that died (a reader killed with -9 mid-fetch) are nobody's work in
        # flight: given back first, not reported as `held` until a tier happens to need room
        if not state.index.readonly:  # (a read-only cache: as it is)
            state.store.collect()
        out = state.index.usage()
        for tier in TIERS:
            out[tier]["limit"] = self.caps[tier]
        return out

    @_in_use
    def verify(
        self,
        pattern: str | None = None,
        repair: bool = False,
        on_problem: Callable[[Problem], None] | None = None,
        on_dropped: Callable[[str], None] | None = None,
    ) -> tuple[int, list[Problem]]:
        """Re-hashes every entry against its recorded xxh3; returns (checked, problems).
        `on_problem` is called with each problem as it is found (and after its repair).
        A RAM entry whose file is gone (half-evicted by an older rq, or removed from /dev/shm) is
        no problem: nothing wrong can be read from it. Its row is dropped as an eviction (the
        next read fetches the object again) and `on_dropped` is called with its URL."""
        state = self._state()
        if repair:
            state.index.check_writable()  # (before hours of hashing)
        problems: list[Problem] = []
        checked = 0
        for entry in self.iter_entries(pattern):
            checked += 1
            found = self._verify_entry(entry)
            if found is None:
                continue
            entry, problem = found
            if entry.tier == "ram" and problem == "missing file" and not state.index.readonly:
                removed = state.store.retire(entry)  # never a landing made since
                if removed and on_dropped is not None:
                    on_dropped(entry.url)
                continue
            problems.append(Problem(entry.url, problem))
            if repair:
                state.store.retire(entry)  # never a landing made since
            if on_problem is not None:
                on_problem(problems[-1])
        if repair:
            state.index.recount()  # totals an older rq or another program left wrong bind every cap
        if not state.index.readonly:
            state.store.collect(sweep_objects=repair)
        return checked, problems

    def _verify_entry(self, entry: Entry) -> tuple[Entry, str] | None:
        """(entry, problem), or None if it is sound. Entries move while we look (promoted, demoted,
        evicted, re-landed by other processes): a problem counts only if the index still names
        the same landing afterwards, else the entry's current file is checked instead. File names
        are fixed per URL and version, so an entry evicted and landed again between the check and
        the re-read names the same (tier, blob, xxh3): its `created` stamp tells the landings
        apart (a demotion keeps it, but moves the tier)."""
        index = self._state().index
        problem: str | None = None
        for _ in range(5):
            problem = _check_blob(self.layout.blob_path(entry.tier, entry.blob), entry)
            if problem is None:
                return None
            current = index.get(entry.url)
            if current is None:
                return None  # evicted meanwhile: nothing cached, nothing wrong
            if _same_landing(current, entry):
                return entry, problem
            entry = current
        return (entry, problem) if problem is not None else None

    @_in_use
    def evict(self, pattern: str) -> tuple[int, int]:
        """(evicted, skipped because open or pinned)."""
        state = self._state()
        done = skipped = 0
        full: list[Entry] = []
        for entry in self.iter_entries(pattern):
            if entry.pinned:
                skipped += 1
            else:
                done, skipped = _count_removal(state.store, entry, full, done, skipped)
        return _finish_removals(state.store, full, done, skipped)

    @_in_use
    def pin(self, pattern: str, pinned: bool = True) -> int:
        """How many entries match; they are (un)pinned a page at a time, one transaction each."""
        index = self._state().index
        n = 0
        for page in self._pages(pattern):
            index.set_pinned([e.url for e in page], pinned)
            n += len(page)
        return n

    @_in_use
    def clear(self) -> tuple[int, int]:
        """Evicts everything not open (pins included); removes stale partial downloads."""
        state = self._state()
        done = skipped = 0
        full: list[Entry] = []
        for entry in self.iter_entries():
            done, skipped = _count_removal(state.store, entry, full, done, skipped)
        done, skipped = _finish_removals(state.store, full, done, skipped)
        with state.index.write() as db:
            for hold in Index.holds(db):
                if hold.kind == "landing" and hold.pid == 0:
                    Index.drop_hold(db, hold.id)
        state.store.collect(sweep_objects=True)
        return done, skipped

    @_in_use
    def collect(self) -> dict[str, int]:
        return self._state().store.collect(sweep_objects=True)


def _count_removal(store: Store, entry: Entry, full: list[Entry], done: int, skipped: int) -> tuple[int, int]:
    """One entry of `evict`/`clear` removed, counted. On a full file system its file is unlinked
    but its row may not be deletable yet (a RAM file frees no disk space): it is kept in `full`
    for _finish_removals, once other files have freed some."""
    try:
        removed = store.remove(entry)
    except CacheFullError:
        full.append(entry)
        return done, skipped
    return (done + 1, skipped) if removed else (done, skipped + 1)


def _finish_removals(store: Store, full: list[Entry], done: int, skipped: int) -> tuple[int, int]:
    """Deletes the rows of the entries whose files _count_removal unlinked on a full file system
    (CacheFullError if there is still no space: their rows name missing files, which open fetches
    again and `rq cache verify --repair` drops)."""
    for entry in full:
        done, skipped = (done + 1, skipped) if store.remove(entry) else (done, skipped + 1)
    return done, skipped


class Prefetcher:
    """Background warmer: keeps items [position, position + ahead) of an epoch order in a tier."""

    MAX_ERRORS = 100  # the newest kept: a long run over missing items must not grow without end
    # items past the window one look may check for reads (_follow_other_processes): ~10 ms of
    # index lookups, every 0.5 s while the window is warm and its items unread
    FOLLOW_BEYOND = 4096
    # a read this soon after the window passed an item is taken for a straggler of that place,
    # not for the item's next place past the window (_furthest_read)
    STRAGGLER_S = 5.0

    def __init__(self, cache: Cache, urls: list[str], ahead: int, tier: str):
        # imported here, on the caller's thread, rather than first on the prefetch thread
        importlib.import_module("cache.fetcher")

        self.cache, self.urls, self.ahead, self.tier = cache, urls, max(1, ahead), tier
        # where each URL first comes, and every place of those that come again (several epochs in
        # one list, sampling with replacement): a read moves the window to the right occurrence
        self.first: dict[str, int] = {}
        self.again: dict[str, list[int]] = {}
        for i, u in enumerate(urls):
            j = self.first.setdefault(u, i)
            if j != i:
                self.again.setdefault(u, [j]).append(i)
        self.position = 0
        self.errors: list[str] = []
        # reads in other processes (DataLoader workers) reach us through the index's LRU stamps
        self._since = time.time()
        self._seen: dict[str, float] = {}
        # (wall, monotonic) when _since and _seen were last put in the wall clock's frame
        self._frame = (self._since, time.monotonic())
        self._wake = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="rq-prefetch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def advance(self, url: str) -> None:
        i = self._place(url)
        if i is not None and i >= self.position:
            with self._wake:
                self._move_to(i)
                self._wake.notify_all()

    def _move_to(self, i: int) -> None:
        """Moves the window (caller holds _wake). The URLs passed get a stamp: a read of one of
        them counts for _follow_other_processes only if it is newer (the same URL again, later in
        the list, is read again only after this)."""
        if i <= self.position:
            return
        now = time.time()
        for url in self.urls[self.position : i + 1]:
            self._seen[url] = now
        self.position = i

    def _place(self, url: str) -> int | None:
        """The position a read of `url` stands for: its next occurrence from here, unless it is a
        straggler of the window just passed (DataLoader workers finish out of order), which must
        not pull the window to its next epoch's place."""
        places = self.again.get(url)
        if places is None:
            return self.first.get(url)
        k = bisect.bisect_left(places, self.position)
        if k > 0 and self.position - places[k - 1] <= self.ahead:
            return None
        return places[k] if k < len(places) else None

    def _error(self, text: str) -> None:
        self.errors.append(text)
        del self.errors[: -self.MAX_ERRORS]

    def wait_warm(self, timeout: float = 30.0) -> bool:
        """Blocks until the current window is warm (for tests and for a first batch)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._missing(self.position):
                return True
            time.sleep(0.02)
        return False

    def _missing(self, start: int) -> list[str]:
        window = list(dict.fromkeys(self.urls[start : start + self.ahead]))  # a repeat is one fetch
        with self.cache._use():  # (wait_warm's thread: a close() meanwhile waits for it)
            have = self.cache._state().index.get_many(window)
        return [u for u in window if u not in have or have[u].tier != self.tier]

    def _follow_other_processes(self) -> bool:
        """Moves the window past items read by other processes since it started: a prefetch made
        in the training process and reads in its forked or spawned DataLoader workers. Their reads
        are known from the LRU stamps they write to the index (batched: about a second late), a
        stamp newer than the entry itself being a read rather than the landing. A read made before
        our own promotion of the entry (a new landing) whose stamp arrives after it is recorded by
        Index.touch just past `created` (READ_BEFORE_LANDING): it counts as well.

        With no read in the window, it looks past it, in spans that double, up to FOLLOW_BEYOND
        items a look: workers that got ahead of the window (reads swallowed by the promotions of
        the items they had just read, or made while the window was being warmed) read nothing in
        it any more, and the window stood still for the rest of the run (pt: position 448 of 4,000
        with 4 workers). A URL counts at its first place from the window on, so a read of this
        epoch's copy never pulls the window to the next epoch's."""
        start = self.position
        now = self._reframe()
        seen: set[str] = set()
        lo, hi = start, start + self.ahead
        furthest = -1
        while lo < len(self.urls):
            furthest = self._furthest_read(lo, hi, seen, now, beyond=lo > start)
            if furthest >= 0 or hi - start >= self.ahead + self.FOLLOW_BEYOND:
                break
            lo, hi = hi, hi + (hi - start)
        with self._wake:
            self._move_to(furthest)
        return furthest > start

    def _furthest_read(self, lo: int, hi: int, seen: set[str], now: float, beyond: bool = False) -> int:
        """The furthest place in [lo, hi) whose item other processes read, or -1. URLs in `seen`
        (met at an earlier place) are passed over; those met here are added to it. `beyond` the
        window, a URL the window passed at an earlier place counts only for a read more than
        STRAGGLER_S after that: DataLoader workers finish out of order, and a late read of an
        item just passed pulled the window to its next epoch's place (dr3: 59 -> 150 of 200)."""
        span = [u for u in self.urls[lo:hi] if u not in seen]
        have = self.cache._state().index.get_many(set(span))
        furthest = -1
        for i, url in enumerate(self.urls[lo:hi], lo):
            if url in seen:
                continue
            seen.add(url)
            e = have.get(url)
            if e is None:
                continue
            after = max(self._since, self._seen.get(url, 0.0))
            if beyond and url in self._seen:
                after = self._seen[url] + self.STRAGGLER_S
            if e.created > now:
                # landed before the wall clock stepped back: its landing stamp is ahead of every
                # read since, so any other stamp (Index.touch moves one that lies ahead) is a read
                read = e.last_access != e.created and e.last_access > after
            else:
                read = e.last_access > max(e.created, after)
            if read:
                furthest = i
        return furthest

    def _reframe(self) -> float:
        """The wall clock now; when it stepped back since the last look (NTP, a resumed VM: the
        workers' stamps are then behind our own), _since and _seen are moved back by the step,
        as the monotonic clock measures it, so that a read after the step still counts."""
        now, mono = time.time(), time.monotonic()
        wall0, mono0 = self._frame
        step = (now - wall0) - (mono - mono0)
        if step < -1.0:
            self._since += step
            with self._wake:
                for url in self._seen:
                    self._seen[url] += step
        self._frame = (now, mono)
        return now

    def _run(self) -> None:
        done_upto = -1
        while True:
            with self._wake:
                if not self._stop and self.position + self.ahead - 1 <= done_upto:
                    self._wake.wait(timeout=0.5)
                if self._stop or self.position >= len(self.urls):
                    return
            try:
                # before warming a window, skip what workers already read: warming it would
                # promote those entries and with them lose the stamps that say they were read
                with self.cache._use():  # close() stops us, but must not pull the index from under us
                    while self._follow_other_processes():
                        pass
            except Exception as exc:  # the index busy or gone: the next look may do better
                self._error(f"{type(exc).__name__}: {exc}")
            with self._wake:
                start = self.position
                if start + self.ahead - 1 <= done_upto or start >= len(self.urls):
                    continue
            try:
                with self.cache._use():
                    self._warm(start)
            except Exception as exc:  # a prefetch thread must not die of one bad item
                self._error(str(exc) if isinstance(exc, CacheError) else f"{type(exc).__name__}: {exc}")
                time.sleep(0.5)
            done_upto = min(len(self.urls) - 1, start + self.ahead - 1)
            if done_upto >= len(self.urls) - 1:
                return

    def _warm(self, start: int) -> None:
        from cache.fetcher import Fetcher, Job

        cache = self.cache
        state = cache._state()
        if self.tier == "ram":
            cache._ensure_ram_root()  # gone under us: its entries would look warm, landings fail
        missing = self._missing(start)
        if not missing:
            return
        have = state.index.get_many(missing)
        jobs = []
        for url in missing:
            entry = have.get(url)
            if entry is not None:
                # promote from the other tier: the cached copy is the origin
                # the cached URL and version, so the landed copy replaces the entry in its old tier
                # (with the real origin behind it: a copy evicted, deleted or damaged since is
                # fetched from there, as a read would, instead of leaving the item cold)
                path = cache.layout.blob_path(entry.tier, entry.blob)
                try:
                    origin = cache._origin_for(url)
                except CacheError:
                    origin = None
                jobs.append(Job(_entry_info(entry), _PromoteOrigin(path, entry, fallback=origin)))
            else:
                try:
                    origin = cache._origin_for(url)
                    jobs.append(Job(origin.stat(url), origin))
                except CacheError as exc:  # one missing item must not cost the whole window
                    self._error(str(exc))
        fetcher = Fetcher(state.store, cache.layout, self.tier, 32, cache._read_event, durable=cache.durable)
        result = fetcher.run(jobs)
        for failure in result.failed:  # each item that failed alone, for whoever reads .errors
            self._error(
                failure.message if failure.url in failure.message else f"{failure.url}: {failure.message}"
            )


class _PromoteOrigin(LocalOrigin):
    """Copies a cached blob into another tier (RAM promotion). The blob is checked against its
    recorded digest once (streaming, bounded memory) before any of it is copied."""

    # a promotion that finds the RAM file system full leaves the copy on disk where it is, rather
    # than have the fetcher copy it onto disk a second time (Fetcher._elsewhere)
    promotes = True

    def __init__(self, path: Path, entry: Entry, fallback: Origin | None = None):
        super().__init__(path.parent, workers=8)
        self.path, self.entry = path, entry
        self.fallback = fallback  # the real origin, for a cached copy that vanished or is corrupt
        self._checked = threading.Lock()
        self._ok = False
        self._fell_back = False

    def checksums(self, info: ObjectInfo) -> Checksums:
        # a big object whose pieces came (some of them) from the real origin is checked as that
        # origin's objects are; bytes copied from the verified cached copy need nothing more
        if self._fell_back and self.fallback is not None:
            return self.fallback.checksums(info)
        return Checksums()

    def _verify_once_or_close(self, fd: int) -> None:
        try:
            self._verify_once(fd)
        except BaseException:
            os.close(fd)
            raise

    def _verify_once(self, fd: int) -> None:
        with self._checked:
            if not self._ok:
                try:
                    digest = file_digest(fd, self.entry.size)
                except OSError as exc:  # (EIO) fetched from the real origin instead, as a corrupt one is
                    raise _unreadable(self.entry, self.path, exc) from exc
                if digest != self.entry.xxh3:
                    raise VerifyError(f"{self.entry.url}: cached copy is corrupt; not promoting it")
                self._ok = True

    def fetch(self, info: ObjectInfo, landing: Any, on_done: Any, piece: tuple[int, int] | None) -> None:
        def run() -> None:
            try:
                try:
                    fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
                    self._verify_once_or_close(fd)
                except (FileNotFoundError, VerifyError):
                    if self.fallback is None:
                        raise
                    # evicted or damaged since it was planned: nothing is written yet, so the
                    # real origin can deliver the same bytes (the landing checks them as usual).
                    # No longer a promotion: a RAM file system found full must not leave it
                    # "cached on disk" (Fetcher._elsewhere), where it is not
                    self._fell_back = True
                    self.promotes = False
                    self.fallback.fetch(info, landing, on_done, piece)
                    return
                try:
                    start, end = piece if piece else (0, self.entry.size - 1)
                    buf = memoryview(bytearray(min(self.CHUNK, max(1, end + 1 - start))))
                    while start <= end:
                        n = os.preadv(fd, [buf[: min(len(buf), end + 1 - start)]], start)
                        if n == 0:
                            raise VerifyError(f"{self.entry.url}: cached copy is shorter than recorded")
                        landing.write(buf[:n], start)
                        start += n
                finally:
                    os.close(fd)
            except FileNotFoundError:
                on_done(NotFoundError(f"{self.entry.url}: cached copy vanished while promoting it"))
            except BaseException as exc:
                on_done(exc)
            else:
                on_done(None)

        self.pool(8).submit(run)

    def stat(self, url: str) -> ObjectInfo:
        return ObjectInfo(url, url, self.entry.size, self.entry.version)


_S3_VERSION = re.compile(r"etag:(.*);size:\d+(?:;vid:.*)?", re.DOTALL)


def _entry_info(entry: Entry) -> ObjectInfo:
    """What the origin said of a cached entry's object when it was landed: its URL, size, version
    and (S3) ETag, enough to fetch that very version again (a big object's ranges are asked
    If-Match its ETag; a plain-MD5 ETag checks a whole object's body)."""
    m = _S3_VERSION.fullmatch(entry.version) if entry.url.startswith("s3://") else None
    key = entry.url.rsplit("/", 1)[-1]
    return ObjectInfo(entry.url, key, entry.size, entry.version, m.group(1) if m else None)


def _cannot_ask(exc: CacheError) -> bool:
    """The store could not give an answer (refused, reset, silent, 5xx or throttled after the
    retries), as opposed to answering no: a 4xx, refused credentials, an untrusted certificate."""
    if isinstance(exc, UnreachableError):
        return True
    if isinstance(exc, OriginError):
        status = getattr(exc, "status", None)
        return status is None or status >= 500 or status == 429
    return False


def _claim_alive(claim: str) -> bool:
    """Whether the process that claimed a limit (`pid:start:nonce`, Cache._claim_limit) runs."""
    pid, _, rest = claim.partition(":")
    start = rest.partition(":")[0]
    return pid.isdigit() and start.isdigit() and procs.alive(int(pid), int(start))


def _same_landing(a: Entry, b: Entry) -> bool:
    return (a.tier, a.blob, a.xxh3, a.created) == (b.tier, b.blob, b.xxh3, b.created)


def _origin_digest(url: str, info: ObjectInfo) -> str | None:
    """The digest of a directory origin's file as a landing records it, or None if it cannot be
    read or is not at `info`'s version before and after the read (then it is fetched again)."""
    try:
        fd = os.open(url, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if local_version(os.fstat(fd)) != info.version:
            return None
        digest = file_digest(fd, info.size)
        return digest if local_version(os.fstat(fd)) == info.version else None
    except OSError:
        return None
    finally:
        os.close(fd)


UNREADABLE = "unreadable"  # how a Problem (rq cache verify) whose copy cannot be read begins
# errors reading a cached copy that are not the copy's: a limit of this process or machine
_NOT_THE_COPY = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOLCK))


def _check_blob(path: Path, entry: Entry) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return "missing file"
    except OSError as exc:
        if exc.errno in _NOT_THE_COPY:
            raise  # this process's or the machine's limit, not the entry's fault
        return f"{UNREADABLE} ({path}: {exc.strerror or exc})"
    try:
        size = os.fstat(fd).st_size
        if size != entry.size:
            return f"size {size}, expected {entry.size}"
        if file_digest(fd, size) != entry.xxh3:
            return "digest mismatch (corrupt)"
        return None
    except OSError as exc:  # EIO reading it back: one bad entry, the rest are still checked
        if exc.errno in _NOT_THE_COPY:
            raise
        return f"{UNREADABLE} ({path}: {exc.strerror or exc})"
    finally:
        os.close(fd)


UNREADABLE_HINT = (
    "the disk under the cache may be failing (see dmesg); `rq cache verify --repair` drops unreadable entries"
)


def _unreadable(entry: Entry, path: Path, exc: OSError) -> VerifyError:
    """A cached copy that cannot be read back (EIO): a bad copy, as a corrupt one is."""
    error = VerifyError(f"cannot read the cached copy of {entry.url} ({path}): {exc.strerror or exc}")
    error.hint = UNREADABLE_HINT
    return error


def _read_all(fd: int, size: int) -> bytes:
    data = os.read(fd, size)
    if len(data) == size:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _one_object(url: str) -> None:
    """`open`, `stat` and `path` name one object: a prefix or a bucket alone is refused alike
    (stat and path said "not cached" for them, where open said what was wrong)."""
    if url.endswith("/"):
        raise BadSourceError(f"{url} names a prefix or directory, not one object")
    if url.startswith("s3://") and "/" not in url[5:]:
        raise BadSourceError(f"{url} names a bucket, not an object (s3://bucket/key)")


def _check_tier(tier: str | None) -> None:
    if tier is not None and tier not in TIERS:
        raise BadSourceError(f"tier must be one of {', '.join(TIERS)}, not {tier!r}")


def _match(url: str, pattern: str, glob: bool = True) -> bool:
    if pattern == url:
        return True
    if pattern.endswith("/") and url.startswith(pattern):
        return True
    if not glob:
        # a prefix without its slash, as `rq preload s3://b/train` takes it: what is under it
        # (`rq cache ls /data/set` after `rq preload /data/set` listed nothing, exit 3)
        return url.startswith(pattern + "/")
    return fnmatch.fnmatchcase(url, pattern)


def _names_literally(index: Index, pattern: str) -> bool:
    """Whether `pattern`, wildcards and all, is a cached URL or a directory of cached URLs."""
    if not pattern.endswith("/") and index.get(pattern) is not None:
        return True
    under = pattern if pattern.endswith("/") else pattern + "/"
    return next(iter(index.pages(under, page=1)), None) is not None


_GLOB = re.compile(r"[*?\[]")


__all__ = ["Cache", "Prefetcher", "ev"]
