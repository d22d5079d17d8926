"""Writing one object into a tier: temp name, digests as bytes arrive, verify, fsync, rename.

Nothing is ever visible under a final name before it is complete, verified and durable.
Big objects arrive as ranged pieces written at their offsets; a journal next to the partial file
records each piece only after its bytes reached the file (and its xxh3, re-checked on resume, so a
piece torn by a power cut is fetched again), so a killed preload resumes from the journal.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cache.digests import (
    MIB,
    PIECE_SIZE,
    PieceHash,
    b64_crc,
    composite_crc32_matches,
    crc32,
    file_digest,
    hash_range,
    tree_digest,
    whole_crc32,
)
from cache.directio import ALIGN, CHUNK, open_direct, pwrite_all, write_aligned, write_behind
from cache.errors import BusyError, ChangedError, FileSystemFullError, VerifyError
from cache.index import Entry
from cache.layout import PRIVATE, Layout
from cache.sizes import no_space_under
from cache.store import fsync_dir, is_no_space, libc_function, lock_twin, unlink_quiet

_serial = itertools.count()
_HEX32 = re.compile(r"[0-9a-fA-F]{32}")
_buffers = threading.local()  # per-thread reusable buffers: fresh memory is slow to touch here


def _md5() -> Any:
    import hashlib  # plain-MD5 ETags only; its OpenSSL load costs every start ~2 ms

    return hashlib.md5(usedforsecurity=False)


@dataclass(frozen=True)
class ObjectInfo:
    """What an origin says about one object: enough to fetch it and to know its version."""

    url: str
    key: str  # path relative to the source prefix; used for --include/--exclude
    size: int
    version: str
    etag: str | None = None  # S3 ETag without quotes
    # set by a listing for what it found but cannot offer (an unreadable directory): reported as a
    # failure of its own, never fetched
    problem: str | None = None
    problem_kind: str = "denied"  # the failure kind it is reported as (cache.errors.KINDS, "bad_name")

    @property
    def plain_md5(self) -> str | None:
        """The ETag when it is an MD5 of the body (single-part upload, no SSE-KMS style suffix)."""
        etag = self.etag
        # (one regex match: a generator over its 32 characters was ~2% of a small-object
        # preload's Python time, py-spy)
        if etag and _HEX32.fullmatch(etag):
            return etag.lower()
        return None


@dataclass
class Checksums:
    """Full-object checksums an S3 response carried (x-amz-checksum-*)."""

    crc32: str | None = None
    crc32c: str | None = None
    composite: bool = False
    etag: str | None = None

    @classmethod
    def from_headers(cls, headers: list[tuple[str, str]]) -> Checksums:
        out = cls()
        for name, value in headers:
            low = name.lower()
            if low == "x-amz-checksum-crc32":
                out.crc32 = value
            elif low == "x-amz-checksum-crc32c":
                out.crc32c = value
            elif low == "x-amz-checksum-type":
                out.composite = value.upper() == "COMPOSITE"
            elif low == "etag":
                out.etag = value.strip('"')
        if out.crc32 and "-" in out.crc32:
            out.composite = True
        if out.crc32c and "-" in out.crc32c:
            out.composite = True
        return out


def _crc32c(data: memoryview | bytes, prev: int = 0) -> int:
    from awscrt import checksums

    return int(checksums.crc32c(data, prev))


RACY = ";racy"
"""Appended to an entry's version when its file was read too soon after it was last changed: a
write after the read may leave every stat field as it was (same tick). Such an entry never equals
a stat's version, so code that only compares versions refetches it; Cache.open and Cache.path
re-hash the origin file instead (Cache._racy_still_same) and drop the mark once it is old enough."""

RACY_WINDOW_NS = 3_000_000_000
"""How close to a read a file's mtime or ctime makes the read racy: 2 s, the coarsest timestamp
tick rq meets (FAT; whole seconds on ext4 with 128-byte inodes, NFSv3, SMB), and 1 s for the clock
of a file server running behind this host's (a server further behind defeats the check, as it
defeats git's, make's and rsync's)."""


