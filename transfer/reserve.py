"""Reserving a file's space before its chunks arrive: fallocate(2), through ctypes.

Python's os.posix_fallocate is glibc's, which on a file system without fallocate (NFSv3, some FUSE)
"emulates" it by writing a byte into every block: minutes for a 50 GB checkpoint over NFS. The
system call itself just says EOPNOTSUPP there, and the transfer goes on without a reservation.

On tmpfs the reservation runs in a thread of its own (Reservation), beside the first chunks.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import threading
from collections.abc import Iterator
from typing import Any

# Reservations never take the last of a file system: journals, manifests and everyone else on it
# need room, and a sender (holding the token) must not be able to fill the disk with a manifest
# alone. This much stays free: 5% of the file system, at most 1 GiB.
_MARGIN_SHARE = 20
_MARGIN_MAX = 1 << 30

# tmpfs (statfs f_type): reserving a file there allocates every page of it, ~0.35 s for 4 GiB here
# (ext4 takes milliseconds: extents only), which held up the sender's ACCEPT. So on tmpfs it runs
# in a thread, in pieces, while the first chunks arrive (Reservation). A failed tmpfs fallocate
# gives back what that call allocated itself: there is nothing to undo that would race the writes.
TMPFS_MAGIC = 0x01021994
RESERVE_PIECE = 64 << 20  # one fallocate each: the inode lock it holds delays a chunk's write briefly
# Files smaller than this go down in a write or two: nothing to gain from reserving them first.
RESERVE_MIN = 1 << 20

_libc: Any = None


def _calls() -> Any:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        libc.fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
        _libc = libc
    return _libc


def fs_magic(fd: int) -> int | None:
    """The file system type of `fd` (statfs f_type: TMPFS_MAGIC, 0xEF53 for ext4, …), or None."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if _calls().fstatfs(fd, buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def in_memory(fd: int) -> bool:
    """True if `fd` is on tmpfs (/dev/shm)."""
    return fs_magic(fd) == TMPFS_MAGIC


def _need(fd: int, size: int) -> int:
    """Bytes the file behind `fd` still lacks to hold `size` bytes: the whole file counted, so
    that chunks written anywhere in it (a resumed transfer's tail) are counted once, where they are."""
    return size - os.fstat(fd).st_blocks * 512


