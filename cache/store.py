"""Tiers and their caps: reserving space, evicting (RAM demotes to disk, disk drops), landing entries.

The cap is never exceeded, by construction:
  * space is reserved (a `holds` row) before a byte is written, inside BEGIN IMMEDIATE, and a
    reservation that does not fit first evicts least-recently-used entries;
  * a victim's row turns into an `evicting` hold in the same transaction, and that hold is dropped
    only after the victim's file is unlinked, so accounting never runs below what is on disk;
  * every file under objects/ or tmp/ is covered by an entry or a hold at every moment.

Readers hold a shared flock on the blob they read; the evictor takes an exclusive non-blocking flock
before it chooses a victim, so an open entry is skipped, never pulled from under a reader. flock is
only that signal: correctness of the bytes comes from immutable blob names, rename, and digests.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from cache import procs
from cache.digests import is_big
from cache.errors import BusyError, CacheError, CacheFullError, FileSystemFullError
from cache.index import Entry, Hold, Index
from cache.layout import Layout, blob_hash, make_private
from cache.sizes import format_size, inodes_note, stored_size


@dataclass(frozen=True)
class HoldSpec:
    size: int
    blob: str
    url: str | None


class OverCapError(CacheFullError):
    """What a reservation asked for is more than the whole cap. For a batch this is no reason to
    stop: another process may have lowered the cap since the batch was sized, so the caller sizes
    it again from `cap` (the cap just read)."""

    def __init__(self, message: str, cap: int, count: int):
        super().__init__(message)
        self.cap, self.count = cap, count


def _try_lock(path: Path, operation: int) -> int | None:
    """An fd holding `operation` (LOCK_EX or LOCK_SH) on `path`; -1 when the file is already gone;
    None when another process holds a lock in the way."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return -1
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _unlock(victims: list[tuple[Entry, int, int]]) -> None:
    """Closes the LOCK_EX descriptors of victims picked but not retired (an interrupt, or a failed
    commit, between the two: the rolled-back rows name those files again). Kept, each lock would
    shut out every reader and eviction of that blob, and a later landing of it would wait in
    lock_twin, for as long as the process lives."""
    while victims:
        fd = victims.pop()[1]
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def lock_exclusive(path: Path) -> int | None:
    """An fd holding LOCK_EX on `path`; -1 when the file is already gone; None when a reader has it."""
    return _try_lock(path, fcntl.LOCK_EX)


TWIN_PATIENCE = 60.0  # longest wait for an evictor (a demotion: copy + fsync) to let go of a twin