def clean_version(version: str) -> str:
    """The version without its racy mark: what a stat of an unchanged origin file says."""
    return version[: -len(RACY)] if version.endswith(RACY) else version


def is_racy(version: str) -> bool:
    return version.endswith(RACY)


def racy_at(version: str, read_at_ns: int) -> bool:
    """Whether a directory entry of `version` whose bytes were read from `read_at_ns` on (wall
    clock) cannot be trusted on stat alone: its ctime lies within RACY_WINDOW_NS before that
    moment, or after it. Only the kernel sets a ctime, and any write moves it to "now"; an mtime
    is anybody's (`touch -d`, `cp -p`, tar), so a file stamped in the future by one was racy until
    that date, hashed again on every open. A version without a ctime (the format before
    ino/ctime were added) counts its mtime."""
    if not version.startswith("mtime:"):
        return False
    fields = dict(f.split(":", 1) for f in clean_version(version).split(";") if ":" in f)
    try:
        changed = int(fields["ctime"] if "ctime" in fields else fields.get("mtime", "0"))
    except ValueError:
        return True  # unreadable: trust nothing about it
    return changed >= read_at_ns - RACY_WINDOW_NS


@dataclass
class Landing:
    """One object on its way into a tier. `write` may be called from any thread. A whole object's
    bytes arrive in order and are hashed as they come; a big object's pieces arrive in any order,
    each piece in order, and each piece is hashed on its own (see cache.digests)."""

    layout: Layout
    tier: str
    info: ObjectInfo
    blob: str
    hold_id: int
    pieces: int = 1  # > 1: ranged, resumable download
    piece_size: int = PIECE_SIZE
    on_bytes: Callable[[int], None] | None = None
    checksums: Checksums = field(default_factory=Checksums)
    done_pieces: set[int] = field(default_factory=set)
    durable: bool = True  # fsync before rename; False trusts digests alone (see docs/cache.md)
    batch_dir_sync: bool = False  # the caller fsyncs objects/xx/ once per batch, before the index commit
    keep_open: bool = False  # hand back a read fd with a shared lock (a reader who asked for it)
    # finish() only verifies; the caller makes a whole batch durable at once (syncfs) and then calls
    # publish() for each, so a final name still only ever appears over bytes already on disk
    defer_publish: bool = False

    def __post_init__(self) -> None:
        self.fd = -1
        # whole objects: named when first needed (most land as unnamed O_TMPFILE files, and making
        # the Path, a getpid and a counter per object was a measurable part of the main thread)
        self._tmp: Path | None = (
            None if self.pieces == 1 else self.layout.tmp_path(self.tier, self.blob, ".part")
        )
        self.final = self.layout.blob_path(self.tier, self.blob)
        self._lock = threading.Lock()
        self._whole = PieceHash()
        self._md5: Any = None  # made by _hash_whole when no CRC header came (a plain-MD5 ETag)
        self._md5_want = self.info.plain_md5 if self.pieces == 1 else None
        self._running: dict[int, PieceHash] = {}
        self._piece_results: dict[int, tuple[str, list[int]]] = {}
        self._crc_kind: str | None = None
        self._crc = 0
        self._external = False
        self._anon = False  # an unnamed O_TMPFILE file (external_file): no temp name to remove
        self._rfd = -1
        self._dfd = -1
        self.kept_fd = -1
        self.placed = False  # our file became the final name (not a twin another process landed)
        self._writes: dict[int, list[Future[None]]] = {}  # piece -> its writes still on their way
        self._closed = False  # a late CRT callback after _close must not reopen (truncate) the file
        self._active = 0  # write() calls in progress: _close waits for them before closing fds
        # made only when _close must wait for a write() in progress (rare): a Condition per object
        # was a measurable part of a small-object preload's main thread
        self._idle: threading.Condition | None = None
        # (directory origins) when its bytes were first read, wall clock ns: racy_at decides
        self._read_at_ns: int | None = None
        if self.pieces == 1:
            return  # the file is created by the first write(), or by the origin (external_file)
        try:
            self.fd = self._create(os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW)
            self._lock_partial()
            if self.journal.exists():
                self._read_journal()
            else:
                os.ftruncate(self.fd, 0)
                # reserve blocks up front so a full disk shows now, not after half the pieces
                try:
                    os.posix_fallocate(self.fd, 0, self.info.size)
                except OSError:
                    # empty and ours (we hold its lock): left behind, it would keep a hold and a
                    # stray file after the full disk that stops the run
                    unlink_quiet(self.tmp)
                    raise
            if self.durable:
                self._dfd = open_direct(self.tmp)
        except OSError as exc:
            self._close()
            self._no_space_or_raise(exc)
            raise

    @property
    def tmp(self) -> Path:
        """The temp file's name. Whole-object downloads never share one, even when two processes
        fetch one URL (pid and a counter in the name)."""
        if self._tmp is None:
            self._tmp = self.layout.tmp_path(self.tier, self.blob, f".{os.getpid()}.{next(_serial)}.part")
        return self._tmp

    @property
    def journal(self) -> Path:
        """A big object's journal (whole objects have none: no Path made for them)."""
        return self.layout.tmp_path(self.tier, self.blob, ".journal")

    def external_file(self) -> str:
        """The path an origin that writes the whole body itself (the CRT's recv_filepath: no Python
        per chunk) opens; the file is hashed and verified by reading it back in finish().

        The file is created here, not by the CRT: allocating an inode is the slow part of opening
        (~0.3 ms on ext4 here), and os.open releases the GIL while the CRT's fopen inside
        make_request holds it, stalling the CRT's own event loop thread (profiled). Where the file
        system can, it is an unnamed O_TMPFILE file, opened read-write: the CRT writes it through
        /proc/self/fd/N, the read-back and publish() use the same descriptor, and publish() links
        it under its final name (linkat, which never clobbers a twin) with no temp name to remove.
        Per object that spares an open, a close and an unlink, and the temp directory's lock,
        which the unlinks waited for (spinning) behind the creates' inode allocation; and a
        killed run leaves nothing in tmp/. Elsewhere a named temp file, as before, and in the RAM
        tier too: Store.room counts what RAM landings in flight have written by their temp files'
        names (a tmpfs fills up, and other processes' landings must be seen)."""
        self._external = True
        if self.tier != "ram" and (tmp_dir := _anon_dir(self.layout, self.tier)) is not None:
            try:
                fd = os.open(tmp_dir, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                if exc.errno not in _NO_TMPFILE:
                    self._no_space_or_raise(exc)
                    raise
                _anon_dirs[tmp_dir] = False  # (a file system without O_TMPFILE)
            else:
                self._rfd, self._anon = fd, True
                return f"/proc/self/fd/{fd}"
        try:
            os.close(self._create(os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW))
        except OSError as exc:
            self._no_space_or_raise(exc)
            raise
        return str(self.tmp)

    def _open_stream(self) -> None:
        try:
            self.fd = self._create(os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            self._no_space_or_raise(exc)
            raise

    def _create(self, flags: int) -> int:
        """Opens (creates) the temp file. A RAM tier whose tmp/ alone was removed while this
        process runs (a tmp cleaner sweeping /dev/shm) gets it back, private, and the open is tried
        once more: every later RAM landing of a long preload failed on the missing directory. A
        RAM root gone whole is Cache._ensure_ram_root's (its lock and entries go with it)."""
        try:
            return os.open(self.tmp, flags, 0o644)
        except FileNotFoundError:
            tmp_dir = self.tmp.parent
            if self.tier != "ram" or not tmp_dir.parent.is_dir():
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(tmp_dir, 0o700)
            return os.open(self.tmp, flags, 0o644)

    def _lock_partial(self) -> None:
        """One writer per resumable partial file, across processes; the lock dies with the process."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fd, self.fd = self.fd, -1
            os.close(fd)
            raise BusyError(f"{self.info.url} is being fetched by another process") from None

    def _share_partial_lock(self) -> None:
        """The partial's writer lock, exclusive -> shared. flock converts by dropping and taking
        again, so another writer may slip in between; it then owns the partial and we step back."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BusyError(f"{self.info.url} is being fetched by another process") from None

    # --- bytes in ------------------------------------------------------------------------------

    def on_headers(self, headers: list[tuple[str, str]]) -> None:
        if self.pieces == 1:
            self.checksums = Checksums.from_headers(headers)
            if self.checksums.crc32 and not self.checksums.composite:
                self._crc_kind = "crc32"
            elif self.checksums.crc32c and not self.checksums.composite:
                self._crc_kind = "crc32c"

    def write(self, chunk: memoryview | bytes, offset: int, inline: bool = False) -> None:
        """`inline`: the chunk sits in a page-aligned buffer the caller reuses once this returns,
        and the caller is a worker thread that may block on the disk: write it here, around the page
        cache, rather than copy it for a writer thread."""
        with self._lock:
            if self._closed:
                return  # a cancelled request's last callback, after the landing was given up
            self._active += 1  # _close now waits for this call before it closes any descriptor
        try:
            self._write(memoryview(chunk), offset, inline)
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0 and self._idle is not None:
                    self._idle.notify_all()

    def _write(self, view: memoryview, offset: int, inline: bool) -> None:
        if self.fd < 0:
            if self.pieces > 1:
                return  # never reopen a shared partial: O_TRUNC would wipe it
            self._open_stream()  # whole objects: bytes come from one thread, in order
        try:
            if self._dfd >= 0 and offset % ALIGN == 0 and inline:
                write_aligned(self._dfd, self.fd, view, offset)
            elif self._dfd >= 0 and offset % ALIGN == 0:
                # around the page cache, on writer threads, a pooled buffer at a time; piece_done
                # (and _close) wait for them
                writes = [
                    write_behind().submit(self._dfd, self.fd, view[pos : pos + CHUNK], offset + pos)
                    for pos in range(0, len(view), CHUNK)
                ]
                with self._lock:
                    self._writes.setdefault(offset // self.piece_size, []).extend(writes)
            else:
                pwrite_all(self.fd, view, offset)
        except OSError as exc:
            self._no_space_or_raise(exc)
            raise
        if self.pieces == 1:
            self._hash_whole(view, offset)
        else:
            index = offset // self.piece_size
            with self._lock:
                run = self._running.get(index)
                if run is None:
                    run = self._running[index] = PieceHash(index * self.piece_size)
            if offset != run.next:
                run.broken = True
            elif not run.broken:
                run.update(view)
        if self.on_bytes:
            self.on_bytes(len(view))

    def _hash_whole(self, view: memoryview, offset: int) -> None:
        run = self._whole
        if offset != run.next or run.broken:
            run.broken = True  # re-hashed from the file at the end
            return
        run.next += len(view)
        run.xxh.update(view)
        if self._crc_kind == "crc32":
            self._crc = crc32(view, self._crc)
        elif self._crc_kind == "crc32c":
            self._crc = _crc32c(view, self._crc)
        elif self._md5_want is not None:
            if self._md5 is None:
                self._md5 = _md5()
            self._md5.update(view)

    def piece_done(self, index: int) -> None:
        """A ranged piece is complete: record it, with its digests, in the journal.

        No fsync here: a kill -9 loses nothing the kernel already has, and after a power cut every
        journalled piece is re-hashed against its recorded xxh3 before it is trusted, so a torn
        piece is fetched again. Writeback of the piece is started now (sync_file_range) so the
        fsync before publishing the whole object finds little left to write."""
        start = index * self.piece_size
        length = min(self.piece_size, self.info.size - start)
        with self._lock:
            writes = self._writes.pop(index, [])
        futures.wait(writes)  # all of them, even after a failure: none may outlive its descriptor
        for pending in writes:
            exc = pending.exception()
            if isinstance(exc, OSError):
                self._no_space_or_raise(exc)
            if exc is not None:
                raise exc
        with self._lock:
            run = self._running.pop(index, None)
        if run is None or run.broken or run.next != start + length:
            result = hash_range(self.fd_read(), start, length)
        else:
            result = run.close()
        if self.durable and self._dfd < 0:
            start_writeback(self.fd, start, length)
        with self._lock:
            self._piece_results[index] = result
            self.done_pieces.add(index)
            with open(self.journal, "a", encoding="ascii") as fh:
                crcs = ",".join(f"{c:08x}" for c in result[1])
                fh.write(f"{self.info.version}\t{index}\t{result[0]}\t{crcs}\n")

    def open_fd(self) -> int:
        """A descriptor this landing holds open on its file (-1: none), for syncfs of its tier."""
        return next((fd for fd in (self.kept_fd, self.fd, self._rfd) if fd >= 0), -1)

    def fd_read(self) -> int:
        """A read fd on the partial file (the write fd is O_WRONLY); cached for the landing's life."""
        if self._rfd < 0:
            self._rfd = os.open(self.tmp, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        return self._rfd

    def _read_journal(self) -> None:
        try:
            lines = self.journal.read_text(encoding="ascii", errors="replace").splitlines()
        except OSError:
            return
        for line in lines:
            fields = line.split("\t")
            if len(fields) != 4 or fields[0] != self.info.version or not fields[1].isdigit():
                continue  # a torn last line, or a journal of another version
            index = int(fields[1])
            start = index * self.piece_size
            if start >= self.info.size:
                continue
            result = hash_range(self.fd_read(), start, min(self.piece_size, self.info.size - start))
            if result[0] == fields[2]:
                self._piece_results[index] = result
                self.done_pieces.add(index)
                self._read_at_ns = 0  # read by an earlier run, when is not known: take it as racy

    def note_read(self, when_ns: int) -> None:
        """A directory origin is about to read this object's bytes (or a piece's): the entry is
        racy if the file changed within RACY_WINDOW_NS of the earliest such moment."""
        with self._lock:
            if self._read_at_ns is None or when_ns < self._read_at_ns:
                self._read_at_ns = when_ns

    def _version(self) -> str:
        version = self.info.version
        read_at = self._read_at_ns
        if read_at is not None and not is_racy(version) and racy_at(version, read_at):
            return version + RACY
        return version

    # --- finishing -----------------------------------------------------------------------------

    def finish(self) -> Entry:
        """Verifies, fsyncs and renames; returns the entry to put in the index. Raises VerifyError."""
        try:
            if self.fd < 0:
                if not self._external and self.info.size == 0:
                    self._open_stream()  # an empty object: no write() ever came
                else:
                    # the origin wrote the file: one read fd serves the read-back, which also
                    # finds its size (no fstat), and then publish() as the reader's lock
                    self.fd = self.fd_read()
            if not (self._external and self.pieces == 1):
                size = os.fstat(self.fd).st_size
                if size != self.info.size:
                    raise VerifyError(f"{self.info.url}: got {size} bytes, expected {self.info.size}")
            if self.checksums.etag and self.info.etag and self.checksums.etag != self.info.etag:
                raise ChangedError(f"{self.info.url}: object changed while it was read (ETag moved)")
            if self.pieces == 1:
                digest, verified = self._verify_whole()
            else:
                digest, verified = self._verify_pieces()
            if self.durable and not self.defer_publish:
                os.fsync(self.fd)
        except BaseException:
            self.abort()
            raise
        if not self.defer_publish:
            self.publish(digest)
        t = time.time()
        return Entry(
            url=self.info.url,
            version=self._version(),
            size=self.info.size,
            tier=self.tier,
            blob=self.blob,
            xxh3=digest,
            verified_by=verified,
            last_access=t,
            checked_at=t,
            created=t,
        )

    def publish(self, digest: str) -> None:
        """Puts the verified (and, when durable, synced) temp file under its final name."""
        try:
            # locked before the link: from its first moment under the final name the file is "open
            # by a reader" until the index names it (the caller then releases it, or hands it to the
            # reader that asked, keep_open), so no remover of an older row naming the same file
            # (names are fixed per URL and version) can unlink it before our row goes in
            if self._rfd >= 0 and self._rfd == self.fd:
                # the read-back's descriptor (a file the origin wrote): it becomes the kept one
                # rather than a second open of the same file
                self.kept_fd, self.fd, self._rfd = self.fd, -1, -1
            else:
                self.kept_fd = os.open(self.tmp, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            if self.pieces > 1:
                # our own writer's lock (_lock_partial) is exclusive, and flock locks of two
                # descriptors conflict even in one process: make it shared first, or the
                # reader's lock below waits for ever (it did, for every big read-through miss)
                self._share_partial_lock()
            fcntl.flock(self.kept_fd, fcntl.LOCK_SH)
            # rename while the partial's lock is still held, so no other writer can pick it up
            self._publish(digest)
            if self.durable and not self.batch_dir_sync:
                fsync_dir(self.final.parent)
        except BusyError:  # another writer took the partial over: it is theirs to finish
            self.release_kept()
            self._close()
            raise
        except OSError as exc:
            self.abort()
            self._no_space_or_raise(exc)
            raise
        if self.pieces > 1:
            unlink_quiet(self.journal)
        self._close()

    def _publish(self, digest: str) -> None:
        """Puts the verified temp file under its final name without clobbering a twin: another
        process may have landed the same URL and version a moment ago (a reader may hold it open).
        link() fails if the name exists; then an identical file is kept and ours dropped, and only
        a damaged one is replaced. The twin is locked first (lock_twin): one a remover is
        unlinking is waited out, never adopted."""
        while True:
            try:
                if self._anon:
                    _link_anon(self.kept_fd, self.final)
                else:
                    _link(self.tmp, self.final)
            except FileExistsError:
                pass
            else:
                self.placed = True
                if not self._anon:
                    os.unlink(self.tmp)
                return
            # the twin, locked: one being evicted is waited out (its name then is free again)
            twin = lock_twin(self.final)
            if twin >= 0:
                break
        if os.fstat(twin).st_size == self.info.size and file_digest(twin, self.info.size) == digest:
            ours, self.kept_fd = self.kept_fd, twin  # the twin is kept (and locked) in place of ours
            os.close(ours)
            if not self._anon:
                unlink_quiet(self.tmp)
            return
        try:
            if self._anon:  # (rename needs a name: give ours one first)
                unlink_quiet(self.tmp)
                _link_anon(self.kept_fd, self.tmp)
                self._anon = False
            os.rename(self.tmp, self.final)  # a damaged twin: no remover can be at it, we lock it
        finally:
            os.close(twin)
        self.placed = True

    def _verify_whole(self) -> tuple[str, str]:
        if self._external:
            # written by the origin itself: hash it by reading it back (from the page cache: it
            # was just written), to its end, which is also the size check
            size = self._read_back()
            if self.on_bytes:
                self.on_bytes(size)  # (the origin reports no progress of its own)
            if size != self.info.size:
                raise VerifyError(f"{self.info.url}: got {size} bytes, expected {self.info.size}")
        elif self._whole.broken:
            self._read_back()  # delivered out of order
        if self._whole.next != self.info.size:
            raise VerifyError(f"{self.info.url}: got {self._whole.next} bytes, expected {self.info.size}")
        digest = self._whole.xxh.hexdigest()
        if self._crc_kind is not None:
            want = self.checksums.crc32 if self._crc_kind == "crc32" else self.checksums.crc32c
            if b64_crc(self._crc) != want:
                raise VerifyError(f"{self.info.url}: {self._crc_kind} mismatch (body corrupted in transit)")
            return digest, f"size+{self._crc_kind}"
        if self._md5_want is not None:
            if (self._md5 or _md5()).hexdigest() != self._md5_want:
                raise VerifyError(f"{self.info.url}: MD5 does not match the ETag (body corrupted in transit)")
            return digest, "size+md5"
        return digest, "size+mtime" if self.info.version.startswith("mtime:") else "size"

    def _read_back(self) -> int:
        """Hashes the whole temp file from its start; returns its size (it is read to its end: a
        read on a regular file that returns less than asked has met the end)."""
        if self._whole.next or self._whole.broken:
            self._whole = PieceHash()
            self._crc = 0
            self._md5 = None
        buf = _read_buffer()
        fd, want, off = self.fd_read(), self.info.size, 0
        while True:
            # one byte more than expected: a longer file is seen without another call
            ask = min(len(buf), want + 1 - off) if off <= want else len(buf)
            n = os.preadv(fd, [buf[:ask]], off)
            if n == 0:
                return off
            if off + n <= want:
                self._hash_whole(buf[:n], off)
            off += n
            if n < ask:
                return off

    def _verify_pieces(self) -> tuple[str, str]:
        count = -(-self.info.size // self.piece_size)
        missing = [i for i in range(count) if i not in self._piece_results]
        if missing:
            raise VerifyError(f"{self.info.url}: pieces {missing[:5]} never arrived")
        results = [self._piece_results[i] for i in range(count)]
        digest = tree_digest([r[0] for r in results])
        blocks = [c for r in results for c in r[1]]
        verified = "size"
        cs = self.checksums
        if cs.crc32 and cs.composite:
            if not composite_crc32_matches(blocks, self.info.size, cs.crc32):
                raise VerifyError(f"{self.info.url}: composite CRC32 does not match (corrupted in transit)")
            verified = "size+crc32-composite"
        elif cs.crc32:
            if b64_crc(whole_crc32(blocks, self.info.size)) != cs.crc32:
                raise VerifyError(f"{self.info.url}: CRC32 does not match (corrupted in transit)")
            verified = "size+crc32"
        elif self.info.plain_md5:
            md5 = _md5()
            buf = memoryview(bytearray(MIB))
            off = 0
            while off < self.info.size:
                n = os.preadv(self.fd_read(), [buf[: min(MIB, self.info.size - off)]], off)
                md5.update(buf[:n])
                off += n
            if md5.hexdigest() != self.info.plain_md5:
                raise VerifyError(f"{self.info.url}: MD5 does not match the ETag (corrupted in transit)")
            verified = "size+md5"
        elif self.info.version.startswith("mtime:"):
            verified = "size+mtime"
        return digest, verified

    # Each descriptor is closed once: -1 goes in before the close, so that a second call (abort
    # after an interrupt landed between a close and its "= -1") closes nothing. A second close
    # could close a descriptor another thread had just been given the same number for.

    def release_kept(self) -> None:
        fd, self.kept_fd = self.kept_fd, -1
        if fd >= 0:
            os.close(fd)

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            while self._active:  # a write() still running may be about to use a descriptor
                if self._idle is None:
                    self._idle = threading.Condition(self._lock)
                self._idle.wait()
            writes = [w for ws in self._writes.values() for w in ws]
            self._writes.clear()
        futures.wait(writes)  # never close a descriptor a writer thread is still using
        dfd, self._dfd = self._dfd, -1
        if dfd >= 0:
            os.close(dfd)
        rfd, self._rfd = self._rfd, -1
        if rfd >= 0 and rfd != self.fd:
            os.close(rfd)
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def abort(self) -> None:
        """Gives up on this landing: nothing under the final name, no partial file left."""
        self.release_kept()
        if not self._anon and (self.pieces == 1 or self.fd >= 0):
            unlink_quiet(self.tmp)  # (a partial: while still holding its lock)
        if self.fd >= 0 and self.pieces > 1:
            unlink_quiet(self.journal)
        self._close()

    def keep_for_resume(self) -> None:
        """Stops without deleting: the journal and partial file let the next run continue."""
        self._close()

    def _no_space_or_raise(self, exc: OSError) -> None:
        if is_no_space(exc):
            raise FileSystemFullError(
                no_space_under(self.layout.tier_root(self.tier), exc, f" writing {self.info.url}")
            ) from exc


_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Asks the kernel to start writing a range to disk without waiting (Linux sync_file_range);
    a no-op where that call is missing. Durability still comes from the fsync before publishing."""
    global _sync_file_range
    if _sync_file_range is None:
        import ctypes

        _sync_file_range = libc_function(
            "sync_file_range", ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint
        )
    if _sync_file_range:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


_sync_file_range: Any = None


def _link(src: Path | str, dst: Path, src_fd: int | None = None) -> None:
    """link(2), making the parent (objects/xx/, 0700 whatever the umask: the cache is one user's)
    only when it is missing: asking first would cost a mkdir and a stat per object, and another
    process may clear the cache under us at any time. `src_fd`: see _link_anon."""
    for attempt in (0, 1):
        try:
            if src_fd is None:
                os.link(src, dst)
            else:
                os.link(src, dst, src_dir_fd=src_fd, follow_symlinks=True)
            return
        except FileNotFoundError:
            if attempt:
                raise
            with contextlib.suppress(FileExistsError):  # (its parent gone: the link's error stands)
                os.mkdir(dst.parent, PRIVATE)


# errnos of an O_TMPFILE open on a file system (or kernel) without it; the named temp file then
_NO_TMPFILE = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOSYS)
_anon_dirs: dict[str, bool] = {}  # temp directory -> whether O_TMPFILE may be tried there


_tmp_dirs: dict[tuple[Layout, str], str] = {}  # (layout, tier) -> its tmp/ directory, as a string


def _anon_dir(layout: Layout, tier: str) -> str | None:
    """The tier's tmp/ directory when O_TMPFILE may be tried there, else None."""
    directory = _tmp_dirs.get((layout, tier))
    if directory is None:
        directory = _tmp_dirs[(layout, tier)] = str(layout.tmp_path(tier, "x", "").parent)
    ok = _anon_dirs.get(directory)
    if ok is None:
        # /proc/self/fd is how the CRT opens the file and how it is linked: no /proc, no O_TMPFILE
        ok = _anon_dirs[directory] = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")
    return directory if ok else None


def _link_anon(fd: int, dst: Path) -> None:
    """linkat(2) of an O_TMPFILE file through its /proc/self/fd link (AT_SYMLINK_FOLLOW; plain
    link() would link the magic link itself and fail with EXDEV). os.link calls linkat only when
    given a directory fd: the file's own, which an absolute path makes the kernel ignore. Like
    _link, it fails with FileExistsError where the name is taken, and makes objects/xx/ when missing."""
    _link(f"/proc/self/fd/{fd}", dst, fd)


def _read_buffer() -> memoryview:
    """One 1 MiB read buffer per thread, reused: fresh memory is slow to touch in this VM."""
    buf = getattr(_buffers, "buf", None)
    if buf is None:
        buf = _buffers.buf = memoryview(bytearray(MIB))
    return buf


def piece_ranges(size: int, piece_size: int) -> list[tuple[int, int]]:
    """(start, end inclusive) byte ranges of each piece."""
    return [(off, min(off + piece_size, size) - 1) for off in range(0, size, piece_size)]
