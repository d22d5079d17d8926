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


# Buffers of at least this many bytes past `lead` are backed by transparent huge pages where the
# kernel allows it (MADV_HUGEPAGE; "madvise" mode is common): the byte at `lead` then starts a huge
# page. Measured (docs/transfer.md): pinning a 4 MiB chunk's pages for an O_DIRECT write, and the
# socket's copy into it, walk 1,024 page-table entries per chunk with 4 KiB pages and 2 with huge ones.
HUGE = 2 << 20
_MADV_HUGEPAGE: int | None = getattr(mmap, "MADV_HUGEPAGE", None)


def buffer(size: int, lead: int = 0) -> memoryview:
    """`size` bytes of anonymous memory starting `lead` bytes before a page boundary (so that the
    byte at `lead` is aligned: a frame's payload after its header). From HUGE bytes past `lead`
    on, the payload starts on a huge-page boundary and its huge pages are asked for."""
    if _MADV_HUGEPAGE is None or size - lead < HUGE:
        pad = -lead % ALIGN
        return memoryview(mmap.mmap(-1, pad + size))[pad:]
    # room to slide the payload onto a HUGE boundary, and for its last huge page to lie whole
    # inside the mapping; what is never touched costs address space only
    mem = mmap.mmap(-1, size + 2 * HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = _address(mem)
    start = -(base + lead) % HUGE + lead  # offset of the payload: (base + start) % HUGE == 0
    payload = -(-(size - lead) // HUGE) * HUGE
    try:
        mem.madvise(_MADV_HUGEPAGE, start, payload)
    except OSError:
        pass  # no THP here: plain pages, as below HUGE
    return memoryview(mem)[start - lead : start - lead + size]


def _address(mem: mmap.mmap) -> int:
    c = ctypes.c_char.from_buffer(mem)
    try:
        return ctypes.addressof(c)
    finally:
        del c


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
