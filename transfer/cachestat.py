"""How much of a file range the page cache holds: cachestat(2), Linux 6.5+, through ctypes.

Python's os module does not wrap it, and the alternative (mmap + mincore per range) costs two
more syscalls and a mapping per chunk.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform

# System calls added since Linux 5.1 share one number on every architecture but alpha.
_NR_CACHESTAT = 451


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        ("nr_cache", ctypes.c_uint64),
        ("nr_dirty", ctypes.c_uint64),
        ("nr_writeback", ctypes.c_uint64),
        ("nr_evicted", ctypes.c_uint64),
        ("nr_recently_evicted", ctypes.c_uint64),
    ]


_libc: ctypes.CDLL | None = None
_works: bool | None = None


def _call(fd: int, off: int, length: int) -> _Stat | None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    rng, st = _Range(off, length), _Stat()
    if _libc.syscall(_NR_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(st), 0) != 0:
        return None
    return st


def available() -> bool:
    """True where the kernel answers cachestat (asked once per process)."""
    global _works
    if _works is None:
        _works = False
        if platform.system() == "Linux":
            fd = os.open("/proc/self/exe", os.O_RDONLY | os.O_CLOEXEC)
            try:
                _works = _call(fd, 0, 1) is not None
            finally:
                os.close(fd)
    return _works


def all_cached(fd: int, off: int, length: int) -> bool:
    """True if every page of [off, off+length) is in the page cache (or the answer is unknown:
    then the caller reads through the cache, as it would without this check)."""
    st = _call(fd, off, length)
    if st is None:
        return True
    first, last = off // mmap.PAGESIZE, (off + length - 1) // mmap.PAGESIZE
    return st.nr_cache >= last - first + 1
