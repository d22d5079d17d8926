"""The receiver's disk: partial files, journals, and the final atomic rename — all relative to DEST's fd.

Layout inside the destination (documented in docs/transfer.md):

    DEST/.rq-partial/<tid>.manifest.json   the accepted manifest (lets other channels/processes join)
    DEST/.rq-partial/<key>.part            the file being received, written with pwrite at chunk offsets
    DEST/.rq-partial/<key>.journal         verified+durable chunks (journal.py)

Names are opened one component at a time with O_NOFOLLOW relative to a directory descriptor, so a
symlink planted anywhere under DEST cannot redirect a write outside it. Files reach their final
names by link() (refuses to replace) or, with overwrite, rename(); then the directory is fsynced.

Many small files: a batch of chunks that spans several files is made durable with one syncfs(2)
for all their data, then their journal records, then one more syncfs, instead of an fdatasync and
an fsync per file; placing many files seals them all, syncs once, links them all, syncs once
(docs/transfer.md, "Many small files"). The order (data, then the record that claims it) is the
same; only the number of flushes changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import xxhash

from transfer.aligned import ALIGN, O_DIRECT, is_aligned
from transfer.codec import root_digest
from transfer.errors import (
    FINISHED_MEANWHILE,
    BusyError,
    ChunkSizeError,
    DirectoryInTheWayError,
    ExistsError,
    FinishedMeanwhileError,
    NoSpaceError,
    TransferError,
    UnknownTransferError,
    UnsafeNameError,
    VerifyError,
)
from transfer.journal import Journal, KnownDigests, recorded
from transfer.manifest import MAX_CHUNK, MIN_CHUNK, FileEntry, Limits, Manifest, parse_manifest
from transfer.names import STATE_DIR_NAME, descend, display_name, validate_name
from transfer.private import dir_problem
from transfer.reserve import RESERVE_MIN, Reservation, in_memory, reserve, sealing

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# a directory to chmod: no read permission needed on it, only search on its parents
_PATH_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# Below this a second open() costs more than the page-cache copy it saves.
_DIRECT_MIN = 256 * 1024


# Names are checked once when the manifest is parsed; the store needs their components at every
# step (plan, place, stat), and checking 5,000 names again cost ~0.1 s per pass.
_components = functools.lru_cache(maxsize=1 << 16)(validate_name)

# A batch touching this many files or more is made durable with syncfs (one flush of the file
# system for all of them) instead of one fdatasync/fsync per file. Measured here (docs/transfer.md):
# 5,000 files of 10 KB, per-file fdatasync 2.0-2.4 s, syncfs per batch 0.7-1.2 s. Big files (a
# batch inside one file) keep fdatasync: it flushes only that file, not other writers' dirty pages.
SYNCFS_MIN_FILES = 2

_syncfs_fn: Any = None


def _syncfs(fd: int) -> bool:
    """syncfs(2) on the file system holding `fd`: every dirty page and inode on it, in one call
    whose writes the kernel merges (Linux >= 5.8 reports write-back errors since `fd` was opened).
    False where libc has no syncfs; the caller then syncs file by file."""
    global _syncfs_fn
    if _syncfs_fn is None:
        _syncfs_fn = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", False)
        if _syncfs_fn:
            _syncfs_fn.argtypes = [ctypes.c_int]
    if not _syncfs_fn:
        return False
    if _syncfs_fn(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")
    return True


# A manifest of our own state was checked when it arrived: read back, it is taken whatever its size.
_NO_LIMITS = Limits(max_files=10**7, max_chunks=10**9, max_manifest_bytes=1 << 40)

# What became of a file rq placed in the destination earlier (Store._placed_state).
INTACT, GONE, CHANGED, UNKNOWN = "intact", "gone", "changed", "unknown"

# A placed file of at most this many chunks keeps its chunk digests in its placed record, and its
# journal is removed once it is in place: one inode per received file fewer (on tmpfs a 4 KiB page
# each; 50,000 small files: ~195 MiB). 64 digests (hex) keep the record within one 4 KiB block.
PLACED_DIGESTS_MAX = 64

# How long the partial state of a transfer nobody touched stays for its sender to come back and
# resume it: rq recv removes it as it starts once it is older (docs/transfer.md, "Receiver layout").
# None (or 0): never. A week outlives a weekend, a long outage or a job queued behind others;
# `rq recv --keep-partial` sets it.
KEEP_PARTIAL = 7 * 86400.0


@dataclass(frozen=True)
class Expired:
    """What Store.expire removed: the transfers whose partial state was older than `older_than`
    seconds, how many state files that was, and the space they held (allocated blocks, which
    includes what a reservation took for chunks that never came)."""

    transfers: tuple[str, ...] = ()
    files: int = 0
    bytes: int = 0
    older_than: float | None = None


def _placed_name(name: str) -> str:
    """The state file recording the placement of final name `name` (one per name)."""
    return f"{xxhash.xxh3_128_hexdigest(name.encode('utf-8', 'surrogatepass'))}.placed"


def _record_digests(rec: dict[str, Any], chunk_size: int, chunks: int) -> dict[int, bytes] | None:
    """The chunk digests a placed record holds (PLACED_DIGESTS_MAX), None if it holds none (a
    bigger file, an older rq's record) or they are not this geometry's."""
    found = rec.get("digests")
    if rec.get("chunk_size") != chunk_size or not isinstance(found, list) or len(found) != chunks:
        return None
    try:
        out = {k: bytes.fromhex(d) for k, d in enumerate(found)}
    except (TypeError, ValueError):
        return None
    return out if all(len(d) == 16 for d in out.values()) else None


def unlink_quiet_at(name: str, dir_fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _read_fd(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0) if size else b""


def out_of_inodes(fd: int) -> bool:
    """Whether the file system holding `fd` has no inode left to give (statvfs f_favail 0): a
    full file system that freeing or capping bytes does nothing for (a tmpfs's nr_inodes, an ext4
    made for big files). False where it keeps no count (f_files 0: btrfs) or cannot be asked."""
    try:
        vfs = os.fstatvfs(fd)
    except OSError:
        return False
    return vfs.f_files > 0 and vfs.f_favail == 0


def kept_text(chunks: int, nbytes: int, recorded: int | None = None) -> str:
    """What a transfer stopped by a full disk keeps, for its error line: the chunks verified (and
    durable) so far, which a re-run does not send again, or that there are none. `recorded`: how
    many of them are journaled already, when the others still wait for their records (the
    receiver's last flush, which the full disk may refuse: a journal whose next record needs a
    new page kept 169 of 182 said)."""
    if not chunks:
        return "; no chunk of this transfer had been verified, so none is kept: a re-run sends it all"
    if recorded is not None and recorded < chunks:
        return (
            f"; up to {chunks} chunk(s) ({nbytes} bytes) verified so far are kept ({recorded} recorded, "
            "the others if the full disk still takes their records): a re-run sends only the rest"
        )
    return f"; the {chunks} chunk(s) ({nbytes} bytes) verified so far are kept: a re-run sends only the rest"


def no_space(fd: int, detail: str, kept: str = "", inodes: bool | None = None) -> NoSpaceError:
    """ENOSPC on the file system holding `fd`, said as what ran out: its inodes (every file rq
    creates takes one: while a file is received its .part and its journal under .rq-partial,
    at commit its placed record too; once placed, the file and its record, and its journal too
    for files of more than PLACED_DIGESTS_MAX chunks) or its space. Freeing bytes, or raising
    --max-bytes, does nothing for the first. `kept`: what the transfer keeps (kept_text), ""
    where no transfer is concerned. `inodes`: out_of_inodes as the caller found it before it
    cleaned up (a cleanup frees inodes: asked afterwards it would say "disk is full")."""
    if inodes is None:
        inodes = out_of_inodes(fd)
    if inodes:
        return NoSpaceError(
            f"receiver file system is out of inodes{detail} (not bytes: rq needs about 3 per file "
            "while receiving it, 2 once it is placed): delete files there (see `df -i`), "
            f"or remount a tmpfs with a larger nr_inodes{kept}"
        )
    return NoSpaceError(f"receiver disk is full{detail}{kept}")


def _room(fd: int, rest: int) -> str:
    """How much a transfer stopped by a full disk still needs and how much the file system holding
    `fd` has free (what to free before the re-run), as " (N bytes still to write, M free)"."""
    try:
        vfs = os.fstatvfs(fd)
    except OSError:
        return ""
    return f" ({rest} bytes of this transfer still to write, {vfs.f_bavail * vfs.f_frsize} free)"


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def _disk_errors(fd: int, kept: Callable[[], str] | None = None) -> Iterator[None]:
    """ENOSPC/EDQUOT inside as NoSpaceError; `kept()` says what the transfer keeps (kept_text)."""
    try:
        yield
    except OSError as exc:
        if is_no_space(exc):
            inodes = out_of_inodes(fd)
            said = ""
            if kept is not None:
                with contextlib.suppress(OSError):
                    said = kept()
            raise no_space(fd, "", said, inodes) from None
        raise


# A transfer whose commit ran out of space or inodes: every chunk is verified, the commit marker
# says so, and the sender's re-run finishes placing its files (Store.completed, _redo_commit).
_ALL_KEPT = "; every chunk of this transfer is verified and kept: a re-run places its files"


@dataclass
class FileState:
    entry: FileEntry
    chunks: int
    journal: Journal | KnownDigests
    have: dict[int, bytes]
    # written, not yet durable and journaled: chunk -> Store.write_back_errors when it was written
    dirty: dict[int, int] = field(default_factory=dict)
    placed: bool = False  # already in place from an earlier transfer: nothing to write or move


class _Gate:
    """Lets the chunk writes and flushes of every channel of a plan run at once (shared), and its
    commit alone (exclusive; waiting writers wait, a commit waiting for the writers in flight goes
    first). Two senders of one source at once share one plan here (Receiver._acquire): before,
    one's commit moved the .part files away while the other still wrote and flushed them ("cannot
    write …: No such file or directory"), wrote into a placed file (its mtime no longer the one
    recorded), or re-planned it halfway (journals dropped: "chunks still missing at commit")."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._sealing = False

    @contextlib.contextmanager
    def shared(self, wait: bool = True) -> Iterator[bool]:
        """Yields True while held; False at once (holding nothing) where a commit is under way
        or waiting and not `wait`."""
        with self._cond:
            if self._sealing and not wait:
                free = False
            else:
                while self._sealing:
                    self._cond.wait()
                self._users += 1
                free = True
        if not free:
            yield False
            return
        try:
            yield True
        finally:
            with self._cond:
                self._users -= 1
                if not self._users:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._sealing:  # one commit at a time
                self._cond.wait()
            self._sealing = True
            while self._users:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._sealing = False
                self._cond.notify_all()

    def wait_idle(self) -> None:
        """Returns once no commit is under way or waiting."""
        with self._cond:
            while self._sealing:
                self._cond.wait()


