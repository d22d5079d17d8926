"""Writing big objects' pieces around the page cache (O_DIRECT), off the thread that received them.

Measured here (docs/cache.md): buffered writes of 1 GiB spent 1-3.7 s of system time faulting in
page-cache pages this VM had never touched, and the fsync after them ran at 0.3-1.5 GB/s; O_DIRECT
from a reused aligned buffer wrote at a steady 1.6 GB/s. Done on the CRT's event-loop threads, those
writes still kept the threads off the network for ~0.8 s per GiB; `WriteBehind` hands them to a few
writer threads so the event loop goes straight back to its sockets.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

# O_DIRECT wants block-aligned offsets, lengths and buffers; 4 KiB covers common disks, and a whole
# page keeps O_DIRECT blocks and a buffered tail out of one page on 64 KiB-page machines
ALIGN = max(4096, mmap.PAGESIZE)
CHUNK = 8 << 20  # one pooled buffer: the CRT delivers big objects' bodies in 8 MiB parts
_BUFFERS = 12  # at most 96 MiB of parts waiting for the disk per process
_WRITERS = 4


def open_direct(path: Path, mode: int = os.O_WRONLY) -> int:
    """An O_DIRECT fd on a temp file; -1 where the file system refuses it (tmpfs, some FUSE and
    network file systems), and then the caller uses its buffered fd."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return -1
    try:
        return os.open(path, mode | flag | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return -1


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        if n == 0:  # never for a regular file with room; do not spin if it happens
            raise OSError(errno.EIO, "write made no progress")
        data = data[n:]
        offset += n


def aligned_buffer(size: int = CHUNK) -> memoryview:
    """A page-aligned anonymous buffer, zeroed (not copied) in a forked child."""
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # A forked DataLoader worker must not turn 96 MiB of warm buffers copy-on-write for the parent.
    # WIPEONFORK, not DONTFORK: the child still owns valid (zeroed) pages there, so the mmap objects it
    # inherited can be freed safely (with DONTFORK their munmap could hit a new mapping in the gap).
    with contextlib.suppress(OSError, ValueError):
        buf.madvise(_MADV_WIPEONFORK)
    return memoryview(buf)


_MADV_WIPEONFORK = 18  # Linux >= 4.14; Python's mmap module does not name it


class WriteBehind:
    """Copies a chunk into a pooled page-aligned buffer and writes it on a writer thread: whole
    blocks through the O_DIRECT fd, an unaligned tail through the buffered one. `submit` blocks
    only when every buffer is waiting for the disk, which is the back-pressure the CRT needs.

    Buffers are reused (LIFO, so the warmest first): fresh memory is slow to touch on this VM."""

    def __init__(self) -> None:
        self._free: queue.LifoQueue[memoryview] = queue.LifoQueue()
        self._made = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(_WRITERS, thread_name_prefix="rq-write")

    def _take(self) -> memoryview:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            with self._lock:
                if self._made < _BUFFERS:
                    self._made += 1
                    return aligned_buffer()
            return self._free.get()

    def submit(self, dfd: int, fd: int, data: memoryview, offset: int) -> Future[None]:
        """Caller guarantees: offset is ALIGN-aligned and len(data) <= CHUNK."""
        buf = self._take()
        buf[: len(data)] = data
        try:
            return self._pool.submit(self._write, buf, dfd, fd, len(data), offset)
        except BaseException:  # (interpreter shutdown): the buffer must not be lost to the pool
            self._free.put(buf)
            raise

    def _write(self, buf: memoryview, dfd: int, fd: int, length: int, offset: int) -> None:
        try:
            write_aligned(dfd, fd, buf[:length], offset)
        finally:
            self._free.put(buf)


def write_aligned(dfd: int, fd: int, data: memoryview, offset: int) -> None:
    """Writes `data` (in a page-aligned buffer, at an ALIGN-aligned offset): its whole blocks through
    the O_DIRECT fd `dfd`, an unaligned tail through the buffered `fd`."""
    whole = len(data) // ALIGN * ALIGN
    done = 0
    while done < whole:
        n = os.pwrite(dfd, data[done:whole], offset + done)
        done += n
        # a short, unaligned O_DIRECT write: the rest goes buffered, where a full disk says
        # ENOSPC instead of EINVAL
        if n == 0 or n % ALIGN:
            break
    if len(data) > done:
        pwrite_all(fd, data[done:], offset + done)


_instance: WriteBehind | None = None
_instance_pid = 0
_instance_lock = threading.Lock()


def _forget_after_fork() -> None:
    # the parent's writer threads do not exist in the child (its buffers are there, wiped to zero),
    # and the lock may have been held by one of the parent's threads at the moment of the fork
    global _instance, _instance_lock
    _instance = None
    _instance_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def write_behind() -> WriteBehind:
    """The process's WriteBehind; a forked child (a DataLoader worker) builds its own, since the
    parent's writer threads did not survive the fork."""
    global _instance, _instance_pid
    with _instance_lock:
        if _instance is None or _instance_pid != os.getpid():
            _instance = WriteBehind()
            _instance_pid = os.getpid()
        return _instance