def lock_twin(path: Path, patience: float = TWIN_PATIENCE) -> int:
    """An fd holding LOCK_SH on the file now named `path` (a twin: same URL and version, landed by
    another process), or -1 once the name is free. Every remover (eviction, demotion, `remove`,
    garbage) holds LOCK_EX on the file from before it decides until after it unlinks the name: a
    twin adopted without this lock could be unlinked right after, leaving the new index row naming
    a missing file. While one does, this waits; the name it then unlinks is free to link again."""
    deadline = time.monotonic() + patience
    pause = 0.002
    while True:
        fd = _try_lock(path, fcntl.LOCK_SH)
        if fd == -1:
            return -1
        if fd is None:
            if time.monotonic() > deadline:
                raise BusyError(f"{path} stayed locked by another process for {patience:.0f} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            continue
        try:
            now = os.lstat(path)
        except FileNotFoundError:
            now = None
        mine = os.fstat(fd)
        if now is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
            return fd
        os.close(fd)  # unlinked (and maybe landed again) before we locked it: look again


def unlink_quiet(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def libc_function(name: str, *argtypes: Any) -> Any:
    """A libc call Python's os module lacks, or False where this libc has none. Looked up among the
    symbols already loaded in this process: ctypes.util.find_library would fork /sbin/ldconfig to
    find a file we have mapped anyway."""
    import ctypes

    func = getattr(ctypes.CDLL(None, use_errno=True), name, None)
    if func is None:
        return False
    func.argtypes = list(argtypes)
    return func


_syncfs: Any = None


def syncfs(path: Path, held: int = -1) -> bool:
    """Makes everything written on the file system holding `path` durable (Linux syncfs: file data,
    inodes and directory entries, in one call whose writes the kernel merges). Returns False where
    the call is missing; the caller then fsyncs file by file. `held`: a descriptor already open on
    that file system, used instead of opening `path` (under a low open-files limit that open
    failed with EMFILE and stopped the run)."""
    global _syncfs
    if _syncfs is None:
        import ctypes

        _syncfs = libc_function("syncfs", ctypes.c_int)
    if not _syncfs:
        return False
    fd = held if held >= 0 else os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _syncfs(fd) != 0:
            import ctypes

            err = ctypes.get_errno()
            raise OSError(err, f"syncfs: {os.strerror(err)}", str(path))
    finally:
        if fd != held:
            os.close(fd)
    return True


class InFlight(NamedTuple):
    """Landings in flight on a file system (Store.room): what they give back once landed and
    evicted, their blocks and a file each."""

    bytes: int = 0
    landings: int = 0

    def hold(self, nbytes: int, files: int) -> bool:
        """Whether the room a landing lacks (`nbytes` bytes, `files` files; <= 0: none of it) is
        held by these landings, so that waiting for them to land can give it back. Never when
        nothing is lacking in a way they can give: a shortage of files that no landing holds (the
        files are others', not rq's) is not waited for, however many bytes are in flight."""
        if nbytes <= 0 and files <= 0:
            return False
        return nbytes <= self.bytes and files <= self.landings and self.landings > 0

    def plus(self, other: InFlight) -> InFlight:
        return InFlight(self.bytes + other.bytes, self.landings + other.landings)


class FsRoom(NamedTuple):
    """What the file system holding a tier has free to us (statvfs)."""

    free: int  # bytes
    block: int  # its block size
    files: int | None  # files (inodes) it can still make; None: it sets no limit
    # (Store.room) the landings in flight there of other live processes, and of this one: once
    # landed they are entries that can be evicted, so waiting for them can give back that much
    others: InFlight = InFlight()
    own: InFlight = InFlight()


# What landing one object may take of a file system's files: its own, and the objects/xx/ directory
# a new name may need. tmpfs (nr_inodes) runs out of these as it does of bytes.
FILES_PER_OBJECT = 2
# ... and one more while it is published: tmpfs counts a hard link as a file, and the temp file is
# linked to its final name before its temp name goes (one object at a time)
FILES_TO_PUBLISH = 1


def fs_room(path: Path) -> FsRoom | None:
    """What the file system holding `path` has free to us; None if it cannot tell."""
    try:
        fs = os.statvfs(path)
    except OSError:
        return None
    block = fs.f_frsize or 4096
    # f_files 0: the file system sets no limit on files (tmpfs with nr_inodes=0, btrfs)
    return FsRoom(fs.f_bavail * block, block, fs.f_favail if fs.f_files else None)


def fs_need(size: int, block: int) -> int:
    """What a file of `size` bytes takes: whole blocks, and one more for the directory entry a new
    objects/xx/ may need."""
    return -(-size // block) * block + block


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Store:
    def __init__(self, layout: Layout, index: Index, caps: dict[str, int], ram: bool = True):
        self.layout = layout
        self.index = index
        self.caps = caps
        self.ram = ram  # False: this machine has no usable RAM tier (Cache.ram_unavailable); its cap is 0
        # the most RAM this process may cache whatever cap the index records (half its cgroup's
        # memory limit: Cache.ram_bound), or None: a recorded cap above it is lowered to it here
        self.ram_bound: int | None = None
        self.owner = procs.me()
        # looks that found the RAM file system's missing room held by other processes' landings
        # in flight, and waited a moment for them (reserve, make_room): what a test can count
        self.landing_waits = 0

    def refresh_owner(self) -> None:
        self.owner = procs.me()

    # --- reserving -----------------------------------------------------------------------------

    def reserve(self, tier: str, specs: list[HoldSpec], patience: float = 10.0) -> list[int]:
        """Holds space for `specs` in `tier`, evicting LRU entries if needed; returns hold ids."""
        need = sum(s.size for s in specs)
        deadline = time.monotonic() + patience
        while True:
            victims: list[tuple[Entry, int, int]] = []
            try:
                with self.index.write() as db:
                    # read inside this transaction: a separate read of the setting cost two more
                    # SQLite transactions per object (~4% of a preload of many small files)
                    cap = self._cap_in(db, tier)
                    if need > cap:
                        raise OverCapError(
                            f"{tier} tier cap is {format_size(cap)}; {format_size(need)} cannot fit even in an empty tier",
                            cap,
                            len(specs),
                        )
                    used = Index.used(db, tier)
                    if used + need <= cap:
                        short = self._fs_short(db, tier, specs)
                        if short is None:
                            return [self._add_or_adopt(db, tier, s) for s in specs]
                        nbytes, files, room = short
                        try:
                            victims = self._pick_victims(db, tier, nbytes, files=files)
                        except CacheFullError:
                            if patience <= 0 and room.others.plus(room.own).hold(nbytes, files):
                                # the caller has landings of its own in flight (Fetcher._admit): it
                                # tries again once one of them landed, as when the cap is full of them
                                raise FileSystemFullError(
                                    f"no space left on the file system under {self.layout.tier_root(tier)}"
                                    f"{inodes_note(self.layout.tier_root(tier))}"
                                    f" for {len(specs)} landing(s) beside those in flight"
                                ) from None
                            # the file system's room is taken by other processes' landings in flight
                            # (they become evictable entries within moments: wait as for the cap), or
                            # by files that are not the cache's to give back (bytes or inodes), or by
                            # this process's own landings (it is the one to land them: no wait): then
                            # the landing meets ENOSPC and the fetcher lands it elsewhere
                            # (Fetcher._elsewhere), as before. (A reservation is never refused for the
                            # file system: only the cap stops a run; the file system only moves
                            # objects to the disk tier)
                            if not room.others.hold(nbytes, files) or time.monotonic() > deadline:
                                return [self._add_or_adopt(db, tier, s) for s in specs]
                            self.landing_waits += 1
                            victims = []
                    else:
                        victims = self._cap_victims(db, tier, used + need - cap, deadline)
                if victims:
                    self._retire(tier, victims)
                else:
                    time.sleep(random.uniform(0.002, 0.02))
            except BaseException:
                _unlock(victims)  # picked, not retired: their LOCK_EX must not outlive this
                raise

    def _cap_victims(
        self, db: sqlite3.Connection, tier: str, to_free: int, deadline: float
    ) -> list[tuple[Entry, int, int]]:
        """reserve()'s victims for the cap (inside its transaction); [] to wait and look again."""
        try:
            return self._pick_victims(db, tier, to_free)
        except CacheFullError:
            # Space held by downloads and evictions in flight comes back within moments;
            # only pinned entries, open readers and a deadline make the tier truly full.
            held = db.execute("SELECT COALESCE(SUM(size), 0) FROM holds WHERE tier = ?", (tier,)).fetchone()[
                0
            ]
            if not held or time.monotonic() > deadline:
                raise
            return []

    def room(self, tier: str, db: sqlite3.Connection | None = None) -> FsRoom | None:
        """What the tier's file system has free for a new landing: statvfs, less what the landings
        in flight there (every live process's `landing` holds, this one's included) have still to
        write and the files they have still to make. statvfs alone sees only what is written:
        two processes that looked at it together each took the same free room for their own.
        A hold of a process that died (pid and start time) or an orphaned partial (pid 0) counts
        for nothing: a killed process's reservation ends with it. None if it cannot tell."""
        root = self.layout.tier_root(tier)
        room = fs_room(root)
        if room is None:
            return None
        with contextlib.nullcontext(db) if db is not None else self.index.read() as conn:
            holds = [h for h in Index.holds(conn, tier) if h.kind == "landing" and h.pid != 0]
        live: dict[tuple[int, int], bool] = {}  # (a process's holds come by the dozen: /proc once)
        for h in holds:
            if (h.pid, h.pid_start) not in live:
                live[h.pid, h.pid_start] = procs.alive(h.pid, h.pid_start)
        holds = [h for h in holds if live[h.pid, h.pid_start]]
        if not holds:
            return room
        unwritten, files = self._unwritten(tier, holds, room.block)
        mine = [h for h in holds if (h.pid, h.pid_start) == self.owner]
        theirs = [h for h in holds if (h.pid, h.pid_start) != self.owner]
        return FsRoom(
            room.free - unwritten,
            room.block,
            None if room.files is None else room.files - files,
            InFlight(sum(-(-h.size // room.block) * room.block for h in theirs), len(theirs)),
            InFlight(sum(-(-h.size // room.block) * room.block for h in mine), len(mine)),
        )

    def _unwritten(self, tier: str, holds: list[Hold], block: int) -> tuple[int, int]:
        """(bytes, files) that `holds`' landings have yet to take: each its whole need, less the
        blocks its temp files (named by its blob's hash) and its published file (linked, not yet
        indexed) already have. A big object's partial is allocated whole when it starts."""
        tmp = self.layout.tier_root(tier) / "tmp"
        have: dict[str, list[int]] = {}
        for name in self._listdir(tmp):
            with contextlib.suppress(OSError):
                st = os.lstat(tmp / name)
                got = have.setdefault(name[:32], [0, 0])
                got[0] += st.st_blocks * 512
                got[1] += 1
        nbytes = nfiles = 0
        for hold in holds:
            got = have.get(blob_hash(hold.blob), [0, 0])
            if got[0] < hold.size:
                with contextlib.suppress(OSError):
                    st = os.lstat(self.layout.blob_path(tier, hold.blob))
                    got = [got[0] + st.st_blocks * 512, got[1] + 1]
            nbytes += max(0, fs_need(hold.size, block) - got[0])
            nfiles += max(0, FILES_PER_OBJECT - got[1])
        return nbytes, nfiles

    def _fs_short(
        self, db: sqlite3.Connection, tier: str, specs: list[HoldSpec]
    ) -> tuple[int, int, FsRoom] | None:
        """What a RAM reservation lacks of its file system's room (room(), inside reserve()'s
        transaction, so two processes never both count the same free bytes): (bytes, files,
        the room), or None when it fits, or the tier is not RAM, or nothing is asked, or the
        file system cannot tell, or there is no disk tier (a full RAM file system is then
        FileSystemFullError, exit 7, as documented). The room says which landings are in flight
        there: once landed they can be evicted."""
        if tier != "ram" or not specs or self.caps.get("disk", 0) <= 0:
            return None
        room = self.room(tier, db)
        if room is None:
            return None
        need = sum(fs_need(s.size, room.block) for s in specs)
        files = 0 if room.files is None else FILES_PER_OBJECT * len(specs) + FILES_TO_PUBLISH - room.files
        if need <= room.free and files <= 0:
            return None
        return max(0, need - room.free), max(0, files), room

    def cap(self, tier: str) -> int:
        """The tier's cap as last set by any process (a lower limit given to a later rq must bind
        every process using this cache, not only the one that set it)."""
        stored = stored_size(self.index.setting(f"{tier}_limit"))
        if tier == "ram" and not self.ram:
            stored = 0
        elif tier == "ram" and stored is not None and self.ram_bound is not None:
            stored = min(stored, self.ram_bound)
        if stored is not None:
            self.caps[tier] = stored
        return self.caps[tier]

    def _cap_in(self, db: sqlite3.Connection, tier: str) -> int:
        """cap(), read inside the caller's transaction."""
        stored = stored_size(Index.setting_in(db, f"{tier}_limit"))
        if tier == "ram" and not self.ram:
            stored = 0
        elif tier == "ram" and stored is not None and self.ram_bound is not None:
            stored = min(stored, self.ram_bound)
        if stored is not None:
            self.caps[tier] = stored
        return self.caps[tier]

    def shrink(self) -> None:
        """Evicts (RAM: demotes) LRU entries until each tier is within its cap again: a limit set
        lower than what the tier holds takes effect at once, not only at the next reservation."""
        for tier in ("ram", "disk"):
            # best effort: pinned or open entries over a lowered cap wait for their turn, and a
            # preload that writes only to the other tier must not fail because of them
            with contextlib.suppress(CacheFullError):
                self.reserve(tier, [], patience=0.0)

    def make_room(
        self, tier: str, size: int, promised: tuple[int, int] = (0, 0), patience: float = 10.0
    ) -> bool:
        """The tier's file system is full below its cap (ENOSPC: others' files): evicts LRU entries
        (RAM: demotes them) as a cap does, until `size` bytes fit in what the file system has free
        (room(): less what landings in flight have yet to write) and it can make the files one
        landing needs (out of inodes: each entry evicted gives one). `promised`: bytes and files
        of that free room that landings about to start will take (the objects before this one in
        its batch). When other processes' landings in flight take what is missing, waits up to
        `patience` s for them to land (then they can be evicted), as reserve() does for the cap.
        False, evicting nothing, when they cannot: what is left is pinned, open or being written,
        or the space is not the cache's to give back."""
        deadline = time.monotonic() + patience
        while True:
            victims: list[tuple[Entry, int, int]] = []
            try:
                with self.index.write() as db:
                    room = self.room(tier, db)
                    if room is None:
                        return False
                    shortfall = fs_need(size, room.block) + promised[0] - room.free
                    files = (
                        0
                        if room.files is None
                        else FILES_PER_OBJECT + FILES_TO_PUBLISH + promised[1] - room.files
                    )
                    if shortfall <= 0 and files <= 0:
                        return True  # freed meanwhile (another process evicted, the other files went)
                    try:
                        victims = self._pick_victims(db, tier, max(0, shortfall), files=files)
                    except CacheFullError:
                        # only what other live processes' landings hold is worth waiting for: never
                        # this process's own (it lands them), nor others' files or inodes
                        if not room.others.hold(shortfall, files) or time.monotonic() > deadline:
                            return False
                        self.landing_waits += 1
                        victims = []
                if victims:
                    self._retire(tier, victims)
                    return True
                time.sleep(random.uniform(0.005, 0.03))
            except BaseException:
                _unlock(victims)  # picked, not retired: their LOCK_EX must not outlive this
                raise

    def _add_or_adopt(self, db: sqlite3.Connection, tier: str, spec: HoldSpec) -> int:
        """A new hold, or an orphaned landing hold of the same blob (a resumable partial download)."""
        row = db.execute(
            "SELECT id FROM holds WHERE blob = ? AND tier = ? AND kind = 'landing' AND pid = 0",
            (spec.blob, tier),
        ).fetchone()
        if row:
            Index.adopt_hold(db, row[0], self.owner)
            db.execute("UPDATE holds SET size = ? WHERE id = ?", (spec.size, row[0]))
            return int(row[0])
        if spec.url and is_big(spec.size):
            self._drop_stale_partials(db, spec)
        return Index.add_hold(db, tier, spec.size, "landing", spec.blob, spec.url, self.owner)

    def _drop_stale_partials(self, db: sqlite3.Connection, spec: HoldSpec) -> None:
        """Removes the kept partial downloads of an earlier version of spec's URL (inside the
        caller's transaction): a partial's name is the hash of URL and version, so once its
        source changed it can never be resumed, and it stayed in tmp/ at its full size until
        space was needed."""
        for hold in Index.stale_landings(db, str(spec.url), spec.blob):
            self._drop_dead(db, hold)

    def _pick_victims(
        self, db: sqlite3.Connection, tier: str, to_free: int, files: int = 0
    ) -> list[tuple[Entry, int, int]]:
        """Turns LRU entries into `evicting` holds (inside the caller's transaction) until `to_free`
        bytes and `files` files (make_room: a file system out of inodes) are freed. Returns
        (entry, locked fd or -1, hold id). Raises CacheFullError when not enough can be freed."""
        chosen: list[tuple[Entry, int, int]] = []  # (entry, locked fd, 0): unlocked if this raises
        try:
            return self._pick(db, tier, to_free, files, chosen)
        except BaseException:
            _unlock(chosen)
            raise

    def _pick(
        self,
        db: sqlite3.Connection,
        tier: str,
        to_free: int,
        files: int,
        chosen: list[tuple[Entry, int, int]],
    ) -> list[tuple[Entry, int, int]]:
        freed = 0
        taken = 0  # entries and holds given back: a file each (most of them)
        # Space nobody will use is the cheapest to give back: orphaned partial downloads, holds of
        # processes that died (kill -9 in the middle of a read-through), and superseded blobs no
        # reader holds open any more. Without this a tier could stay "full" of nothing until the
        # next preload or verify ran collect().
        for hold in Index.holds(db, tier):
            if freed >= to_free and taken >= files:
                break
            if hold.kind == "landing" and hold.pid == 0:
                # (its partial, and a file it may have published unindexed: _drop_dead)
                self._drop_dead(db, hold)
                freed += hold.size
            elif hold.kind == "garbage":
                freed += self._take_garbage(db, hold)
            elif hold.pid != 0 and not procs.alive(hold.pid, hold.pid_start):
                self._drop_dead(db, hold)
                freed += hold.size
            else:
                continue  # (a live process's)
            taken += 1
        # read lazily, oldest first: a cache of millions of entries must not load them all to
        # free room for one object (the index on (tier, pinned, last_access) serves this order)
        candidates = self.index.lru(db, tier)
        try:
            for entry in candidates:
                if freed >= to_free and taken >= files:
                    break
                if entry.size == 0 and taken >= files:
                    continue  # frees no bytes (only a file, and no files are wanted): demoting it was wasted work
                fd = lock_exclusive(self.layout.blob_path(tier, entry.blob))
                if fd is None:
                    continue  # a reader has it open
                chosen.append((entry, fd, 0))
                freed += entry.size
                taken += 1
        finally:
            candidates.close()  # the cursor ends before this transaction deletes rows
        if freed < to_free or taken < files:
            _unlock(chosen)
            pinned = db.execute(
                "SELECT COALESCE(SUM(size),0) FROM entries WHERE tier = ? AND pinned = 1", (tier,)
            ).fetchone()[0]
            raise CacheFullError(
                f"{tier} tier cap {format_size(self.caps[tier])} reached: {format_size(to_free - freed)} more "
                f"needed but the rest is pinned ({format_size(pinned)}), open by readers, or being written"
            )
        out: list[tuple[Entry, int, int]] = []
        for entry, fd, _ in chosen:
            Index.delete(db, entry.url)
            hid = Index.add_hold(db, tier, entry.size, "evicting", entry.blob, entry.url, self.owner)
            out.append((entry, fd, hid))
        return out

    def _retire(self, tier: str, victims: list[tuple[Entry, int, int]]) -> None:
        """Demotes (RAM → disk) or drops each victim, then unlinks it and releases its hold. Each
        is taken off `victims` as it is retired: the caller unlocks those left if this raises."""
        while victims:
            entry, fd, hid = victims.pop(0)
            try:
                if tier == "ram" and fd >= 0 and self.caps.get("disk", 0) > 0:
                    with contextlib.suppress(CacheFullError, OSError):
                        self._demote(entry, fd)
            finally:
                if fd >= 0:
                    # only the file we locked: one missing then may be another landing's by now
                    unlink_quiet(self.layout.blob_path(tier, entry.blob))
                    os.close(fd)
                with self.index.write() as db:
                    Index.drop_hold(db, hid)

    def _demote(self, entry: Entry, src_fd: int) -> None:
        [hid] = self.reserve("disk", [HoldSpec(entry.size, entry.blob, entry.url)])
        tmp = self.layout.tmp_path("disk", entry.blob, ".demote")
        final = self.layout.blob_path("disk", entry.blob)
        placed = False  # our copy is under the final name (not a twin another process landed)
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                offset = 0
                while offset < entry.size:
                    # sendfile, not copy_file_range: RAM (tmpfs) to disk crosses file systems (EXDEV)
                    n = os.sendfile(out, src_fd, offset, entry.size - offset)
                    if n == 0:
                        break
                    offset += n
                os.fsync(out)
            finally:
                os.close(out)
            make_private(final.parent)
            twin = -1
            while True:
                try:
                    os.link(tmp, final)  # never clobber a twin (same URL and version) a reader may hold
                    placed = True
                    break
                except FileExistsError:
                    # kept locked until the row names it, so no remover unlinks it from under us
                    twin = lock_twin(final)
                    if twin >= 0:
                        break
            unlink_quiet(tmp)
            fsync_dir(final.parent)
            try:
                with self.index.write() as db:
                    current = self.index.get(entry.url, db)
                    if current is None:
                        Index.put(db, replace(entry, tier="disk"))
                    elif (current.tier, current.blob) != ("disk", entry.blob) and twin < 0:
                        # the URL was cached again meanwhile (another tier or version): our copy
                        # would be an uncovered file, so it goes before its hold does
                        unlink_quiet(final)
                    Index.drop_hold(db, hid)
                placed = False  # indexed (or removed): nothing is left to take back
            finally:
                if twin >= 0:
                    os.close(twin)
        except BaseException:
            unlink_quiet(tmp)
            if placed:
                # our copy under its final name, not indexed (an error or an interrupt between the
                # link and the commit): it goes before its hold does. (The hold was dropped and the
                # file stayed, over the disk cap and counted by nothing, until a `rq cache clear`)
                self.take_back("disk", entry.blob, hid)
            else:
                with self.index.write() as db:
                    Index.drop_hold(db, hid)
            raise

    def release(self, hold_ids: list[int]) -> None:
        with self.index.write() as db:
            for hid in hold_ids:
                Index.drop_hold(db, hid)

    def orphan(self, hold_ids: list[int]) -> None:
        """Keeps holds (and their partial files) for a later run to adopt and resume."""
        with self.index.write() as db:
            for hid in hold_ids:
                db.execute("UPDATE holds SET pid = 0, pid_start = 0 WHERE id = ?", (hid,))

    # --- landing -------------------------------------------------------------------------------

    def land(self, items: list[tuple[int, Entry]]) -> None:
        """Makes renamed blobs visible: entry rows in, holds out, superseded versions to garbage."""
        garbage: list[Hold] = []
        with self.index.write() as db:
            for hid, entry in items:
                old = self.index.get(entry.url, db)
                if old is not None and (old.blob != entry.blob or old.tier != entry.tier):
                    gid = Index.add_hold(db, old.tier, old.size, "garbage", old.blob, old.url, self.owner)
                    garbage.append(Hold(gid, old.tier, old.size, "garbage", old.blob, old.url, 0, 0, 0))
                if old is not None:
                    entry.pinned = entry.pinned or old.pinned
                if entry.url.startswith("s3://") and entry.endpoint is None:
                    entry.endpoint = self._endpoint_of(entry, old)
                Index.put(db, entry)
                Index.drop_hold(db, hid)
        # after the commit, so an error here must not read as "not landed" to the caller: a
        # superseded blob left behind keeps its garbage hold, and a later collect() takes it
        for hold in garbage:
            with contextlib.suppress(CacheError, OSError):
                self._collect_garbage(hold)

    def _endpoint_of(self, entry: Entry, old: Entry | None) -> str | None:
        """The S3 endpoint a landing of an s3:// entry records: the one this process fetches from,
        or None (unknown: the next read revalidates it) where it may be a copy of a cached entry
        of the same version that another endpoint's check vouched for (a promotion to RAM copies
        the cached file, whichever endpoint it came from)."""
        mine = self.index.endpoint()
        if old is not None and old.version == entry.version and old.endpoint != mine:
            return None
        return mine

    def take_back(self, tier: str, blob: str, hold: int = 0) -> None:
        """Removes a blob this process placed under its final name but did not index (its index
        write failed, or was interrupted), then drops `hold`, the landing hold that counts it (0:
        none): the file goes first, so its bytes are never on disk uncounted. An entry naming it
        (another process found it as its identical twin and indexed it, or our own commit went
        in after all) keeps it; only the hold goes. A file another process has open (a reader of
        an older entry of the same name, a twin being adopted) cannot go now: the hold becomes a
        `garbage` hold, which counts it until the next eviction or collect() finds it closed and
        removes it. (Dropped with the file left, it was over the cap, counted by nothing, until a
        `rq cache clear`.) An index that cannot be written raises, keeping the hold: ours, it
        counts the file until this process ends, and then collect() removes both."""
        path = self.layout.blob_path(tier, blob)
        fd = lock_exclusive(path)
        try:
            with self.index.write() as db:
                named = Index.names_blob(db, tier, blob)
                if fd is None and not named:
                    if hold:
                        db.execute(
                            "UPDATE holds SET kind = 'garbage' WHERE id = ? AND blob = ?", (hold, blob)
                        )
                    return
                if fd is not None and fd >= 0 and not named:
                    unlink_quiet(path)
                if hold:  # (that very hold: an id dropped already may be another's by now)
                    db.execute("DELETE FROM holds WHERE id = ? AND blob = ?", (hold, blob))
        finally:
            if fd is not None and fd >= 0:
                os.close(fd)

    def remove(self, entry: Entry, same_landing: bool = False) -> bool:
        """Evicts one entry now (rq cache evict, corrupt entries). False if a reader has it open.
        With `same_landing`, only the very landing `entry` was read from: file names are fixed per
        URL and version, so an entry evicted and landed again since names the same file, sound
        now, and must stay (its `created` stamp tells the landings apart)."""
        path = self.layout.blob_path(entry.tier, entry.blob)
        fd = lock_exclusive(path)
        if fd is None:
            return False

        def gone(current: Entry | None) -> bool:
            return (
                current is None
                or current.blob != entry.blob
                or current.tier != entry.tier
                or (same_landing and current.created != entry.created)
            )

        try:
            if self.index.full:
                raise CacheFullError(self.index.why_readonly)
            with self.index.write() as db:
                current = self.index.get(entry.url, db)
                if gone(current):
                    if fd >= 0:
                        os.close(fd)
                    return True  # already replaced or gone
                Index.delete(db, entry.url)
                hid = Index.add_hold(
                    db, entry.tier, entry.size, "evicting", entry.blob, entry.url, self.owner
                )
        except CacheFullError:
            # The index's file system is full: SQLite needs a little space to delete a row (or to
            # open the index for writing at all). A file on that file system goes first (no reader
            # has it: LOCK_EX held), which frees space; the row after. A crash between leaves a
            # row naming a missing file: open takes it as gone (fetches it again), `rq cache
            # verify` reports it and --repair drops it. A file elsewhere (the RAM tier) frees
            # nothing there: it stays until its row is gone, and if the row cannot go both stay
            # (CacheFullError), a whole cached entry (it was unlinked, and the row left naming a
            # missing file, which `rq cache verify` then called corrupt).
            # The row is tried first, the file kept: a delete that fits needs no unlink before it.
            frees = fd >= 0 and _same_fs(fd, self.index.path)
            try:
                try:
                    deleted = self._delete_row(entry.url, gone)
                except CacheFullError:
                    if not frees:
                        raise
                    if not gone(self.index.get(entry.url)):
                        unlink_quiet(path)
                    self._delete_row(entry.url, gone)  # still full: CacheFullError
                    return True
                if deleted and fd >= 0:
                    unlink_quiet(path)
            finally:
                if fd >= 0:
                    os.close(fd)
            return True
        if fd >= 0:  # (a file missing when we looked: one there now is another landing's)
            try:
                unlink_quiet(path)
            except OSError:
                # not removable (a read-only RAM root, a directory of another user's): the entry
                # goes back as it was, its file still there, and the error is the caller's. (The
                # row stayed deleted and the file and its `evicting` hold stayed behind: every later
                # `rq cache verify`/`du` failed on that hold, "Read-only file system", exit 1.)
                with self.index.write() as db:
                    if self.index.get(entry.url, db) is None:
                        Index.put(db, entry)
                    Index.drop_hold(db, hid)
                raise
            finally:
                os.close(fd)
        with self.index.write() as db:
            Index.drop_hold(db, hid)
        return True

    def retire(self, entry: Entry) -> bool:
        """Drops an entry known bad or stale (corrupt, gone from its origin, superseded there):
        only the very landing `entry` was read from (see remove's `same_landing`). Unlike an
        eviction it does not wait for readers: one that has the file open keeps reading what it
        opened, but the entry leaves the index now, so no later read is served it. Its file is
        renamed aside (`<blob>.retired-<hex>`, same directory) under a `garbage` hold, counted until
        the next eviction or collect() finds it closed and removes it: aside, because a corrupt
        entry is fetched again under the very same name (same URL and version), and a garbage hold
        on that name would then find the new file there, named by its entry, and let the old one
        go uncounted while its reader still has it. False only where the index cannot be written
        (the entry stays; the next read's check finds it bad again)."""
        if self.remove(entry, same_landing=True):
            return True
        if self.index.readonly or self.index.full:
            return False
        path = self.layout.blob_path(entry.tier, entry.blob)
        aside = f"{entry.blob}.retired-{os.urandom(4).hex()}"
        # The aside name is held (0 bytes) before the file takes it: a process killed between the
        # rename and the commit that drops the row then leaves the file under a held name, which
        # the next collect() removes (the row, back, names a missing file: a miss). Before, that
        # file was counted by nothing and stayed until a repair swept objects/.
        with self.index.write() as db:
            hid = Index.add_hold(db, entry.tier, 0, "garbage", aside, entry.url, self.owner)
        moved = False
        try:
            with self.index.write() as db:
                current = self.index.get(entry.url, db)
                if current is None or (current.blob, current.tier, current.created) != (
                    entry.blob,
                    entry.tier,
                    entry.created,
                ):
                    Index.drop_hold(db, hid)
                    return True  # replaced or gone meanwhile: not ours to drop
                Index.delete(db, entry.url)
                try:
                    os.rename(path, self.layout.blob_path(entry.tier, aside))
                    moved = True
                except FileNotFoundError:
                    Index.drop_hold(db, hid)
                    return True  # gone already: nothing left to count
                Index.resize_hold(db, hid, entry.size)
        except BaseException:
            if moved:  # the row is back (rolled back): so is its file's name
                with contextlib.suppress(OSError):
                    os.rename(self.layout.blob_path(entry.tier, aside), path)
            with contextlib.suppress(Exception), self.index.write() as db:
                Index.drop_hold(db, hid)
            raise
        return True

    def _delete_row(self, url: str, gone: Callable[[Entry | None], bool]) -> bool:
        """Opens an index read-only for want of space for writing again and deletes `url`'s row
        unless `gone`; whether it did. CacheFullError when there is still no space."""
        self.index.reopen_writable()
        with self.index.write() as db:
            if gone(self.index.get(url, db)):
                return False
            Index.delete(db, url)
            return True

    def clear_racy(self, entry: Entry, version: str) -> bool:
        """Records `version` (the racy mark dropped: cache.landing.racy_at) on this very landing
        of the entry; False if it was replaced, moved or removed meanwhile, or the index is
        read-only (its racy entries are then hashed against their origin on every check)."""
        if self.index.readonly:
            return False
        with self.index.write() as db:
            cur = db.execute(
                "UPDATE entries SET version = ? WHERE url = ? AND version = ? AND tier = ? AND blob = ?"
                " AND created = ?",
                (version, entry.url, entry.version, entry.tier, entry.blob, entry.created),
            )
            return bool(cur.rowcount)

    # --- recovery ------------------------------------------------------------------------------

    def collect(self, sweep_objects: bool = False) -> dict[str, int]:
        """Cleans up after dead processes: their holds, tmp files, and (optionally) uncovered blobs."""
        stats = {"stale_holds": 0, "tmp_removed": 0, "orphans_removed": 0}
        # list files FIRST, then read holds: a file is created only after its hold commits, so any
        # file listed here whose hold is missing from the later read is truly uncovered.
        tmp_files = {t: self._listdir(self.layout.tier_root(t) / "tmp") for t in ("ram", "disk")}
        obj_files = (
            {t: self._walk_objects(t) for t in ("ram", "disk")} if sweep_objects else {"ram": [], "disk": []}
        )
        later: list[Hold] = []
        with self.index.write() as db:
            for hold in Index.holds(db):
                if hold.kind == "garbage":
                    later.append(hold)
                    continue
                if hold.pid == 0 or procs.alive(hold.pid, hold.pid_start):
                    continue
                stats["stale_holds"] += 1
                if hold.kind == "landing" and self._journal(hold).exists():
                    Index.adopt_hold(db, hold.id, (0, 0))  # keep for resume
                    continue
                self._drop_dead(db, hold)
            held = {(h.tier, h.blob) for h in Index.holds(db)}
            held_tmp = {(h.tier, blob_hash(h.blob)) for h in Index.holds(db)}
            for tier, names in tmp_files.items():
                for name in names:
                    if (tier, name[:32]) not in held_tmp:
                        unlink_quiet(self.layout.tier_root(tier) / "tmp" / name)
                        stats["tmp_removed"] += 1
            if sweep_objects:
                blobs = {(t, b) for t, b in db.execute("SELECT tier, blob FROM entries")}
                for tier, rels in obj_files.items():
                    for rel in rels:
                        if (tier, rel) not in blobs and (tier, rel) not in held:
                            # the name as listed (xx/name), not blob_path's: that maps a name not
                            # shaped like a blob (a stray file) elsewhere, and the stray stayed (dr3)
                            unlink_quiet(self.layout.tier_root(tier) / "objects" / rel)
                            stats["orphans_removed"] += 1
        for hold in later:
            self._collect_garbage(hold)
        return stats

    def _blob_busy(self, db: sqlite3.Connection, hold: Hold) -> bool:
        """Whether another live hold covers the same blob: a process fetching the same URL and
        version right now, whose tmp files and just-published (not yet indexed) file share the
        dead hold's names and must not be swept from under it."""
        return any(
            other.id != hold.id
            and other.blob == hold.blob
            and other.kind == "landing"
            and (other.pid == 0 or procs.alive(other.pid, other.pid_start))
            for other in Index.holds(db, hold.tier)
        )

    def _drop_dead(self, db: sqlite3.Connection, hold: Hold) -> None:
        """Frees what a dead process's hold kept, or an orphaned landing (pid 0: a partial kept for
        resume) given up (inside the caller's transaction): its tmp files, and the file it may have
        published under its final name and not indexed (killed, or interrupted, between the two:
        that file stayed, counted by nothing, once the orphaned hold was dropped). While a live
        process lands the same blob, only the dead one's own tmp files go (their names carry its
        pid): the shared names are the live one's, and its hold covers them."""
        if not self._blob_busy(db, hold):
            if hold.kind == "landing":
                self._remove_partial(hold)
            if not Index.names_blob(db, hold.tier, hold.blob):
                unlink_quiet(self.layout.blob_path(hold.tier, hold.blob))
        elif hold.kind == "landing":
            self._remove_partial(hold, f".{hold.pid}.")
        Index.drop_hold(db, hold.id)

    def _take_garbage(self, db: sqlite3.Connection, hold: Hold) -> int:
        """Removes a superseded blob no reader holds open (inside the caller's transaction);
        returns the bytes given back (0 while a reader still has it)."""
        if self._blob_busy(db, hold):
            # a live process is landing this very blob: the file may be the twin it will adopt,
            # and until then this hold is what counts its bytes
            return 0
        path = self.layout.blob_path(hold.tier, hold.blob)
        fd = lock_exclusive(path)
        if fd is None:
            return 0
        if fd == -1 and hold.size == 0 and procs.alive(hold.pid, hold.pid_start):
            return 0  # a live retire() holds the name its file is about to take
        try:
            if not Index.names_blob(db, hold.tier, hold.blob):
                unlink_quiet(path)
            Index.drop_hold(db, hold.id)
        finally:
            if fd >= 0:
                os.close(fd)
        return hold.size

    def _collect_garbage(self, hold: Hold) -> None:
        with self.index.write() as db:
            self._take_garbage(db, hold)  # still open by a reader: a later collect() takes it

    def _journal(self, hold: Hold) -> Path:
        return self.layout.tmp_path(hold.tier, hold.blob, ".journal")

    def _remove_partial(self, hold: Hold, infix: str = "") -> None:
        """Every tmp file of this blob (whole-object downloads add the writer's pid to the name:
        `infix` ".<pid>." keeps to one writer's)."""
        prefix = blob_hash(hold.blob) + infix
        tmp = self.layout.tier_root(hold.tier) / "tmp"
        for name in self._listdir(tmp):
            if name.startswith(prefix):
                unlink_quiet(tmp / name)

    @classmethod
    def sweep_tree(cls, root: Path) -> None:
        """Removes every file under a tier root's tmp/ and objects/xx/ (never through a symlink)."""
        for name in cls._listdir(root / "tmp"):
            unlink_quiet(root / "tmp" / name)
        for rel in cls._objects_under(root):
            unlink_quiet(root / "objects" / rel)

    @staticmethod
    def _listdir(path: Path) -> list[str]:
        """Names in one of our directories; a symlink in its place is not followed, because what
        it points to is not ours to sweep."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return []
            raise
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def _walk_objects(self, tier: str) -> list[str]:
        return self._objects_under(self.layout.tier_root(tier))

    @classmethod
    def _objects_under(cls, root: Path) -> list[str]:
        """`xx/<blob>` of every file under a tier root's objects/."""
        out: list[str] = []
        for sub in cls._listdir(root / "objects"):
            out.extend(f"{sub}/{name}" for name in cls._listdir(root / "objects" / sub))
        return out


def is_no_space(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _same_fs(fd: int, index_path: Path) -> bool:
    """Whether the open file `fd` is on the file system of the index at `index_path`."""
    try:
        return os.fstat(fd).st_dev == os.stat(index_path.parent).st_dev
    except OSError:
        return True  # (as before: the file goes first)
