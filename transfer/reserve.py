"""Reserving a file's space before its chunks arrive: fallocate(2), through ctypes.

Python's os.posix_fallocate is glibc's, which on a file system without fallocate (NFSv3, some FUSE)
"emulates" it by writing a byte into every block: minutes for a 50 GB checkpoint over NFS. The
system call itself just says EOPNOTSUPP there, and the transfer goes on without a reservation.
"""

from __future__ import annotations

import ctypes
import errno
import os

_libc: ctypes.CDLL | None = None


def reserve(fd: int, size: int) -> bool:
    """Allocates `size` bytes for the file behind `fd` (mode 0: holes get blocks, the size becomes
    at least `size`, data already written stays). Best effort: False where the file system cannot
    reserve or has no room — a full disk is reported by the write that finds it full, which keeps
    the chunks verified before it (the receiver's usual disk-full path)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fallocate = _libc.fallocate
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if fallocate(fd, 0, 0, size) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))
