"""glibc malloc settings for rq's own short-lived, buffer-heavy processes (never for a library user's).

The CRT grows a response buffer per small object (a few hundred KiB) on its event-loop thread and
frees it when the object is written. With glibc's defaults that memory goes back to the kernel
almost every time (the per-thread heap is trimmed above 128 KiB–1 MiB free at its top, and a
buffer over the moving mmap threshold is unmapped), so the next object faults the same pages in
again: ~100,000 page faults, and their munmap/madvise, were ~15% of a 2,000-object preload's CPU
(perf). Keeping freed memory in the heap up to a bound cuts the faults to ~25,000.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 8 << 20  # below this, from the heap (reused); above, mmap (given back at free)
TRIM_THRESHOLD = 32 << 20  # free memory a heap keeps at its top before giving it back


def is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):
        return False


def keep_freed_memory() -> bool:
    """Sets the two thresholds; False where this is not glibc or it refused. Each thread's heap may
    then keep up to TRIM_THRESHOLD of freed memory: no change in peak RSS with the CRT's one
    event-loop thread here; ~100 MiB more with 16-32 of them (an independent review's runs)."""
    if not is_glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; setting either one also stops glibc's dynamic adjustment
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