@dataclass
class Plan:
    """One accepted transfer, open in this process."""

    manifest: Manifest
    files: list[FileState]
    store: Store
    restarted: list[str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False
    live_fd: int = -1  # holds a shared flock on <tid>.live while open: "this transfer is running"
    reservation: Reservation | None = None  # tmpfs files still being reserved (Store._reserve)
    # the manifest state file (dev, ino, ctime_ns) as it was when the file states were read: every
    # plan rewrites it, so another stamp means the transfer was planned again since (Store.stamp)
    planned_as: tuple[int, int, int] | None = None
    gate: _Gate = field(default_factory=_Gate)  # writes shared, the commit exclusive
    committed: bool = False  # finalize placed its files (then closed it)

    def has(self, f: int, k: int) -> bool:
        return k in self.files[f].have

    def have_bytes(self) -> int:
        cs = self.manifest.chunk_size
        return sum(fs.entry.chunk_len(k, cs) for fs in self.files for k in fs.have)

    def kept(self, failed: Sequence[tuple[int, int, bytes]] = ()) -> str:
        """What this transfer keeps as it stops on a full disk (kept_text), for its files not
        placed before: the chunks their journals hold (every process's) and the verified chunks
        written here and not yet journaled, which the receiver makes durable as it stops
        (Receiver's last flush: a write that filled the disk stopped a batch that had not been
        flushed yet, and a 10 MB tmpfs kept 2 chunks of 4 MiB after "none" was said), less
        `failed`, the batch whose flush or journal the disk refused."""
        cs = self.manifest.chunk_size
        refused = {(f, k) for f, k, _ in failed}
        with self.lock:
            todo = [(f, fs, set(fs.dirty)) for f, fs in enumerate(self.files) if not fs.placed]
        chunks = nbytes = recorded = 0
        for f, fs, dirty in todo:
            journaled = fs.journal.reload().keys()
            ks = {k for k in journaled | dirty if (f, k) not in refused}
            chunks += len(ks)
            recorded += len(ks & journaled)
            nbytes += sum(fs.entry.chunk_len(k, cs) for k in ks)
        return _room(self.store.state_fd, self.manifest.total_bytes - nbytes) + kept_text(
            chunks, nbytes, recorded
        )

    def _check_open(self) -> None:
        if self.committed:  # by another sender of the same transfer, while this one still sent
            raise FinishedMeanwhileError(FINISHED_MEANWHILE)
        if self.closed:  # a straggling channel of a transfer that already finished: its fds are gone
            raise UnknownTransferError("transfer already finished")

    def write(self, f: int, k: int, data: bytes | bytearray | memoryview) -> None:
        """Whole blocks of an aligned chunk go around the page cache (O_DIRECT), the rest through it.

        Measured here (docs/transfer.md): buffered writes of 4 GiB onto disk spent 7-11 s of system
        time faulting in page-cache pages the VM had never touched; O_DIRECT from the channel's
        reused buffer writes at the disk's 1.6-2 GB/s and leaves the page cache to the trainer."""
        with self.gate.shared():
            self._check_open()  # after the wait: a commit may have placed the files meanwhile
            key = self.files[f].entry.key
            view = memoryview(data).cast("B")
            off = k * self.manifest.chunk_size
            with _disk_errors(self.store.state_fd, self.kept):
                done = self.store.write_direct(key, view, off)
                if done < len(view):
                    with self.store.part(key) as fd:
                        view, off = view[done:], off + done
                        while view:
                            n = os.pwrite(fd, view, off)
                            view, off = view[n:], off + n
            self.files[f].dirty[k] = self.store.write_back_errors

    def make_durable(self, done: list[tuple[int, int, bytes]]) -> None:
        """Makes the files these chunks went to durable, then journals them: data first, record
        second. One file (a big file's batch): fdatasync it, append, fsync the journal. Several
        (small files): one syncfs for all their data, append every journal, one more syncfs."""
        with self.gate.shared():
            self._check_open()
            self._make_durable(done)

    def _make_durable(self, done: list[tuple[int, int, bytes]]) -> None:
        by_file: dict[int, list[tuple[int, bytes]]] = {}
        for f, k, dig in done:
            by_file.setdefault(f, []).append((k, dig))
        with _disk_errors(self.store.state_fd, lambda: self.kept(failed=done)):
            if len(by_file) >= SYNCFS_MIN_FILES and self.store.syncfs():
                self._check_write_back(by_file)
                for f, recs in by_file.items():
                    self.files[f].journal.append(recs, sync=False)
                self.store.syncfs()  # the records are durable only now: count none before
            else:
                for f in by_file:
                    with self.store.part(self.files[f].entry.key) as fd:
                        self.store.flush_data(fd)
                self._check_write_back(by_file)
                for f, recs in by_file.items():
                    self.files[f].journal.append(recs)
            for f, recs in by_file.items():
                fs = self.files[f]
                with self.lock:
                    fs.have.update(recs)
                    for k, _ in recs:
                        fs.dirty.pop(k, None)

    def refresh(self, newer: Plan) -> None:
        """Takes each file's state from `newer`, a plan of the same transfer just made (a sender
        reconnecting, or a new one while a killed one's channels still hold this plan): what the
        disk says now, not what this plan saw when it was opened. A file placed by an earlier
        transfer and deleted since is no longer "placed, every chunk present" (its journal stood
        in by its placed record's digests): the re-plan gave it a new, empty .part and a fresh
        journal, and the commit placed that .part, zeros, as the verified file. Chunks other
        channels make durable meanwhile are in the journal, which `have` is read from."""
        assert newer.manifest.transfer_id == self.manifest.transfer_id
        with self.lock:
            for fs, now in zip(self.files, newer.files, strict=True):
                fs.journal = now.journal
                fs.placed = now.placed
                fs.have = fs.journal.reload()
            self.planned_as = newer.planned_as

    def _check_write_back(self, by_file: dict[int, list[tuple[int, bytes]]]) -> None:
        """Refuses to journal chunks written before a write-back error that another channel's
        flush was told of. Linux reports such an error once per open file description: a syncfs
        or fdatasync after it returns 0 for the other channels, whose pages may have been lost
        too. Those chunks then stay missing and are sent again, not recorded as durable."""
        now = self.store.write_back_errors
        for f, recs in by_file.items():
            dirty = self.files[f].dirty
            if any(dirty.get(k, now) != now for k, _ in recs):
                raise OSError(
                    errno.EIO, "a write-back error on the destination's disk may have lost these chunks"
                )

    def finalize(self, roots: list[str], overwrite: bool) -> int:
        """Checks every file is complete and matches its root digest, then moves it into place."""
        with self.gate.exclusive():
            self._check_open()  # another sender's commit of this very transfer came first
            total = self._finalize(roots, overwrite)
            self.committed = True
        self.store.forget(self)
        return total

    def _finalize(self, roots: list[str], overwrite: bool) -> int:
        if len(roots) != len(self.files):
            raise VerifyError("COMMIT lists a different number of files than the manifest")
        # Every chunk is written by now (the journals are checked next), so every page is
        # allocated: the reservation has nothing left to do, and no fallocate of this process may
        # run on a file once it is sealed (Reservation passes by files another process seals).
        self._stop_reserving()
        known: dict[str, dict[int, bytes]] = {}
        for fs, root in zip(self.files, roots, strict=True):
            have = known[fs.entry.key] = fs.journal.reload()
            missing = fs.chunks - len(have)
            if missing:
                raise VerifyError(f"{display_name(fs.entry.name)}: {missing} chunks still missing at commit")
            got = root_digest([have[k] for k in range(fs.chunks)])
            if got.hex() != root:
                raise VerifyError(f"{display_name(fs.entry.name)}: root digest does not match the sender's")
        # Placing files is a redo log: once the commit marker is durable, every .part is verified
        # and only waits to be moved, so a receiver killed halfway finishes the job when the sender
        # re-runs (Store.completed) instead of trusting journals whose .part files already moved.
        marker = orjson.dumps({"roots": roots})
        self.store._write_state_file(f"{self.manifest.transfer_id}.commit.json", marker)
        self.store.place_all(self.manifest, overwrite, known)
        return self.manifest.total_bytes

    def _stop_reserving(self) -> None:
        """Stops the background reservation, waiting for the piece in flight only: a plan that
        closes without committing (Ctrl-C, a failed transfer, in Receiver._release under its lock)
        returns at once, and its files' reservation is taken up again by the plan that resumes it."""
        reservation, self.reservation = self.reservation, None
        if reservation is not None:
            reservation.stop()

    def close(self) -> None:
        self._stop_reserving()
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if self.live_fd >= 0:
                os.close(self.live_fd)  # releases the flock
                self.live_fd = -1


def final_mode(mode: int) -> int:
    """The mode a received file gets from the sender's: its permission bits less group and other
    write (a sender cannot make a file others may change), never setuid, setgid or sticky."""
    return mode & 0o777 & ~0o022


def _chmod_at(dir_fd: int, name: str, mode: int) -> bool:
    """chmod of the regular file `name` under `dir_fd`, never through a link, whatever its mode
    (no open for reading or writing: O_PATH, then its /proc/self/fd name); False if it is not a
    regular file or /proc is not there (Python's chmod has no dir_fd without following links)."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            os.chmod(f"/proc/self/fd/{fd}", mode)
        except FileNotFoundError:
            return False
    finally:
        os.close(fd)
    return True


def _not_a_dir(parent: int, name: str, path: tuple[str, ...]) -> TransferError:
    """Why the last of `path` (under `parent`, on the way to `name`) did not open as a directory.
    A file (or a FIFO, a device) is in the way, exit 9 like any existing file: it is named, and
    not replaced, --overwrite or not (like cp: "cannot overwrite non-directory with directory";
    rsync -a would delete it, but rq never deletes a user's file to make room for a directory).
    A symlink is an unsafe name: nothing under DEST is reached through one."""
    try:
        mode = os.stat(path[-1], dir_fd=parent, follow_symlinks=False).st_mode
    except OSError:
        mode = 0
    if mode and not stat.S_ISLNK(mode) and not stat.S_ISDIR(mode):
        kind = "a file" if stat.S_ISREG(mode) else "a special file"
        return DirectoryInTheWayError(
            f"{display_name('/'.join(path))} exists in the destination as {kind} where the transfer has a "
            "directory (rq does not replace files with directories, --overwrite or not)"
        )
    return UnsafeNameError(
        f"{display_name(name)}: {display_name(path[-1])} in the destination is not a plain directory"
    )


def _all_in_the_way(errors: list[tuple[str, ExistsError]]) -> ExistsError:
    """The first refusal, naming how many more files are in the way and the first few of them."""
    first = errors[0][1]
    if len(errors) == 1:
        return first
    shown = ", ".join(display_name(name) for name, _ in errors[1:4])
    more = f" and {len(errors) - 4} more" if len(errors) > 4 else ""
    return type(first)(f"{first}; also in the way: {shown}{more}")


class Store:
    """The destination directory, held open by descriptor."""

    def __init__(
        self, dest: Path, overwrite: bool = False, limits: Limits | None = None, owner: str | None = None
    ):
        """`owner`: who this receiver is, shared by the processes of one `rq recv --workers`, so
        that they may plan the same transfer while another receiver on DEST may not (_owning)."""
        self.dest = dest
        self.overwrite = overwrite
        self.limits = limits or Limits()
        self.owner = owner or os.urandom(8).hex()
        self._direct = bool(O_DIRECT)
        # write-back errors any flush here was told of (_check_write_back): each is reported once
        self.write_back_errors = 0
        self._errors_lock = threading.Lock()
        self.fd, self.state_fd = self._open_dirs()

    def _open_dirs(self) -> tuple[int, int]:
        """Descriptors of DEST and of its state directory, made as needed."""
        self.dest.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                os.mkdir(STATE_DIR_NAME, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            except OSError as exc:  # DEST's own trouble (read-only, not ours): said of DEST
                raise OSError(exc.errno, exc.strerror, os.fspath(self.dest)) from None
            try:
                state_fd = os.open(STATE_DIR_NAME, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise UnsafeNameError(
                    f"{self.dest}/{STATE_DIR_NAME} is not a plain directory ({exc.strerror})"
                ) from None
            # one that was there already and that another user owns or others can write: they
            # could have put journals, placed records or links in it, or swap them mid-transfer
            problem = dir_problem(os.fstat(state_fd))
            if problem is not None:
                os.close(state_fd)
                raise UnsafeNameError(
                    f"{self.dest}/{STATE_DIR_NAME} {problem}; refusing it (remove it, or give a DEST of your own)"
                )
            return fd, state_fd
        except BaseException:
            os.close(fd)
            raise

    def reopen_if_removed(self) -> bool:
        """Opens DEST and its state directory again if either was removed since: `rm -r
        DEST/.rq-partial` with no transfer running forgets what arrived (docs/transfer.md), and a
        receiver that stays up refused every later transfer, writing into a directory that was
        gone. Call it only while no transfer is open here: the old descriptors are closed."""
        if os.fstat(self.fd).st_nlink and os.fstat(self.state_fd).st_nlink:
            return False
        old = (self.fd, self.state_fd)
        self.fd, self.state_fd = self._open_dirs()
        for fd in old:
            os.close(fd)
        return True

    def close(self) -> None:
        os.close(self.state_fd)
        os.close(self.fd)

    def syncfs(self) -> bool:
        """Flushes the destination's file system (False where syncfs(2) is missing)."""
        with self._counting_errors():
            return _syncfs(self.state_fd)

    def flush_data(self, fd: int) -> None:
        """fdatasync(2) of one open .part file."""
        with self._counting_errors():
            os.fdatasync(fd)

    @contextlib.contextmanager
    def _counting_errors(self) -> Iterator[None]:
        try:
            yield
        except OSError:
            # any error a flush returns (EIO, or ENOSPC from delayed allocation) may stand for
            # pages of other channels' chunks too
            with self._errors_lock:
                self.write_back_errors += 1
            raise

    # -- planning -------------------------------------------------------------------------------

    def plan(self, manifest: Manifest, reserve: bool = True) -> Plan:
        """Accepts a validated manifest: checks the destination, then opens (or resumes) partial files.
        `reserve=False`: reserves no space (a second plan of a transfer already open here, made
        to re-check the destination: the open plan's reservation is already at work)."""
        with self._owning(manifest.transfer_id):
            return self._plan(manifest, reserve)

    @contextlib.contextmanager
    def _owning(self, tid: str) -> Iterator[None]:
        """Makes this receiver the one writing transfer `tid` into DEST, or raises BusyError if
        another receiver (another `rq recv` on the same DEST, not a --workers process of this one)
        is writing it right now. Two receivers of one transfer wrote the same partial files, and
        the first to commit moved them away under the other, which failed with a bare 'cannot
        write'. `<tid>.owner` names the receiver and is flocked while a plan is made, so two
        planning at once are told apart; its owner counts only while the transfer is live (its
        `.live` lock held), so a killed receiver's transfer is taken over like any stale one."""
        fd = self._locked(f"{tid}.owner", os.O_RDWR, fcntl.LOCK_EX)
        try:
            try:
                rec = orjson.loads(_read_fd(fd) or b"{}")
            except orjson.JSONDecodeError:
                rec = {}
            if not isinstance(rec, dict):
                rec = {}
            theirs = rec.get("owner")
            if theirs not in (None, self.owner) and self._is_live(tid):
                pid = rec.get("pid")
                who = f"another rq recv (pid {pid})" if isinstance(pid, int) else "another rq recv"
                # not DEST's path: the receiver's own paths stay on the receiver
                raise BusyError(f"{who} is receiving this transfer into the same destination right now")
            if theirs != self.owner:
                os.ftruncate(fd, 0)
                os.pwrite(fd, orjson.dumps({"owner": self.owner, "pid": os.getpid()}), 0)
            try:
                yield
            except BaseException:
                # a refused plan (a file in the way, a full disk) left nothing to resume: its
                # owner file would stay for good (still flocked: no one plans it meanwhile)
                if not self._exists(f"{tid}.manifest.json"):
                    unlink_quiet_at(f"{tid}.owner", self.state_fd)
                raise
        finally:
            os.close(fd)  # releases the flock

    def recover(self, keep_partial: float | None = KEEP_PARTIAL) -> Expired:
        """What a receiver does as it starts (and `plan` for the other transfers): finishes every
        commit a killed receiver cut short, removes the partial state of transfers untouched for
        longer than `keep_partial` seconds (None or 0: never; see expire), then prunes the state
        files nothing needs any more. Returns what expire removed."""
        with _disk_errors(self.state_fd):
            # one listing for the three steps (it was listed three times as the receiver started):
            # a name a step removed after it still reads as present to the next, which then keeps
            # what it would have removed (a journal whose .part went, the locks of a transfer whose
            # manifest went) until the next sweep; nothing is removed on its account
            names = os.listdir(self.state_fd)
            self._finish_interrupted(names=names)
            expired = self.expire(keep_partial, names=names)
            self._prune(names)
        return expired

    def expire(
        self, keep_partial: float | None = KEEP_PARTIAL, names: Sequence[str] | None = None
    ) -> Expired:
        """Removes the partial state of every transfer nothing touched for `keep_partial` seconds:
        its manifest, commit marker and lock files, and the `.part` files and journals of its
        files not yet placed (what a sender that never came back left, reservations included).
        "Touched" is the newest ctime of its manifest (rewritten by every plan, so each retry of
        its sender counts), its commit marker and its files' `.part` and journal (every chunk
        made durable moves them): a sender resuming after a long pause keeps what arrived.

        Never a transfer open in any process (its `.live` lock), being planned (its `.owner`
        lock), or sharing a file version with a transfer that is kept. A `.part` no manifest
        names (none should exist) goes by its own ctime. Files already placed, their records and
        journals and done markers are not partial state: _prune keeps them as before.
        `names`: the state directory's listing, where the caller has one (recover lists it once)."""
        if not keep_partial or keep_partial <= 0:
            return Expired(older_than=None)
        cutoff = time.time() - keep_partial
        names = os.listdir(self.state_fd) if names is None else names
        manifests: dict[str, Manifest] = {}
        for name in names:
            tid = name.removesuffix(".manifest.json")
            if tid != name and len(tid) == 32:
                m = self._read_manifest(tid)
                if m is not None:
                    manifests[tid] = m
        old = {tid for tid, m in manifests.items() if not self._touched_since(tid, m, cutoff)}
        kept_keys = {f.key for tid, m in manifests.items() if tid not in old for f in m.files}
        gone: list[str] = []
        files = freed = 0
        for tid in sorted(old):
            with self._expiring(tid) as mine:
                # under its locks: a plan that rewrote its manifest meanwhile made it fresh
                m = self._read_manifest(tid) if mine else None
                if m is None or self._touched_since(tid, m, cutoff):
                    continue
                doomed = [f"{tid}.commit.json", f"{tid}.manifest.json", f"{tid}.live", f"{tid}.owner"]
                for f in m.files:
                    if f.key in kept_keys:
                        continue  # the same file version in a transfer that stays
                    doomed.append(f"{f.key}.part")
                    rec = self._read_placed(f.name)
                    if rec is None or rec.get("key") != f.key:  # else a placed file's (_prune judges)
                        doomed.append(f"{f.key}.journal")
                n, b = self._unlink_counting(doomed)
                files, freed = files + n, freed + b
                gone.append(tid)
        referenced = {f.key for m in manifests.values() for f in m.files}
        for name in names:
            key = name.removesuffix(".part")
            # an orphan no manifest will ever place (its journal then goes in _prune)
            if key != name and len(key) == 32 and key not in referenced and self._ctime(name) < cutoff:
                n, b = self._unlink_counting([name])
                files, freed = files + n, freed + b
        if files:
            os.fsync(self.state_fd)
        return Expired(tuple(gone), files, freed, keep_partial)

    def _touched_since(self, tid: str, manifest: Manifest, cutoff: float) -> bool:
        """Whether any of a transfer's state (manifest, commit marker, a .part or journal of its
        files) changed at `cutoff` or after, by ctime; a plan's fresh manifest answers at once."""
        names = [f"{tid}.manifest.json", f"{tid}.commit.json"]
        names += [f"{f.key}{suffix}" for f in manifest.files for suffix in (".part", ".journal")]
        return any(self._ctime(name) >= cutoff for name in names)

    def _ctime(self, name: str) -> float:
        """A state file's ctime (no utime sets it back, unlike the mtime a commit gives a sealed
        .part), 0 where it is not there."""
        try:
            return os.stat(name, dir_fd=self.state_fd, follow_symlinks=False).st_ctime
        except FileNotFoundError:
            return 0.0

    def _unlink_counting(self, names: list[str]) -> tuple[int, int]:
        """Unlinks state files; (how many were there, the bytes of blocks they held)."""
        n = freed = 0
        for name in names:
            try:
                st = os.stat(name, dir_fd=self.state_fd, follow_symlinks=False)
                os.unlink(name, dir_fd=self.state_fd)
            except FileNotFoundError:
                continue
            n += 1
            freed += st.st_blocks * 512
        return n, freed

    @contextlib.contextmanager
    def _expiring(self, tid: str) -> Iterator[bool]:
        """Both locks of a transfer, taken without waiting: its `.owner` (no plan of it is being
        made) and its `.live` (no plan of it is open anywhere). Yields False where either is held.
        The caller removes both files before it lets go, as _drop_locks does; a planner that
        waited on the `.owner` meanwhile finds it unlinked and opens it anew (_owning)."""
        with self._not_planned(tid) as free:
            if not free:
                yield False
                return
            with self._quiet_transfer(tid) as mine:
                yield mine

    @contextlib.contextmanager
    def _not_planned(self, tid: str) -> Iterator[bool]:
        """An exclusive flock on `<tid>.owner` (if there is one), taken without waiting: False
        while a plan of the transfer is being made (_owning holds it)."""
        with self._try_flock(f"{tid}.owner", create=False) as free:
            yield free

    @contextlib.contextmanager
    def _try_flock(self, name: str, create: bool) -> Iterator[bool]:
        """An exclusive flock on state file `name`, without waiting: False while another holds
        it (or, `create`, where it cannot be made); True where it is not there (not `create`)."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(name, flags, 0o600, dir_fd=self.state_fd)
        except OSError as exc:
            yield not create and isinstance(exc, FileNotFoundError)
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def _finish_interrupted(self, but: str = "", names: Sequence[str] | None = None) -> None:
        """Finishes the commits that a receiver killed while placing files left (their commit
        marker is there, their transfer not open anywhere), so that DEST and the placed records
        say what rq put there before any other transfer is planned against them. One this
        receiver cannot finish (a file put in the way since) stays for its own re-run to report.
        `names`: the state directory's listing, where the caller has one (a plan lists it once)."""
        for name in os.listdir(self.state_fd) if names is None else names:
            tid = name.removesuffix(".commit.json")
            if tid in (name, but) or len(tid) != 32:
                continue
            with self._quiet_transfer(tid) as mine:
                if not mine:
                    continue
                manifest = self._read_manifest(tid)
                if manifest is None:
                    unlink_quiet_at(name, self.state_fd)  # nothing to finish it with
                    continue
                with contextlib.suppress(TransferError, OSError):
                    self._redo_commit(manifest)

    def _prune(self, listing: Sequence[str] | None = None) -> None:
        """Removes state files that describe nothing any more (docs/transfer.md, "Receiver
        layout"): lock files of transfers with no state left, temp files of writers that died,
        the placed records and journals of files no longer at their names, and done markers none
        of whose files is left. What a finished transfer keeps (its done marker, per file still in
        place a placed record and its journal) stays: re-runs send only what went missing.
        `listing`: the state directory's listing, where the caller has one."""
        names = set(os.listdir(self.state_fd) if listing is None else listing)
        keys_in_use: set[str] = set()
        for name in sorted(n for n in names if n.endswith(".placed")):
            rec = self._read_placed_file(name)
            if rec is None:
                continue
            key, final = rec.get("key"), rec.get("name")
            if not isinstance(key, str) or not isinstance(final, str) or _placed_name(final) != name:
                continue
            try:
                gone = self._final_stat(final) is None and not self._exists(f"{key}.part")
            except TransferError:  # a name this rq would not accept now: left alone
                gone = False
            if gone:
                unlink_quiet_at(name, self.state_fd)
            elif not self._holds_digests(rec):
                keys_in_use.add(key)  # its journal gives the digests
        for name in names:
            base, _, suffix = name.partition(".")
            if len(base) != 32:
                continue
            if suffix == "journal" and base not in keys_in_use and f"{base}.part" not in names:
                unlink_quiet_at(name, self.state_fd)  # claims chunks of no file at all
            elif suffix in ("owner", "live") and not (
                {f"{base}.manifest.json", f"{base}.commit.json"} & names
            ):
                self._drop_locks(base)
            elif suffix == "done.json":
                self._prune_done(name)
            elif ".tmp" in suffix:
                self._prune_temp(name)

    @staticmethod
    def _holds_digests(rec: dict[str, Any]) -> bool:
        cs, found = rec.get("chunk_size"), rec.get("digests")
        return (
            isinstance(cs, int)
            and isinstance(found, list)
            and _record_digests(rec, cs, len(found)) is not None
        )

    def _drop_locks(self, tid: str) -> None:
        """The `.owner` and `.live` of a transfer with no manifest or commit: a plan that failed
        before writing its manifest. Not while a plan of it is being made or open."""
        with self._not_planned(tid) as free:
            if not free or self._exists(f"{tid}.manifest.json") or self._is_live(tid):
                return
            unlink_quiet_at(f"{tid}.live", self.state_fd)
            unlink_quiet_at(f"{tid}.owner", self.state_fd)

    def _prune_done(self, name: str) -> None:
        """A done marker none of whose files is at its name any more: a re-run is a new transfer."""
        files = self._load_state_json(name)[1]
        if not isinstance(files, list) or not files:
            return  # no files (only directories): nothing to judge it by
        for item in files:
            if not (isinstance(item, list) and item and isinstance(item[0], str)):
                return
            try:
                if self._final_stat(item[0]) is not None:
                    return
            except TransferError:
                return
        unlink_quiet_at(name, self.state_fd)

    def _prune_temp(self, name: str) -> None:
        """`<name>.tmp<pid>.<thread>` of a process that is gone (a crash between write and rename)."""
        pid = name.rpartition(".tmp")[2].partition(".")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            return
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            unlink_quiet_at(name, self.state_fd)
        except OSError:
            pass  # alive (another user's): not ours to judge

    @contextlib.contextmanager
    def _quiet_transfer(self, tid: str) -> Iterator[bool]:
        """An exclusive flock on `<tid>.live` while the caller works on that transfer's state: yields
        False (and takes nothing) where a plan of it is open in some process, or another process
        is at the same work; to everyone else the transfer reads as live meanwhile."""
        with self._try_flock(f"{tid}.live", create=True) as mine:
            yield mine

    def _read_manifest(self, tid: str) -> Manifest | None:
        try:
            fd = os.open(
                f"{tid}.manifest.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.state_fd
            )
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as fh:
            try:
                return parse_manifest(fh.read(), _NO_LIMITS)
            except TransferError:
                return None

    def _plan(self, manifest: Manifest, reserve: bool = True) -> Plan:
        # One listing of the state directory per plan, and each other transfer's manifest parsed
        # once: with 10,000 finished transfers kept here (a done marker and placed records each)
        # the three listings a plan made were most of its cost (docs/transfer.md, "Receiver layout").
        # A state file a step below removes meanwhile (a finished commit's manifest) reads as absent.
        names = os.listdir(self.state_fd)
        self._finish_interrupted(but=manifest.transfer_id, names=names)
        others = self._other_manifests(manifest, names)
        self._check_chunk_size(manifest, others)  # first: files kept at another size are not "in the way"
        with self._dirs_opened(manifest):
            return self._plan_checked(manifest, reserve, others)

    def _plan_checked(self, manifest: Manifest, reserve: bool, others: list[tuple[str, Manifest]]) -> Plan:
        states = [self._placed_state(entry, manifest.chunk_size) for entry in manifest.files]
        in_the_way: list[tuple[str, ExistsError]] = []
        for entry, state in zip(manifest.files, states, strict=True):
            if state == INTACT:
                continue  # placed here before and untouched since: nothing to send or check
            if state == CHANGED and not self.overwrite:
                raise ExistsError(
                    f"{display_name(entry.name)} was changed in the destination after rq placed it there "
                    "(its size, mtime or inode differ); rq never replaces a file without --overwrite: "
                    "run `rq recv` with --overwrite to send it again, or move it out of the way"
                )
            if state in (GONE, CHANGED):
                unlink_quiet_at(_placed_name(entry.name), self.state_fd)  # it is sent again
            try:
                self._check_target(entry.name, entry.key)
            except ExistsError as exc:
                # all of them, so that one re-run after moving them out of the way succeeds
                first = not in_the_way
                in_the_way.append(
                    (entry.name, self._explain_partial_rerun(manifest, entry, exc) if first else exc)
                )
        if in_the_way:
            raise _all_in_the_way(in_the_way)
        for name in manifest.dirs:
            self._check_dir_target(name)
        restarted = self._drop_stale(manifest, others)
        with _disk_errors(self.state_fd, lambda: self._kept_on_disk(manifest, states)):
            self._write_state_file(f"{manifest.transfer_id}.manifest.json", manifest.to_json())
            intact = [state == INTACT for state in states]
            return self._open(manifest, restarted, intact=intact, reserve=reserve)

    def _kept_on_disk(self, manifest: Manifest, states: list[str]) -> str:
        """What a plan that ran out of space keeps (kept_text): the journaled chunks of its files
        not in place whose .part is there (an earlier run's, which a re-run resumes)."""
        cs = manifest.chunk_size
        chunks = nbytes = 0
        for entry, state in zip(manifest.files, states, strict=True):
            if state == INTACT or not self._exists(f"{entry.key}.part"):
                continue
            have = recorded(
                self.state_fd, f"{entry.key}.journal", entry.key, entry.size, cs, entry.chunks(cs)
            )
            chunks += len(have)
            nbytes += sum(entry.chunk_len(k, cs) for k in have)
        return kept_text(chunks, nbytes)

    def has_finished(self, transfer_id: str) -> bool:
        """True if transfer `transfer_id` was committed here (its done marker), without checking
        its files or finishing an interrupted commit as `completed` does: a cheap look."""
        try:
            return self._exists(f"{transfer_id}.done.json")
        except OSError:
            return False

    def completed(self, manifest: Manifest) -> bool:
        """True if this exact transfer finished here before and its files are still in place.

        A commit that a crash interrupted (marker written, files partly placed) is finished now."""
        tid = manifest.transfer_id
        name = f"{tid}.done.json"
        with _disk_errors(self.state_fd, lambda: _ALL_KEPT):
            self._redo_commit(manifest)
        if not self._exists(name):
            return False
        # A file moved or deleted since: not complete, send it again (plan() keeps the files still
        # in place, see _placed_state). A done marker from before placed records were kept (no
        # record) counts the file by its size, as it did then.
        with self._dirs_opened(manifest):
            if not all(self._still_placed(entry, manifest.chunk_size) for entry in manifest.files):
                return False
            if not all(self._is_dir(name) for name in manifest.dirs):
                return False  # one removed since: make it again
        # Complete: the directories get the sender's modes again, as rsync -a fixes them on a
        # re-run. A transfer an older receiver (no dir_modes) finished kept 0755 for good; one
        # chmod per directory, and only where the sender sent modes.
        self._set_dir_modes(manifest)
        return True

    def _is_dir(self, name: str) -> bool:
        st = self._final_stat(name)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def _check_dir_target(self, name: str) -> None:
        """A directory entry: every component that exists must be a plain directory (a symlink
        planted under DEST is refused, never followed), and a file in its place is not replaced."""
        fd = os.dup(self.fd)
        parts = _components(name)
        try:
            for i, comp in enumerate(parts):
                try:
                    nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    return  # made at commit, with what is under it
                except OSError as exc:
                    raise _not_a_dir(fd, name, parts[: i + 1]) from exc
                os.close(fd)
                fd = nfd
        finally:
            os.close(fd)

    def make_dirs(self, manifest: Manifest) -> None:
        """Creates the manifest's directories under DEST, component by component relative to its
        descriptor without following links (a symlink planted since planning is refused here too)."""
        for name in manifest.dirs:
            os.close(self._open_parent(name, tuple(_components(name)), sync_new=True))

    def _open_dir(self, name: str, flags: int = _DIR_FLAGS) -> int:
        """The directory `name` under DEST, reached component by component without following links."""
        return descend(self.fd, _components(name), flags)

    def _set_dir_times(self, manifest: Manifest) -> None:
        """Gives the transfer's directories the sender's mtimes (like rsync -a), deepest first,
        once everything under them is placed: a link or mkdir inside one after would move it.
        Best effort, like the times of a directory this receiver does not own: never an error."""
        for name, ns in sorted(manifest.dir_mtimes, key=lambda d: -d[0].count("/")):
            with contextlib.suppress(OSError):
                fd = self._open_dir(name)
                try:
                    os.utime(fd, ns=(os.fstat(fd).st_atime_ns, ns))
                finally:
                    os.close(fd)

    def _set_dir_modes(self, manifest: Manifest) -> None:
        """Gives the transfer's directories the sender's permission bits as final_mode keeps them
        (less group/other write, never setuid, setgid or sticky), after their times and deepest
        first: a parent made 0500 before its children were done would refuse their opens (a
        receiver that is not root), and a chmod does not move an mtime. Reached through O_PATH, so
        a parent needs only search permission. Only the transfer's own directories, all under
        DEST (parse_manifest checked each name), never DEST itself. Best effort, like the times:
        one this receiver does not own (EPERM) keeps its mode."""
        for name, mode in sorted(manifest.dir_modes, key=lambda d: -d[0].count("/")):
            with contextlib.suppress(OSError):
                fd = self._open_dir(name, _PATH_DIR_FLAGS)
                try:
                    os.chmod(f"/proc/self/fd/{fd}", final_mode(mode))
                finally:
                    os.close(fd)

    def _open_dirs_for_placing(self, manifest: Manifest) -> list[tuple[str, int]]:
        """A directory of this transfer that an earlier one left without owner read, write or
        search permission (its sender's 0500, 0300 or 0000) would refuse this commit's links and
        mkdirs, and the O_RDONLY walks of plan's checks and _set_dir_times, when the receiver is
        not root: like rsync, give it u+rwx until _set_dir_modes gives it its mode at the end
        (shallowest first, so that each is reachable). Only directories we own. Returns those
        changed, with their modes before, for _restore_dir_modes."""
        changed: list[tuple[str, int]] = []
        if not manifest.dir_modes or os.geteuid() == 0:
            return changed  # root is refused nothing
        for name, _mode in sorted(manifest.dir_modes, key=lambda d: d[0].count("/")):
            with contextlib.suppress(OSError):
                fd = self._open_dir(name, _PATH_DIR_FLAGS)
                try:
                    st = os.fstat(fd)
                    if st.st_mode & 0o700 != 0o700 and st.st_uid == os.geteuid():
                        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | 0o700)
                        changed.append((name, stat.S_IMODE(st.st_mode)))
                finally:
                    os.close(fd)
        return changed

    def _restore_dir_modes(self, changed: list[tuple[str, int]]) -> None:
        """Gives the directories _open_dirs_for_placing opened their modes back, deepest first
        (each parent still searchable). Best effort, like _set_dir_modes."""
        for name, mode in reversed(changed):
            with contextlib.suppress(OSError):
                fd = self._open_dir(name, _PATH_DIR_FLAGS)
                try:
                    os.chmod(f"/proc/self/fd/{fd}", mode)
                finally:
                    os.close(fd)

    @contextlib.contextmanager
    def _dirs_opened(self, manifest: Manifest) -> Iterator[None]:
        """The transfer's directories opened (u+rwx) for a look at what is under them (a re-run's
        plan, "already complete?"), their modes back after: a receiver that is not root found an
        earlier transfer's 0300 or 0000 directory "not a plain directory" and refused every re-run."""
        changed = self._open_dirs_for_placing(manifest)
        try:
            yield
        finally:
            self._restore_dir_modes(changed)

    def _still_placed(self, entry: FileEntry, chunk_size: int) -> bool:
        state = self._placed_state(entry, chunk_size)
        return state == INTACT or (state == UNKNOWN and self._final_size(entry.name) == entry.size)

    def _placed_state(self, entry: FileEntry, chunk_size: int) -> str:
        """What became of this file version since rq placed it here (its placed record):
        INTACT (same size, mtime and inode, and its journal still holds every chunk digest),
        GONE, CHANGED, or UNKNOWN (never placed here, or the record or journal is missing).
        A stat per file, like rsync's quick check: nothing is read or hashed."""
        rec = self._read_placed(entry.name)
        if rec is None or rec.get("key") != entry.key or rec.get("name") != entry.name:
            return UNKNOWN
        st = self._final_stat(entry.name)
        if st is None:
            return GONE
        now = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
        if not stat.S_ISREG(st.st_mode) or now != rec.get("stat") or st.st_size != entry.size:
            part = self._part_stat(entry.key)
            was = rec.get("stat")
            if part is not None and isinstance(was, list) and [part.st_dev, part.st_ino] == was[:2]:
                return UNKNOWN  # recorded by a commit cut short before the link: not placed yet
            return CHANGED
        have = self._placed_digests(rec, entry, chunk_size)
        return INTACT if len(have) == entry.chunks(chunk_size) else UNKNOWN

    def _placed_digests(self, rec: dict[str, Any], entry: FileEntry, chunk_size: int) -> dict[int, bytes]:
        """A placed file's chunk digests: from its placed record (PLACED_DIGESTS_MAX), else from
        its journal (bigger files, and records an older rq wrote)."""
        chunks = entry.chunks(chunk_size)
        folded = _record_digests(rec, chunk_size, chunks)
        if folded is not None:
            return folded
        return recorded(self.state_fd, f"{entry.key}.journal", entry.key, entry.size, chunk_size, chunks)

    def _read_placed(self, name: str) -> dict[str, Any] | None:
        return self._read_placed_file(_placed_name(name))

    def _read_placed_file(self, state_name: str) -> dict[str, Any] | None:
        rec = self._load_state_json(state_name)[1]
        return rec if isinstance(rec, dict) else None

    def _load_state_json(self, name: str) -> tuple[bool, Any]:
        """(whether state file `name` is there, its JSON or None where torn or not JSON)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.state_fd)
        except FileNotFoundError:
            return False, None
        try:
            data = _read_fd(fd)  # no buffered file object: recover reads one per placed file
        finally:
            os.close(fd)
        try:
            return True, orjson.loads(data)
        except orjson.JSONDecodeError:
            return True, None

    def _record_placed(
        self,
        entry: FileEntry,
        chunk_size: int,
        st: os.stat_result | None = None,
        sync: bool = True,
        digests: dict[int, bytes] | None = None,
    ) -> None:
        """Remembers the file just placed (its stat, `st` if the caller has it) under its name, so
        that a later re-run can tell it is still there untouched and send only what is missing
        (_placed_state). One record per name: placing another version replaces it. `sync=False`:
        the caller syncs a batch of records at once. A file of at most PLACED_DIGESTS_MAX chunks
        gets its chunk digests in the record (`digests`, else read from its journal), so that
        its journal can go once it is placed (place_all)."""
        if st is None:
            st = self._final_stat(entry.name)
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
            return
        now = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
        rec = self._read_placed(entry.name)
        if rec is not None and rec.get("key") == entry.key and rec.get("stat") == now:
            return
        body: dict[str, Any] = {
            "name": entry.name,
            "key": entry.key,
            "stat": now,
            "ident": entry.ident,
            "chunk_size": chunk_size,
        }
        chunks = entry.chunks(chunk_size)
        if chunks <= PLACED_DIGESTS_MAX:
            if digests is None:
                journal = f"{entry.key}.journal"
                digests = recorded(self.state_fd, journal, entry.key, entry.size, chunk_size, chunks)
            if all(k in digests for k in range(chunks)):
                body["digests"] = [digests[k].hex() for k in range(chunks)]
        # a first record goes straight to its name (one file created instead of a temp name and a
        # rename): a crash that tears it leaves a record that reads as absent, which the commit's
        # redo writes again; replacing another version's record stays atomic
        name, data = _placed_name(entry.name), orjson.dumps(body)
        self._write_state_file(name, data, sync=sync, atomic=sync or rec is not None)
        old = rec.get("key") if rec is not None else None
        if isinstance(old, str) and old != entry.key and not self._exists(f"{old}.part"):
            unlink_quiet_at(f"{old}.journal", self.state_fd)  # another version's: replaced here

    def _explain_partial_rerun(self, manifest: Manifest, entry: FileEntry, exc: ExistsError) -> ExistsError:
        """A file of this very transfer, complete here before, is still in place while another one
        is gone: say that, and what to do, instead of a bare "exists"."""
        if self.overwrite or not self._exists(f"{manifest.transfer_id}.done.json"):
            return exc
        gone = [f.name for f in manifest.files if self._final_size(f.name) != f.size]
        if not gone or self._final_size(entry.name) is None:
            return exc
        more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
        return ExistsError(
            f"{display_name(entry.name)} already exists in the destination: this transfer completed here "
            f"before and {display_name(gone[0])}{more} has since been removed or changed. rq recv sends "
            "whole transfers and never replaces files by default: run `rq recv` with --overwrite to send "
            "the transfer again and replace its files, or move its remaining files out of the destination "
            "and re-run"
        )

    def _redo_commit(self, manifest: Manifest) -> None:
        """Finishes a commit a crash cut short, if every file it had not yet placed still waits
        as the complete .part it verified. A .part is named by its file's key, which another
        transfer of the same file version shares: if such a transfer recreated and partly wrote
        it since, this commit cannot be finished any more and is dropped (its files are then
        planned again like any transfer), never placed half-written."""
        marker = f"{manifest.transfer_id}.commit.json"
        found, body = self._load_state_json(marker)
        if not found:
            return
        roots = body.get("roots") if isinstance(body, dict) else None
        cs = manifest.chunk_size
        ok = isinstance(roots, list) and len(roots) == len(manifest.files)
        for entry, root in zip(manifest.files, roots if isinstance(roots, list) and ok else [], strict=False):
            if not self._exists(f"{entry.key}.part"):
                continue  # placed before the crash
            chunks = entry.chunks(cs)
            have = recorded(self.state_fd, f"{entry.key}.journal", entry.key, entry.size, cs, chunks)
            if len(have) != chunks or root_digest([have[k] for k in range(chunks)]).hex() != root:
                ok = False
                break
        if ok:
            self.place_all(manifest, self.overwrite)
        else:
            unlink_quiet_at(marker, self.state_fd)

    def _exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.state_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def _final_size(self, name: str) -> int | None:
        st = self._final_stat(name)
        return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None

    def _final_stat(self, name: str) -> os.stat_result | None:
        """lstat of a final name, reached without following any link; None if it is not there."""
        parts = _components(name)
        fd = os.dup(self.fd)
        try:
            for comp in parts[:-1]:
                nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nfd
            return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)

    def stamp(self, tid: str) -> tuple[int, int, int] | None:
        """(dev, ino, ctime_ns) of transfer `tid`'s manifest state file, None if it has none: each
        plan of the transfer (in any process of this receiver) writes it anew (Plan.planned_as)."""
        try:
            st = os.stat(f"{tid}.manifest.json", dir_fd=self.state_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino, st.st_ctime_ns

    def join(self, tid: str) -> Plan:
        """Opens a transfer another channel (maybe in another process) already planned."""
        if len(tid) != 32 or any(c not in "0123456789abcdef" for c in tid):
            raise UnknownTransferError("bad transfer id")
        try:
            fd = os.open(
                f"{tid}.manifest.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.state_fd
            )
        except FileNotFoundError:
            if self.has_finished(tid):  # committed by another sender of it a moment ago
                raise FinishedMeanwhileError(FINISHED_MEANWHILE) from None
            raise UnknownTransferError(f"no transfer {tid} is in progress here") from None
        with os.fdopen(fd, "rb") as fh:
            manifest = parse_manifest(fh.read(), self.limits)
        return self._open(manifest, [], joining=True)

    def _open(
        self,
        manifest: Manifest,
        restarted: list[str],
        joining: bool = False,
        intact: list[bool] | None = None,
        reserve: bool = True,
    ) -> Plan:
        """`intact`: per file, whether plan() found it in place from an earlier transfer (a joiner
        looks again). `reserve`: reserve the space of files still to come (a joiner never does)."""
        stamp = self.stamp(manifest.transfer_id)  # before the file states are read
        cs = manifest.chunk_size
        if intact is None:
            intact = [self._placed_state(e, cs) == INTACT for e in manifest.files]
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        # Files without a .part start afresh. A journal describes the bytes of one .part file;
        # without that file its records claim data nobody has, so they go first, durably, before
        # any new .part appears: no crash may leave a new .part beside old records. One sync for
        # all of them, and none where no journal was there (a first transfer).
        fresh = [False] * len(manifest.files)
        dropped = False
        for i, (entry, in_place) in enumerate(zip(manifest.files, intact, strict=True)):
            if in_place:
                continue
            try:
                os.close(self._open_part(f"{entry.key}.part"))  # made writable, if sealed
            except FileNotFoundError:
                if joining:  # placed by a commit a moment ago: a straggler, or another sender's
                    raise FinishedMeanwhileError(FINISHED_MEANWHILE) from None
                fresh[i] = True
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{entry.key}.journal", dir_fd=self.state_fd)
                    dropped = True
        if dropped:
            os.fsync(self.state_fd)
        files = []
        reservation = Reservation(self.state_fd, manifest.transfer_id)
        try:
            for entry, in_place, new in zip(manifest.files, intact, fresh, strict=True):
                chunks = entry.chunks(cs)
                part = f"{entry.key}.part"
                if new:
                    os.close(os.open(part, flags | os.O_CREAT, 0o600, dir_fd=self.state_fd))
                # in place from an earlier transfer: its placed record or its journal (kept) gives
                # every digest, and no chunk of it is written (the sender is told it has them all)
                journal: Journal | KnownDigests | None = self._known(entry, cs) if in_place else None
                if journal is None:
                    journal = Journal(
                        self.state_fd, f"{entry.key}.journal", entry.key, entry.size, cs, chunks, fresh=new
                    )
                if (
                    reserve
                    and not in_place
                    and not joining
                    and entry.size >= RESERVE_MIN
                    and len(journal.initial) < chunks
                ):
                    self._reserve(part, entry.size, reservation)
                files.append(FileState(entry, chunks, journal, dict(journal.initial), placed=in_place))
            live = self._hold_live(manifest.transfer_id)
        except BaseException:
            reservation.stop()  # not started: reserves nothing
            raise
        reservation.start()
        return Plan(manifest, files, self, restarted, live_fd=live, reservation=reservation, planned_as=stamp)

    def _known(self, entry: FileEntry, chunk_size: int) -> KnownDigests | None:
        """A placed file's digests from its placed record, where it holds them (no journal to open)."""
        rec = self._read_placed(entry.name)
        if rec is None or rec.get("key") != entry.key:
            return None
        folded = _record_digests(rec, chunk_size, entry.chunks(chunk_size))
        return None if folded is None else KnownDigests(f"{entry.key}.journal", folded)

    def _open_part(self, name: str) -> int:
        """Opens a .part read-write, without following a link. One sealed by a commit (_seal: the
        sender's mode, 0400 or even 0000) that a crash or a file in the way cut short cannot be
        opened so by a receiver that is not root: it is made 0600 again first (sealed again when
        its commit is finished, or written again by the transfer that re-plans it)."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(name, flags, dir_fd=self.state_fd)
        except PermissionError:
            if not _chmod_at(self.state_fd, name, 0o600):
                raise
        return os.open(name, flags, dir_fd=self.state_fd)

    def _hold_live(self, tid: str) -> int:
        """A shared flock on <tid>.live, held while a plan of the transfer is open in any process
        of this receiver; the kernel drops it with the process, so a killed receiver's transfer
        reads as not running (see _is_live)."""
        return self._locked(f"{tid}.live", os.O_RDONLY, fcntl.LOCK_SH)

    def _locked(self, name: str, flags: int, how: int) -> int:
        """State file `name` (made as needed), flocked `how`, waiting. A lock file that an
        expiry or a prune (which hold its lock) unlinked while this waited is no lock any more:
        it is opened again by its name, so two processes never hold "the" lock on two inodes."""
        while True:
            fd = os.open(name, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.state_fd)
            try:
                fcntl.flock(fd, how)
                st = os.fstat(fd)
                try:
                    now = os.stat(name, dir_fd=self.state_fd, follow_symlinks=False)
                except FileNotFoundError:
                    now = None
                if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def _is_live(self, tid: str) -> bool:
        try:
            fd = os.open(f"{tid}.live", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.state_fd)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def _reserve(self, part: str, size: int, background: Reservation) -> None:
        """Takes the whole file's space as the transfer starts (rsync --preallocate, aria2's
        falloc): blocks on disk in one piece instead of chunk by chunk, and on tmpfs the pages at
        once, before any chunk needs them. Measured (docs/transfer.md, 4 GiB over TCP): into
        /dev/shm 4.0-4.2 s -> 2.3-2.4 s (7.3-7.5 s against 9.9-10.3 s where the VM's memory was
        fresh), onto ext4 even or better. Only the planning channel reserves; joiners find it done.
        On tmpfs `background` does it, beside the first chunks: done here it held up the sender's
        ACCEPT for ~0.35 s per 4 GiB."""
        fd = os.open(part, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.state_fd)
        try:
            if in_memory(fd):
                background.add(part, fd, size)
            else:
                reserve(fd, size)
        finally:
            os.close(fd)

    def _check_target(self, name: str, key: str) -> None:
        """Refuses a name whose parents are symlinks or files, or whose final name exists (w/o overwrite)."""
        parts = _components(name)
        fd = os.dup(self.fd)
        try:
            for i, comp in enumerate(parts[:-1]):
                try:
                    nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    return  # parent does not exist yet: nothing can be in the way
                except OSError as exc:
                    raise _not_a_dir(fd, name, parts[: i + 1]) from exc
                os.close(fd)
                fd = nfd
            try:
                st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if stat.S_ISDIR(st.st_mode):
                raise DirectoryInTheWayError(
                    f"{display_name(name)} exists in the destination as a directory"
                    + (" (--overwrite replaces files, not directories)" if self.overwrite else "")
                )
            if not self.overwrite and not self._is_our_link(st, key):
                raise ExistsError(f"{display_name(name)} already exists in the destination")
        finally:
            os.close(fd)

    def _is_our_link(self, st: os.stat_result, key: str) -> bool:
        """True if the final name is a hard link to our own .part: a crash between link() and unlink()."""
        try:
            part = os.stat(f"{key}.part", dir_fd=self.state_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return (part.st_dev, part.st_ino) == (st.st_dev, st.st_ino)

    def _other_manifests(self, manifest: Manifest, names: Sequence[str]) -> list[tuple[str, Manifest]]:
        """The manifests of other transfers planned here and not finished (state file, manifest),
        of those the state directory's listing `names` holds."""
        ours = f"{manifest.transfer_id}.manifest.json"
        found = []
        for entry in names:
            if not entry.endswith(".manifest.json") or entry == ours:
                continue
            try:
                fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.state_fd)
                try:
                    old = parse_manifest(_read_fd(fd), _NO_LIMITS)
                finally:
                    os.close(fd)
            except (OSError, TransferError):
                continue
            found.append((entry, old))
        return found

    def _check_chunk_size(self, manifest: Manifest, others: list[tuple[str, Manifest]]) -> None:
        """Refuses (ChunkSizeError, which a sender answers by re-planning) a manifest whose files
        this receiver already holds verified chunks of, cut at another chunk size: the same file
        versions (same `ident`) re-sent with another --chunk-size. The chunk size with the most
        verified bytes wins; keeping them beats re-sending them whatever size the re-run asked for.
        Re-cutting the journal instead would mean reading and hashing those bytes again."""
        ours = {f.name: f.ident for f in manifest.files if f.ident}
        if not ours:
            return  # an older sender: no identity to compare, so nothing can be kept (as before)
        best: dict[int, int] = {}
        example: dict[int, str] = {}
        for _, old in others:
            cs = old.chunk_size
            if cs == manifest.chunk_size:
                continue
            for f in old.files:
                if not f.ident or ours.get(f.name) != f.ident or not self._exists(f"{f.key}.part"):
                    continue
                have = recorded(self.state_fd, f"{f.key}.journal", f.key, f.size, cs, f.chunks(cs))
                got = sum(f.chunk_len(k, cs) for k in have)
                if got:
                    best[cs] = best.get(cs, 0) + got
                    example.setdefault(cs, f.name)
        # files placed here at another chunk size and untouched since count too: a re-run after
        # one of them was deleted must keep the others, whatever --chunk-size it asks for
        for entry in manifest.files:
            rec = self._read_placed(entry.name)
            at = rec.get("chunk_size") if rec is not None else None
            if rec is None or not isinstance(at, int) or at == manifest.chunk_size or not entry.ident:
                continue
            if rec.get("ident") != entry.ident or not MIN_CHUNK <= at <= MAX_CHUNK:
                continue
            placed = replace(entry, key=str(rec.get("key")))
            if self._placed_state(placed, at) == INTACT:
                best[at] = best.get(at, 0) + entry.size
                example.setdefault(at, entry.name)
        if not best:
            return
        cs = max(best, key=lambda c: best[c])
        raise ChunkSizeError(
            f"{display_name(example[cs])} has {best[cs]} bytes verified or placed here by an earlier run with "
            f"chunk size {cs}; re-run with --chunk-size {cs} to keep them",
            cs,
        )

    def _drop_stale(self, manifest: Manifest, others: list[tuple[str, Manifest]]) -> list[str]:
        """Removes partial state of an older version of any file this manifest sends (changed source).

        The same version cut at another chunk size (same `ident`: _check_chunk_size found nothing
        verified to keep) is dropped too, but not reported as restarted: its source did not change."""
        ours = {f.name: f.key for f in manifest.files}
        idents = {f.name: f.ident for f in manifest.files}
        restarted: list[str] = []
        for entry, old in others:
            if not any(f.name in ours for f in old.files):
                continue
            shared = [f.name for f in old.files if f.name in ours]
            if self._is_live(old.transfer_id):
                # not stale: another sender is writing it right now. Deleting its partial files (a
                # file in another version) or its state (the same version: both would write and
                # commit one .part, and the first to commit fails the other) fails that transfer.
                raise BusyError(
                    f"{display_name(shared[0])} is being written by another transfer that is still "
                    "running here; wait for it to finish (or stop it), then re-run"
                )
            for f in old.files:
                if f.name in ours and ours[f.name] != f.key:
                    if not f.ident or idents[f.name] != f.ident:
                        restarted.append(f.name)
                    for suffix in (".part", ".journal"):
                        unlink_quiet_at(f"{f.key}{suffix}", self.state_fd)
            # the older transfer's commit, if a crash cut it short, cannot be finished any more:
            # this one may rewrite the .part files it would place
            unlink_quiet_at(f"{old.transfer_id}.commit.json", self.state_fd)
            unlink_quiet_at(f"{old.transfer_id}.live", self.state_fd)
            unlink_quiet_at(f"{old.transfer_id}.owner", self.state_fd)
            unlink_quiet_at(entry, self.state_fd)
        return restarted

    def _write_state_file(self, name: str, data: bytes, sync: bool = True, atomic: bool = True) -> None:
        """Temp name, write, rename. `sync=False`: the caller syncs a whole batch of these at once
        (a reader of a torn or missing one treats it as absent). `atomic=False`: written in place,
        for a file no one has yet (whose torn form reads as absent)."""
        tmp = f"{name}.tmp{os.getpid()}.{threading.get_ident()}" if atomic else name
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=self.state_fd,
        )
        try:
            try:
                view = memoryview(data)
                while view:  # a short write (ENOSPC part-way) must not be renamed into place torn
                    view = view[os.write(fd, view) :]
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            if atomic:  # a full disk left the temp file behind for good
                unlink_quiet_at(tmp, self.state_fd)
            raise
        if atomic:
            os.replace(tmp, name, src_dir_fd=self.state_fd, dst_dir_fd=self.state_fd)
        if sync:
            os.fsync(self.state_fd)

    # -- finishing ------------------------------------------------------------------------------

    def write_direct(self, key: str, view: memoryview, off: int) -> int:
        """Writes what it can of `view` at `off` with O_DIRECT; returns how many bytes that was (0
        where the buffer, the offset or the file system does not allow it)."""
        whole = len(view) // ALIGN * ALIGN
        if not self._direct or whole < _DIRECT_MIN or off % ALIGN or not is_aligned(view):
            return 0
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | O_DIRECT
        try:
            fd = os.open(f"{key}.part", flags, dir_fd=self.state_fd)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._direct = False  # this file system refuses O_DIRECT: stop asking
            return 0
        done = 0
        try:
            while done < whole:
                try:
                    n = os.pwrite(fd, view[done:whole], off + done)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._direct = False  # a stricter alignment than ours: buffered from now on
                    break
                done += n
                if n == 0 or n % ALIGN:  # short and unaligned (a full disk): buffered says ENOSPC
                    break
        finally:
            os.close(fd)
        return done

    @contextlib.contextmanager
    def part(self, key: str) -> Iterator[int]:
        """A descriptor for one .part file, held only for one operation: a transfer of 100,000 files
        must not need 100,000 descriptors, and a late channel cannot write through a stale one."""
        fd = os.open(f"{key}.part", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.state_fd)
        try:
            yield fd
        finally:
            os.close(fd)

    def place_all(
        self, manifest: Manifest, overwrite: bool, known: dict[str, dict[int, bytes]] | None = None
    ) -> None:
        """Moves every verified .part of a committing transfer into place, then records it done.

        Idempotent, so a commit a crash cut short is finished by running it again: a .part that is
        gone was placed already (or by another process of this receiver a moment ago).

        In batches, so that a transfer of many small files costs a few flushes, not several per
        file: give every .part its size and mode, one sync (nothing can appear under a final name
        lacking either), link them all, write their placed records, one more sync, then the done
        marker. A few files keep the per-file fsyncs (syncfs would also flush other writers).

        `known`: the chunk digests the commit verified, by file key (its placed records take
        them; a redo reads the journals). The journal of a file whose placed record holds its
        digests (PLACED_DIGESTS_MAX) goes once the file and its record are durable in place."""
        known = known or {}
        cs = manifest.chunk_size
        # placed by an earlier transfer and untouched: a .part of its key is not ours
        todo = [entry for entry in manifest.files if self._placed_state(entry, cs) != INTACT]
        batch = len(todo) >= SYNCFS_MIN_FILES and self.syncfs()
        ready = [entry for entry in todo if self._seal(entry, sync=not batch)]
        # Each placed record is written (durably) before its file is linked, from the sealed
        # .part's stat, which the final name keeps (a link or rename moves no inode, size or
        # mtime): a receiver killed between two links leaves every file it linked recorded as
        # rq's, so another transfer naming one finds it in place, not "exists" (_placed_state
        # tells a record whose .part still waits from a placed file).
        for entry in ready:
            self._record_placed(entry, cs, self._part_stat(entry.key), not batch, known.get(entry.key))
        if batch:
            self.syncfs()
        self._open_dirs_for_placing(manifest)
        try:
            placed = self._link_all(ready, overwrite, sync=not batch)
        except (TransferError, OSError) as exc:
            # out of inodes is told before the cleanup below frees some (asked after it, statvfs
            # has inodes to give and the line said "disk is full": freeing bytes would not help)
            full = is_no_space(exc) and no_space(self.state_fd, " placing the verified files", _ALL_KEPT)
            # a file in the way (or a disk error) stopped the links: the records of the files
            # still waiting as .part claim a placement that did not happen
            for entry in ready:
                if self._exists(f"{entry.key}.part"):
                    unlink_quiet_at(_placed_name(entry.name), self.state_fd)
            if full:
                raise full from None
            raise
        for entry in todo:
            self._record_placed(entry, cs, placed.get(entry.name), not batch, known.get(entry.key))
        if batch:
            self.syncfs()
        self._drop_folded_journals(manifest.files, cs)  # a redo's earlier ones too
        self.make_dirs(manifest)
        self._set_dir_times(manifest)
        self._set_dir_modes(manifest)
        # Remember the transfer finished: a sender killed between our DONE and reading it re-runs
        # the same command and must hear "complete", not "exists".
        marker = [[f.name, f.size] for f in manifest.files]
        self._write_state_file(f"{manifest.transfer_id}.done.json", orjson.dumps(marker))
        self._forget_state(manifest)

    def _drop_folded_journals(self, entries: Sequence[FileEntry], chunk_size: int) -> None:
        """Removes the journals of placed files whose placed record holds their digests (made
        durable before this by the caller). Not synced: a journal a crash brings back is a
        duplicate of what the record says, and _prune removes it."""
        for entry in entries:
            if entry.chunks(chunk_size) > PLACED_DIGESTS_MAX or self._exists(f"{entry.key}.part"):
                continue
            rec = self._read_placed(entry.name)
            if rec is None or rec.get("key") != entry.key:
                continue
            if _record_digests(rec, chunk_size, entry.chunks(chunk_size)) is not None:
                unlink_quiet_at(f"{entry.key}.journal", self.state_fd)

    def _part_stat(self, key: str) -> os.stat_result | None:
        try:
            return os.stat(f"{key}.part", dir_fd=self.state_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def place(self, entry: FileEntry, overwrite: bool) -> None:
        """Moves one complete, verified .part file to its final name (place_all, for one)."""
        if self._seal(entry, sync=True):
            self._link_all([entry], overwrite, sync=True)

    def _seal(self, entry: FileEntry, sync: bool) -> bool:
        """Gives a verified .part its final size, mtime and, last, mode (fsynced if `sync`); False
        if there is no .part (placed already). A commit redone after a crash finds it sealed."""
        try:
            part = self._open_part(f"{entry.key}.part")
        except FileNotFoundError:
            return False
        try:
            with sealing(part, entry.size):  # no reservation piece runs meanwhile, nor after
                if os.fstat(part).st_size != entry.size:
                    os.ftruncate(part, entry.size)  # a zero-chunk or sparse tail still gets its size
                if entry.mtime_ns is not None:  # the source's, before it has a name (link keeps it)
                    os.utime(part, ns=(os.fstat(part).st_atime_ns, entry.mtime_ns))
                os.fchmod(part, final_mode(entry.mode))
            if sync:
                os.fsync(part)
        finally:
            os.close(part)
        return True

    def _link_all(self, entries: list[FileEntry], overwrite: bool, sync: bool) -> dict[str, os.stat_result]:
        """Links (or, with overwrite, renames) sealed .part files to their final names without
        following any link, each parent directory opened once for the files in it (and fsynced
        once, if `sync`). Returns the stat of each file it placed, by name."""
        out: dict[str, os.stat_result] = {}
        by_dir: dict[tuple[str, ...], list[tuple[FileEntry, str]]] = {}
        for entry in entries:
            parts = _components(entry.name)
            by_dir.setdefault(tuple(parts[:-1]), []).append((entry, parts[-1]))
        for dirs, group in by_dir.items():
            parent = self._open_parent(group[0][0].name, dirs)
            try:
                moved = False
                for entry, final in group:
                    if not self._link_one(entry, final, parent, overwrite):
                        continue
                    moved = True
                    with contextlib.suppress(OSError):
                        out[entry.name] = os.stat(final, dir_fd=parent, follow_symlinks=False)
                if moved and sync:
                    os.fsync(parent)
            finally:
                os.close(parent)
        return out

    def _link_one(self, entry: FileEntry, final: str, parent: int, overwrite: bool) -> bool:
        """One sealed .part to its final name in `parent`; False if another process of this
        receiver placed it a moment ago."""
        src = f"{entry.key}.part"
        try:
            if overwrite:
                os.rename(src, final, src_dir_fd=self.state_fd, dst_dir_fd=parent)
            else:
                self._link_new(entry, src, final, parent)
        except FileNotFoundError:
            if self._exists(src):
                raise
            return False
        return True

    def _open_parent(self, name: str, dirs: tuple[str, ...], sync_new: bool = False) -> int:
        """The directory a file goes into (or, for an empty directory of the manifest, that
        directory), made as needed, component by component from DEST's descriptor without following
        links. `sync_new`: fsync the parent of each directory made, so it survives a crash by itself."""
        parent = os.dup(self.fd)
        try:
            for i, comp in enumerate(dirs):
                made = False
                with contextlib.suppress(FileExistsError):
                    os.mkdir(comp, 0o755, dir_fd=parent)
                    made = True
                if made and sync_new:
                    os.fsync(parent)
                try:
                    nfd = os.open(comp, _DIR_FLAGS, dir_fd=parent)
                except OSError as exc:
                    raise _not_a_dir(parent, name, dirs[: i + 1]) from exc
                os.close(parent)
                parent = nfd
        except BaseException:
            os.close(parent)
            raise
        return parent

    def _link_new(self, entry: FileEntry, src: str, final: str, parent: int) -> None:
        try:
            os.link(src, final, src_dir_fd=self.state_fd, dst_dir_fd=parent, follow_symlinks=False)
        except FileExistsError:
            st = os.stat(final, dir_fd=parent, follow_symlinks=False)
            if not self._is_our_link(st, entry.key):
                if not self._exists(src):
                    return  # another process of this receiver placed it a moment ago
                raise ExistsError(
                    f"{display_name(entry.name)} already exists in the destination (pass --overwrite to replace it)"
                ) from None
        unlink_quiet_at(src, self.state_fd)

    def forget(self, plan: Plan) -> None:
        self._forget_state(plan.manifest)
        plan.close()

    def _forget_state(self, manifest: Manifest) -> None:
        """Drops a finished transfer's manifest and commit marker. Its done marker stays, and so do
        its journals: with the placed records they let a re-run skip the files still in place
        (their chunk digests give the sender its root digests without reading a byte)."""
        tid = manifest.transfer_id
        for name in [f"{tid}.manifest.json", f"{tid}.commit.json", f"{tid}.live", f"{tid}.owner"]:
            unlink_quiet_at(name, self.state_fd)
        os.fsync(self.state_fd)
