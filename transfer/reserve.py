"""Reserving a file's space before its chunks arrive: fallocate(2), through ctypes.

Python's os.posix_fallocate is glibc's, which on a file system without fallocate (NFSv3, some FUSE)
"emulates" it by writing a byte into every block: minutes for a 50 GB checkpoint over NFS. The
system call itself just says EOPNOTSUPP there, and the transfer goes on without a reservation.
"""

from __future__ import annotations

import ctypes
import os

_libc: ctypes.CDLL | None = None

# Reservations never take the last of a file system: journals, manifests and everyone else on it
# need room, and a sender (holding the token) must not be able to fill the disk with a manifest
# alone. This much stays free: 5% of the file system, at most 1 GiB.
_MARGIN_SHARE = 20
_MARGIN_MAX = 1 << 30


def reserve(fd: int, size: int) -> bool:
    """Allocates `size` bytes for the file behind `fd` (mode 0: holes get blocks, the size becomes
    at least `size`, data already written stays), if the file system keeps its margin free after
    it. Best effort: False where it does not fit or the file system cannot reserve. A failed
    call is undone (ext4 keeps what a failing fallocate got: the disk would be full before a
    chunk arrived). A full disk is then reported by the write that finds it, keeping the chunks
    verified before it."""
    global _libc
    st = os.fstat(fd)
    vfs = os.fstatvfs(fd)
    free = vfs.f_bavail * vfs.f_frsize
    margin = min(vfs.f_blocks * vfs.f_frsize // _MARGIN_SHARE, _MARGIN_MAX)
    if size - st.st_blocks * 512 > free - margin:
        return False
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fallocate = _libc.fallocate
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if fallocate(fd, 0, 0, size) == 0:
        return True
    if st.st_size < size:
        os.ftruncate(fd, st.st_size)  # gives back the blocks past the old end that the call got
    return False
