"""The resume journal: one append-only file per partial file, under DEST/.rq-partial/<key>.journal.

    header  = b"RQJ1" | key (16 bytes) | file size u64 | chunk size u32          (32 bytes)
    record  = chunk index u32 | xxh3-128 digest (16 bytes) | crc32 of the 20 bytes before   (24 bytes)

A record is appended only after the chunk's bytes were made durable in the .part file (fdatasync, or
one syncfs for a batch spanning many files), so the journal never claims data that a crash could
lose. The header is not synced on its own: it reaches the disk no later than the first record's
sync, and a header a crash lost or tore only makes the journal read as new (nothing to resume). Records are written with O_APPEND in one write
each batch, so several receiver processes can share a journal; a torn record (a crash inside that
write, or a disk that filled during it) fails its CRC and is skipped, costing one resent chunk, and
the reader finds the records appended after it by sliding on until a CRC holds.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib

HEAD = struct.Struct("!4s16sQI")
REC = struct.Struct("!I16sI")
MAGIC = b"RQJ1"


def header_bytes(key: str, size: int, chunk_size: int) -> bytes:
    return HEAD.pack(MAGIC, bytes.fromhex(key), size, chunk_size)


def record_bytes(index: int, digest: bytes) -> bytes:
    head = struct.pack("!I16s", index, digest)
    return head + struct.pack("!I", zlib.crc32(head))


def parse(data: bytes, key: str, size: int, chunk_size: int, chunks: int) -> dict[int, bytes] | None:
    """Chunk index → digest from a journal's bytes; None if the header is for another file version."""
    if len(data) < HEAD.size or data[: HEAD.size] != header_bytes(key, size, chunk_size):
        return None
    have: dict[int, bytes] = {}
    off = HEAD.size
    while off + REC.size <= len(data):
        index, dig, crc = REC.unpack_from(data, off)
        if zlib.crc32(data[off : off + 20]) != crc or index >= chunks:
            # torn or damaged: that chunk is sent again. A torn record is shorter than REC.size
            # and later appends follow it, so look for the next record a byte further on
            off += 1
            continue
        have[index] = dig
        off += REC.size
    return have


def recorded(dir_fd: int, name: str, key: str, size: int, chunk_size: int, chunks: int) -> dict[int, bytes]:
    """A journal's records, read without creating or resetting it ({} if absent or another version's)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return {}
    try:
        return parse(_read_all(fd), key, size, chunk_size, chunks) or {}
    finally:
        os.close(fd)


class Journal:
    """One file's journal (relative to the state directory's descriptor). It holds no descriptor open
    between calls, so a transfer of 100,000 files needs no more than a handful at any time."""

    def __init__(
        self, dir_fd: int, name: str, key: str, size: int, chunk_size: int, chunks: int, fresh: bool = False
    ):
        """`fresh`: the caller knows no journal of this name holds anything (it just removed it
        with the .part file): write the header without reading first."""
        self._args = (key, size, chunk_size, chunks)
        self.name = name
        self.dir_fd = dir_fd
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_TRUNC if fresh else 0)
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
        try:
            have = None if fresh else parse(_read_all(fd), *self._args)
            if have is None:  # new, or left by another version of the file: start over
                if not fresh:
                    os.ftruncate(fd, 0)
                # no fsync: the first append's sync carries the header too (see the module doc)
                os.pwrite(fd, header_bytes(key, size, chunk_size), 0)
                have = {}
        finally:
            os.close(fd)
        self.initial = have

    def reload(self) -> dict[int, bytes]:
        """Everything recorded so far, including records other processes appended."""
        return recorded(self.dir_fd, self.name, *self._args)

    def append(self, records: list[tuple[int, bytes]], sync: bool = True) -> None:
        """Appends records (whose chunks are durable already). `sync=False`: the caller makes a
        whole batch of journals durable at once (one syncfs) before it counts any record."""
        if not records:
            return
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.name, flags, dir_fd=self.dir_fd)
        try:
            # a write cut short (the disk filled mid-way) is retried for the rest, which raises
            # ENOSPC: the caller must not count records that did not reach the disk
            view = memoryview(b"".join(record_bytes(k, d) for k, d in records))
            while view:
                n = os.write(fd, view)
                if n == 0:  # never for a regular file; a loop for ever if it were
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[n:]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)


class KnownDigests:
    """The digests of a file placed earlier, kept in its placed record instead of a journal
    (store.PLACED_DIGESTS_MAX): what a Journal gives a plan for such a file, with no file of its
    own. Nothing is ever appended: every chunk of a placed file is there."""

    def __init__(self, name: str, digests: dict[int, bytes]):
        self.name = name
        self.initial = digests

    def reload(self) -> dict[int, bytes]:
        return dict(self.initial)

    def append(self, records: list[tuple[int, bytes]], sync: bool = True) -> None:
        if records:
            raise ValueError(f"{self.name}: a placed file takes no chunks")


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0) if size else b""
