"""Process-wide memory settings for the CLI's hot paths (a library must not change them)."""

from __future__ import annotations

import contextlib


def keep_freed_heap() -> None:
    """Stops glibc from handing freed memory back to the OS after every batch.

    With the default 128 KiB trim threshold, each rendered batch of JSON lines was freed, trimmed
    and faulted back in for the next one: ~1 page fault per record, 40% of `replay --format json`'s
    time on this VM (fresh memory is slow here, FIELD-NOTES). Likewise each 1 MiB stdin chunk and
    encoded batch of `produce` was a fresh mmap (116k faults per 1M records; 7k with this).
    `preload`: the CRT hands each 8 MiB part of a big object to Python as a fresh bytes object,
    which was a fresh mmap, zeroed and faulted in, per part (perf: ~10% of the run).
    Process-wide, so it lives in the CLI, not the library. A no-op where libc is not glibc.
    """
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
        libc.mallopt(-2, 16 << 20)  # M_TOP_PAD
        libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD: batch-sized buffers come from the reused heap
