"""Page-aligned buffers, for reading and writing around the page cache (O_DIRECT).

Measured here (docs/transfer.md): the page cache's fresh pages are what makes big files slow on
this kind of VM — buffered writes of 4 GiB spent 7-11 s of system time, buffered reads of an
uncached 4 GiB file 4 s — while O_DIRECT from a reused aligned buffer runs at the disk's speed.
"""

from __future__ import annotations

import ctypes
import mmap
import os

# O_DIRECT wants block-aligned offsets, lengths and buffers; a whole page covers common disks.
ALIGN = max(4096, mmap.PAGESIZE)
O_DIRECT: int = getattr(os, "O_DIRECT", 0)


def buffer(size: int, lead: int = 0) -> memoryview:
    """`size` bytes of anonymous memory starting `lead` bytes before a page boundary (so that the
    byte at `lead` is aligned: a frame's payload after its header)."""
    pad = -lead % ALIGN
    return memoryview(mmap.mmap(-1, pad + size))[pad:]


def is_aligned(view: memoryview) -> bool:
    """True if the buffer starts on an ALIGN boundary (read-only buffers report False: ctypes can
    only take the address of a writable one, and those come from decoders, never aligned)."""
    try:
        c = ctypes.c_char.from_buffer(view)
    except (TypeError, ValueError):
        return False
    try:
        return ctypes.addressof(c) % ALIGN == 0
    finally:
        del c  # releases the export, so the owner may resize its buffer again