def _keeps_margin(fd: int, need: int) -> bool:
    """Whether the file system keeps its margin free once `need` more bytes are allocated."""
    vfs = os.fstatvfs(fd)
    margin = min(vfs.f_blocks * vfs.f_frsize // _MARGIN_SHARE, _MARGIN_MAX)
    return need <= vfs.f_bavail * vfs.f_frsize - margin


def reserve(fd: int, size: int) -> bool:
    """Allocates `size` bytes for the file behind `fd` (mode 0: holes get blocks, the size becomes
    at least `size`, data already written stays), if the file system keeps its margin free after
    it. Best effort: False where it does not fit or the file system cannot reserve. A failed
    call is undone (ext4 keeps what a failing fallocate got: the disk would be full before a
    chunk arrived). A full disk is then reported by the write that finds it, keeping the chunks
    verified before it."""
    st_size = os.fstat(fd).st_size
    if not _keeps_margin(fd, _need(fd, size)):
        return False
    if _calls().fallocate(fd, 0, 0, size) == 0:
        return True
    if st_size < size:
        os.ftruncate(fd, st_size)  # gives back the blocks past the old end that the call got
    return False


@contextlib.contextmanager
def sealing(fd: int, size: int) -> Iterator[None]:
    """Held by a commit while it gives a .part its final size, mtime and mode (store's _seal):
    an exclusive flock that waits for a Reservation's piece in flight, in any process, and makes
    every later one pass the file by. On tmpfs a fallocate inside the file moves its mtime, so one
    after the seal would overwrite the source's mtime just applied. Files too small to be
    reserved (under RESERVE_MIN) are not locked: a transfer of 50,000 small files pays nothing."""
    if size < RESERVE_MIN:
        yield
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


class Reservation:
    """Reserves tmpfs files in a thread of its own, RESERVE_PIECE by piece from the start, while
    their chunks are written (a piece already written costs nothing to reserve). It holds one
    descriptor of its own (the state directory's) and the file it is reserving: a manifest of
    10,000 big shards must not hold 10,000 open files.

    It stops (stop(), checked before each piece) when its plan closes or commits: a plan that
    will not commit must not go on taking memory (Ctrl-C, a failed transfer holding the
    receiver's lock), and one that commits has every chunk written, so every page allocated.
    It passes a file by for good once a commit of its transfer has begun anywhere (the commit
    marker `<tid>.commit.json`, written before any file is sealed), the file is being sealed
    (sealing(), a flock), or its .part name no longer leads to it (linked into place and
    unlinked): rq recv --workers may commit in another process whose plan never waits for this one."""

    def __init__(self, dir_fd: int, transfer_id: str) -> None:
        self._dir_fd = dir_fd
        self._marker = f"{transfer_id}.commit.json"
        self._files: list[tuple[str, int]] = []
        self._promised = 0  # bytes the queued files still lack: the margin check counts them all
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def add(self, name: str, fd: int, size: int) -> None:
        """Queues file `name` (open as `fd` for the check); nothing if the margin would not stay
        free once this and the files queued before it are reserved."""
        need = max(0, _need(fd, size))
        if self._thread is None and _keeps_margin(fd, need + self._promised):
            self._files.append((name, size))
            self._promised += need

    def start(self) -> None:
        if self._files and self._thread is None:
            # a descriptor of its own, closed by the thread: the store may close and reopen its
            # directory meanwhile, and stop() need not wait for the thread to let go of it
            own_dir = os.dup(self._dir_fd)
            thread = threading.Thread(target=self._run, args=(own_dir,), name="rq-reserve", daemon=True)
            try:
                thread.start()
            except BaseException:
                os.close(own_dir)
                raise
            self._thread = thread

    def _run(self, own_dir: int) -> None:
        try:
            for name, size in self._files:
                if self._stop.is_set():
                    return
                try:
                    fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=own_dir)
                except OSError:
                    continue  # gone (a commit, a cleanup) or sealed read-only: nothing to reserve
                try:
                    off = 0
                    while off < size and not self._stop.is_set():
                        n = min(RESERVE_PIECE, size - off)
                        if not self._piece(own_dir, name, fd, off, n, size):
                            break
                        off += n
                except OSError:
                    pass  # best effort, as reserve()
                finally:
                    os.close(fd)
        finally:
            os.close(own_dir)

    def _piece(self, own_dir: int, name: str, fd: int, off: int, n: int, size: int) -> bool:
        """One fallocate, unless the file is sealed or being sealed, or the margin would go."""
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a commit is sealing it right now
        try:
            # Under the shared lock no seal runs, and a seal that ran before wrote the marker
            # first; a commit that finished since unlinked the .part after linking it.
            if self._committing(own_dir, name, fd):
                return False
            # others may have taken room since add(): the whole file's need keeps the margin again
            # (the piece alone would count chunks written past it as if they filled it)
            if not _keeps_margin(fd, _need(fd, size)):
                return False  # no room after all: the writes report a full disk, as without one
            return bool(_calls().fallocate(fd, 0, off, n) == 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _committing(self, own_dir: int, name: str, fd: int) -> bool:
        try:
            os.stat(self._marker, dir_fd=own_dir, follow_symlinks=False)
            return True
        except FileNotFoundError:
            pass
        try:
            at = os.stat(name, dir_fd=own_dir, follow_symlinks=False)
        except FileNotFoundError:
            return True
        st = os.fstat(fd)
        return (at.st_dev, at.st_ino) != (st.st_dev, st.st_ino)

    def wait(self) -> None:
        """Waits until every queued file is reserved (or passed by)."""
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        """Idempotent; after it returns no fallocate of this reservation runs. Waits for the
        piece in flight, if any (one RESERVE_PIECE), not for the files still queued."""
        self._stop.set()
        self.wait()
        self._thread = None
        self._files = []
