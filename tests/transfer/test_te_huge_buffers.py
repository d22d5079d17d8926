"""Chunk-sized aligned buffers (the TCP receiver's frame bodies, the sender's O_DIRECT reads) are
private memory advised for transparent huge pages, the payload starting on a huge page: an O_DIRECT
write then pins 2 huge pages per 4 MiB chunk instead of 1,024 small ones (docs/transfer.md)."""

from __future__ import annotations

import ctypes
import mmap
import sys

import pytest

from transfer import aligned
from transfer.frames import CHUNK

HUGE = 2 << 20  # a huge page on x86-64 and most arm64 kernels

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"), reason="Linux THP advice"
)


def _address(view: memoryview) -> int:
    c = ctypes.c_char.from_buffer(view)
    try:
        return ctypes.addressof(c)
    finally:
        del c


def _vm_flags(addr: int) -> set[str]:
    """The VmFlags of the mapping of this process that holds `addr`."""
    inside = False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_a_chunk_buffer_starts_its_payload_on_a_huge_page_advised_for_them() -> None:
    lead = CHUNK.size
    size = (4 << 20) + lead
    view = aligned.buffer(size, lead=lead)
    assert len(view) == size
    payload = view[lead:]
    addr = _address(payload)
    assert addr % HUGE == 0
    assert aligned.is_aligned(payload)
    flags = _vm_flags(addr)
    assert "hg" in flags  # MADV_HUGEPAGE
    assert "sh" not in flags  # private: shared anonymous memory is tmpfs, never huge here
    payload[:] = b"\x5a" * len(payload)  # the whole payload is writable
    view[:lead] = b"\x01" * lead
    assert payload[0] == 0x5A and payload[-1] == 0x5A and view[0] == 1


def test_an_odd_size_keeps_its_length_and_page_alignment() -> None:
    lead = CHUNK.size
    for size in (HUGE + 1 + lead, (3 << 20) + 12345, (64 << 20) + lead):
        view = aligned.buffer(size, lead=lead)
        assert len(view) == size
        assert _address(view[lead:]) % aligned.ALIGN == 0
        view[-1] = 7
        assert view[-1] == 7


def test_small_buffers_stay_page_aligned() -> None:
    for size, lead in ((64 * 1024, CHUNK.size), (4096, 0), (HUGE - 1, 0)):
        view = aligned.buffer(size, lead=lead)
        assert len(view) == size
        assert _address(view[lead:]) % aligned.ALIGN == 0
