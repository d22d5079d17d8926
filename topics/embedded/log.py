"""The embedded log: one directory per topic, append-only segments, one writer and many readers.

    <topic>/topic.json                 config (segment size, retention)
    <topic>/writer.lock                flock(2) held by the one writer
    <topic>/00000000000000000000.log   segment: batches of records (format.py)
    <topic>/00000000000000000000.idx   sparse offset/time index of that segment (rebuildable)
    <topic>/groups/<group>.json        committed consumer-group offsets (groups.py)

Durability: a batch is written and fdatasync'ed before `append` returns, and only then is it indexed,
so an acknowledged batch survives kill -9 and power loss. The writer's open checks the last batches of
the newest segment and truncates a torn tail (a batch cut short: all a crash can leave); readers
verify every batch's CRC and never return a record that fails it. A full-length batch that fails its
CRC, even the newest, is corruption, never truncated, unless nothing but zeros follows its header to
the end of the file (its header reached the disk and its records did not: a torn write). Corruption is raised as CorruptRecord with its offset, or skipped
(and reported through `on_corrupt`) when the reader is asked to.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import fcntl
import itertools
import mmap
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from topics.embedded import format as fmt
from topics.embedded.files import fsync_dir, make_dirs, not_writable, write_atomic
from topics.embedded.groups import GroupStore
from topics.errors import (
    AppendedPartly,
    AppendInterrupted,
    CorruptRecord,
    RecordTooLarge,
    SpecError,
    TopicError,
    TopicNotFound,
    Unsupported,
    WriterBusy,
    as_int,
    offset_arg,
)
from topics.record import Record

_SEGMENT = re.compile(r"^(\d{20})\.log$")
_INDEX = re.compile(r"^(\d{20})\.idx$")
MAX_OFFSET = 2**63 - 1  # (int64: what JetStream, Kafka and every reader of offsets take)
CONFIG_NAME = "topic.json"
TOPIC_FORMAT = 1
"""topic.json's "format": the layout of a topic directory (segments, index, groups) this rq reads
and writes. A topic of a newer format is refused, for reading and for writing, in one line
(Unsupported: rq exit 10), never read or appended to as this one; a topic.json without it is
format 1 (every rq wrote it). Keys of topic.json this rq does not know are ignored: a later rq
adds one without raising the format only when an older rq may ignore it."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# A record stamped further ahead of the writer's clock than this is refused (Kafka 4.0's default
# for log.message.timestamp.after.max.ms): stamps never decrease, so one record stamped in 3000
# stamped every later record of the topic in 3000 and time ranges could not find them.
MAX_AHEAD_MS = 3_600_000


@dataclass
class TopicConfig:
    segment_bytes: int = 128 * 1024 * 1024
    retention_bytes: int | None = None  # total size above which the oldest segments are deleted
    retention_ms: int | None = None  # segments whose newest record is older than this are deleted

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """The checks `load` makes, for a config given in code: one a later writer would refuse
        (segment_bytes 0, a float) or that deletes what was acknowledged (retention_ms 0 or
        negative) is refused (SpecError) before anything is written."""
        for name in ("segment_bytes", "retention_bytes", "retention_ms"):
            value = getattr(self, name)
            optional = name != "segment_bytes"
            if not ((value is None and optional) or (type(value) is int and value > 0)):
                raise SpecError(f"TopicConfig: {name} must be a positive integer, not {value!r}")

    @classmethod
    def load(cls, directory: Path) -> TopicConfig:
        data = _read_config(directory)
        if data is None:
            return cls()
        known = {k: data[k] for k in ("segment_bytes", "retention_bytes", "retention_ms") if k in data}
        for name, value in known.items():
            optional = name != "segment_bytes"
            if not ((value is None and optional) or (type(value) is int and value > 0)):
                raise TopicError(
                    f"{directory / CONFIG_NAME}: {name} must be a positive integer, not {value!r}"
                )
        return cls(**known)

    def save(self, directory: Path) -> None:
        self.check()  # (changed since it was made?)
        write_atomic(directory / CONFIG_NAME, orjson.dumps({"format": TOPIC_FORMAT, **asdict(self)}))


def _read_config(directory: Path) -> dict[str, Any] | None:
    """topic.json as an object (None if there is none), once its format is one this rq knows."""
    path = directory / CONFIG_NAME
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError as exc:
        raise TopicError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TopicError(f"{path} is not a topic config (a JSON object)")
    form = data.get("format", 1)
    if type(form) is not int or form < 1:
        raise TopicError(f"{path}: format must be a positive integer, not {form!r}")
    if form > TOPIC_FORMAT:
        raise Unsupported(
            f"topic {directory} has format {form}, newer than this rq understands "
            f"(it knows {TOPIC_FORMAT}): upgrade rq to read or write it"
        )
    return data


@dataclass
class CorruptRange:
    """Records a reader skipped: offsets first..last (last may be unknown: -1), where they sat."""

    first: int
    last: int
    segment: str
    position: int


class _View:
    """A read-only mapping of one segment, remapped when the file grows (or shrinks).

    A mapped page past the file's end raises SIGBUS when touched, and a new writer truncates a
    torn tail under readers' feet. So the map is read only below `stable`: the end of batches seen
    whole in the file, which no writer ever cuts (recovery keeps every batch with a valid header
    and all its bytes). Anything past it is read with pread, which returns short instead.
    """

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        self.mm: mmap.mmap | None = None
        self.size = 0
        self.stable = 0
        self.refresh()

    def refresh(self) -> int:
        size = os.fstat(self.fd).st_size
        if size != self.size:
            if self.mm is not None:
                self.mm.close()
            self.mm = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ) if size else None
            if self.mm is not None:
                with contextlib.suppress(OSError, AttributeError):
                    self.mm.madvise(mmap.MADV_WILLNEED)
            self.size = size
            self.stable = min(self.stable, size)  # only a hand-made truncation shrinks it
        return size

    @property
    def buf(self) -> Any:
        return self.mm if self.mm is not None else b""

    def header(self, pos: int) -> fmt.BatchHeader | None:
        """The valid batch header at pos, or None."""
        if pos + fmt.BATCH_SIZE <= self.stable:
            return fmt.read_batch_header(self.buf, pos)
        return fmt.read_batch_header(os.pread(self.fd, fmt.BATCH_SIZE, pos), 0)

    def whole(self, pos: int, hdr: fmt.BatchHeader) -> int:
        """The end of the batch at pos when all of it is in the file now (it is then mapped and
        stable), else -1."""
        extent = pos + fmt.BATCH_SIZE + hdr.payload_len
        if extent <= self.stable:
            return extent
        if extent > os.fstat(self.fd).st_size or self.zeros_from(pos + fmt.BATCH_SIZE):
            return -1
        if extent > self.size:
            self.refresh()
        self.stable = extent
        return extent

    def zeros_from(self, pos: int) -> bool:
        """True when the bytes from pos to the end of the file are all zeros (read with pread:
        they are not stable). After a valid batch header, that is a header that reached the disk
        while its records did not (a power cut, the file's size already extended): a real
        record's length field is never 0, so only such a torn write makes the first 4 zeros."""
        if os.pread(self.fd, 4, pos) != b"\0\0\0\0":
            return False
        end = os.fstat(self.fd).st_size
        while pos < end:
            part = os.pread(self.fd, min(end - pos, 1 << 20), pos)
            if not part:
                break  # cut shorter meanwhile
            if part.count(0) != len(part):
                return False
            pos += len(part)
        return True

    def copy(self, pos: int, end: int) -> bytes:
        """Bytes pos..end (fewer if the file is shorter now): a private copy to search unstable
        bytes (a tail that is torn, damaged or being written) without touching the map."""
        parts: list[bytes] = []
        while pos < end:
            part = os.pread(self.fd, min(end - pos, 1 << 24), pos)
            if not part:
                break
            parts.append(part)
            pos += len(part)
        return b"".join(parts)

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _list_segments(directory: Path) -> list[int]:
    """The segments' bases, oldest first: named by their `.log` (an index is a hint of one and
    says nothing of whether it is there)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        raise TopicNotFound(f"topic directory {directory} is gone") from None
    # A name past the offsets a log holds (20 digits reach 99999999999999999999) is not one of its
    # segments: the writer failed on it ("argument out of range"), readers passed it over.
    return sorted(b for n in names if (m := _SEGMENT.match(n)) and (b := int(m.group(1))) <= MAX_OFFSET)


def _load_index(directory: Path, base: int, size: int) -> tuple[list[int], list[int], list[int]]:
    """(offsets, positions, first timestamps) of the index entries that point inside the segment."""
    try:
        data = (directory / fmt.index_name(base)).read_bytes()
    except FileNotFoundError:
        return [], [], []
    offsets: list[int] = []
    positions: list[int] = []
    stamps: list[int] = []
    usable = len(data) - len(data) % fmt.INDEX_SIZE
    for off, pos, ts in fmt.INDEX.iter_unpack(data[:usable]):
        if pos + fmt.BATCH_SIZE > size or (offsets and (off <= offsets[-1] or pos <= positions[-1])):
            break  # an entry past a truncated tail, or garbage: the rest is not trusted
        offsets.append(off)
        positions.append(pos)
        stamps.append(ts)
    return offsets, positions, stamps


def _hint(
    view: _View,
    size: int,
    index: tuple[list[int], list[int], list[int]],
    j: int,
    before: tuple[int, int] = (2**64, 2**63),
) -> tuple[int, int, int] | None:
    """(offset, position, first timestamp) of index entry j, or of the nearest entry before it that
    checks out: the index is a hint (not synced, never trusted blindly), so an entry counts only if
    a whole batch starts at its position with its offset and timestamp, and they are at most /
    before `before` (offset, timestamp: a damaged entry may have misled the bisection). None: scan
    from the start."""
    offsets, positions, stamps = index
    while j >= 0:
        off, pos, ts = offsets[j], positions[j], stamps[j]
        hdr = view.header(pos)
        if (
            off <= before[0]
            and ts < before[1]
            and hdr is not None
            and (hdr.base, hdr.first_ts) == (off, ts)
            and pos + fmt.BATCH_SIZE + hdr.payload_len <= size
        ):
            return off, pos, ts
        j -= 1
    return None


def _find_next_header(buf: Any, start: int, size: int) -> tuple[int, fmt.BatchHeader] | None:
    """The next valid batch header after a damaged spot (its position and header), if any."""
    pos = start
    while True:
        pos = buf.find(fmt.MAGIC, pos, size)
        if pos < 0:
            return None
        hdr = fmt.read_batch_header(buf, pos)
        if hdr is not None and pos + fmt.BATCH_SIZE + hdr.payload_len <= size:
            return pos, hdr
        pos += 1


def _payload_ok(buf: Any, pos: int, hdr: fmt.BatchHeader) -> bool:
    start = pos + fmt.BATCH_SIZE
    view = memoryview(buf)
    try:
        return zlib.crc32(view[start : start + hdr.payload_len]) == hdr.payload_crc
    finally:
        view.release()


def _all_zero(buf: Any, start: int, end: int) -> bool:
    return buf[start:end].count(0) == end - start


def _framed_by_records(buf: Any, pos: int, size: int) -> tuple[fmt.BatchHeader, int] | None:
    """A batch whose header is damaged, framed by its records instead: (a header rebuilt from
    them, the batch's end) when the records after the header frame exactly, each passing its CRC,
    up to the header's payload length or the end of the file. None when they do not."""
    if size - pos < fmt.BATCH_SIZE:
        return None
    raw = fmt.BATCH.unpack_from(buf, pos)
    start = pos + fmt.BATCH_SIZE
    for end in dict.fromkeys((start + raw[3], size)):
        if not start < end <= size:
            continue
        good, bad = fmt.check_records(buf, start, end)
        offsets = [r[0] for r in good]
        if not bad and good and offsets == list(range(offsets[0], offsets[0] + len(offsets))):
            hdr = fmt.BatchHeader(offsets[0], len(good), end - start, good[0][1], good[-1][1], raw[6])
            return hdr, end
    return None


def _tail_kind(buf: Any, pos: int, size: int) -> str:
    """What the bytes from pos to the end of the newest segment are, when no batch frames there
    and no valid batch follows.

    'torn': a write cut short (the file ends before the batch's declared length, or inside its
    header: kill -9 or a crash mid-pwrite leaves a prefix of the batch), or zeros after at most a
    header's worth of bytes (a file extended without its data reaching the disk). Never
    acknowledged: truncated by the writer, not served.
    'framed': a full-length batch whose header is damaged; its records frame it.
    'damaged': anything else. A crash cannot leave a full-length batch with bad contents, so this
    is damage to acknowledged data: reported, never truncated.
    """
    if size - pos < fmt.BATCH_SIZE or _all_zero(buf, pos + fmt.BATCH_SIZE, size):
        return "torn"  # a real batch's records (a length field >= 32 each) are never all zeros
    if fmt.read_batch_header(buf, pos) is not None:
        return "torn"  # a valid header whose batch runs past the end of the file
    return "framed" if _framed_by_records(buf, pos, size) is not None else "damaged"


def _walk(view: _View, size: int, pos: int, end: int, last_ts: int) -> tuple[int, int, int, str]:
    """Walks the batches of the newest segment from pos (a batch start) to where the log ends:
    (that position, the end offset, the newest timestamp, what lies from there to the end of the
    file: 'end' nothing, 'torn' a torn tail (see _tail_kind), 'damaged' damage that cannot be
    framed). Damage in the middle is stepped over here; readers report it. The writer and
    end_offset both walk with this, so they agree on where the log ends."""
    while pos < size:
        hdr = view.header(pos)
        if hdr is not None:
            extent = pos + fmt.BATCH_SIZE + hdr.payload_len
            if extent > size or view.zeros_from(pos + fmt.BATCH_SIZE):
                # A valid header whose batch runs past the end of the file: a write cut short.
                # Nothing inside its declared length is searched for headers: a record value may
                # hold bytes laid out like a batch (an rq segment produced with --format raw).
                # Or one followed by nothing but zeros to the end of the file, however long:
                # its records never reached the disk (see _View.zeros_from).
                return pos, end, last_ts, "torn"
        else:
            gap = _read_gap(view.copy(pos, size))
            if gap[2] is not None:
                hdr, extent = gap[2], pos + gap[3]
            else:
                return pos, end, last_ts, ("torn" if gap[0] == "torn" else "damaged")
        end, last_ts = hdr.end, hdr.max_ts
        pos = extent
    return pos, end, last_ts, "end"


def _read_gap(data: bytes) -> tuple[str, int, fmt.BatchHeader | None, int]:
    """What a copy of the bytes from a spot where no valid batch header sits to the end of the
    file holds: ('framed', 0, header rebuilt from its records, batch end) a batch whose header is
    damaged; ('skip', position, its header, its end) damage, then a valid batch; ('torn' or
    'damaged', 0, None, 0) nothing valid follows (see _tail_kind). Positions are in the copy."""
    size = len(data)
    # A damaged header is framed by its records before any search for the next header, which
    # could find a batch-like record value inside this very batch.
    framed = _framed_by_records(data, 0, size)
    if framed is not None:
        return "framed", 0, framed[0], framed[1]
    found = _find_next_header(data, 1, size)
    if found is not None and _payload_ok(data, *found):
        extent = found[0] + fmt.BATCH_SIZE + found[1].payload_len
        return "skip", found[0], found[1], extent  # damage in the middle: skipped here, reported by readers
    return _tail_kind(data, 0, size), 0, None, 0


def _tail_damage(base: int, pos: int, end: int, size: int) -> CorruptRecord:
    seg = fmt.segment_name(base)
    return CorruptRecord(
        f"corrupt batch at offset {end} (segment {seg}, byte {pos}): the newest segment ends in "
        f"{size - pos} damaged bytes that do not frame as a batch; not appending after them (copy "
        "the topic with `rq replay --skip-corrupt --to-topic NEW`)",
        end,
        seg,
        pos,
    )


_UNKNOWN_TS = 2**63 - 1  # a segment whose first header cannot be read


class _TimeSeek:
    """The state of a time seek walking the log: where it is, and the records since the last one
    known to be older than the time whose timestamps damage hides."""

    def __init__(self, ts: int):
        self.ts = ts
        self.expected = -1  # the next offset the walk expects (-1: not started)
        self.unknown: tuple[int, str, int] | None = None  # (offset, segment, byte) of the first

    def older(self) -> None:
        self.unknown = None  # a record older than the time: every record before it is older too

    def hidden(self, offset: int, segment: str, position: int) -> None:
        if self.unknown is None:
            self.unknown = (offset, segment, position)

    def inside(self, hdr: fmt.BatchHeader, good: list[Record], segment: str, position: int) -> int:
        """The first offset at or after the time in a batch whose first record is older and whose
        last is not; `good` are its records that passed their CRC."""
        known = {r[0]: r[1] for r in good if hdr.base <= r[0] < hdr.end}
        known[hdr.base], known[hdr.end - 1] = hdr.first_ts, hdr.max_ts  # the header's CRC holds
        for offset in range(hdr.base, hdr.end):
            ts = known.get(offset)
            if ts is None:
                self.hidden(offset, segment, position)
            elif ts < self.ts:
                self.older()
            else:
                return offset
        return hdr.end  # not reached: the last record is at or after the time

    def settle(self, offset: int) -> int:
        """The offset found, unless damaged records before it could be at or after the time."""
        if self.unknown is None:
            return offset
        first, segment, position = self.unknown
        raise CorruptRecord(
            f"corrupt record at offset {first} (segment {segment}, byte {position}): its timestamp "
            f"cannot be read, and the first record at or after {self.ts} ms may be among the damaged "
            "ones; seek by offset instead (--from N / --to N)",
            first,
            segment,
            position,
        )


def _first_ts(directory: Path, base: int) -> int:
    """The first timestamp of segment `base` (_UNKNOWN_TS: gone, empty or damaged)."""
    try:
        with open(directory / fmt.segment_name(base), "rb") as fh:
            head = fh.read(fmt.BATCH_SIZE)
    except FileNotFoundError:
        return _UNKNOWN_TS
    hdr = fmt.read_batch_header(head, 0)
    return hdr.first_ts if hdr is not None else _UNKNOWN_TS


class TopicLog:
    """Read-side handle of one topic directory. Cheap; create one per command."""

    def __init__(self, directory: Path):
        self.dir = directory
        if not (directory / CONFIG_NAME).is_file():
            raise TopicNotFound(f"topic {directory} does not exist (no {CONFIG_NAME})")
        _read_config(directory)  # a newer format is refused before a byte of it is read
        self.groups = GroupStore(directory, self.end_offset)

    def segments(self) -> list[int]:
        return _list_segments(self.dir)

    def first_offset(self) -> int:
        segs = self.segments()
        return segs[0] if segs else 0

    def end_offset(self) -> int:
        """Last offset + 1 of the complete records (a torn or in-flight tail is not counted;
        damage at the end counts as one record, see _scan_end)."""
        return self._end()[0]

    def check_end(self) -> None:
        """Raises CorruptRecord when the newest segment ends in damage that cannot be framed (lost
        acknowledged data: the writer refuses to append after it)."""
        damage = self._end()[1]
        if damage is not None:
            raise damage

    def _end(self) -> tuple[int, CorruptRecord | None]:
        segs = self.segments()
        if not segs:
            return 0, None
        base = segs[-1]
        view = _View(self.dir / fmt.segment_name(base))
        try:
            return _scan_end(self.dir, base, view)
        finally:
            view.close()

    def lost(self) -> list[tuple[int, int, str]]:
        """Offsets no reader can get, between the segments still there: (first, last, why), one
        per sealed segment that ends short of the next one's first offset (cut short inside a
        batch or at a batch boundary, or a segment file after it deleted), said as readers say it.
        Each sealed segment is walked from its last index entry that checks out."""
        segs = self.segments()
        out: list[tuple[int, int, str]] = []
        for base, nxt in itertools.pairwise(segs):
            seg = fmt.segment_name(base)
            try:
                view = _View(self.dir / seg)
            except FileNotFoundError:
                continue  # retention removed it meanwhile
            try:
                size = view.size
                index = _load_index(self.dir, base, size)
                hint = _hint(view, size, index, len(index[0]) - 1)
                end, pos = hint[:2] if hint is not None else (base, 0)
                pos, end, _, state = _walk(view, size, pos, end, 0)
            finally:
                view.close()
            if end >= nxt:
                continue
            span = f"offsets {end}..{nxt - 1}" if nxt - 1 > end else f"offset {end}"
            if state == "end":
                why = (
                    f"{span} are missing: segment {seg} ends (byte {size}) before them and the next one, "
                    f"{fmt.segment_name(nxt)}, starts at offset {nxt}; {seg} was cut short (truncated) "
                    "or a segment file after it was deleted"
                )
            elif state == "torn":
                why = f"segment {seg} is cut short (truncated at byte {size}): {span} are lost"
            else:
                why = f"corrupt batch at offset {end} (segment {seg}, byte {pos}): {span} cannot be read"
            out.append((end, nxt - 1, why))
        return out

    def offset_for_time(self, ts_ms: int) -> int:
        """First offset whose timestamp is >= ts_ms; the end offset when there is none.

        `ts_ms` is Unix time in milliseconds, an int (time.time() * 1000, rounded): a float is
        refused (SpecError), as 1700000050.0 is likelier seconds than a time in 1970.

        Damage is seen through where the CRC-checked batch headers and the good records around it
        pin the timestamps (timestamps never decrease). Where damaged records could hold that
        first offset, raises CorruptRecord rather than pick one."""
        number = as_int(ts_ms)
        if number is None:
            raise SpecError(f"offset_for_time takes Unix time in milliseconds (an int), not {ts_ms!r}")
        ts_ms = number
        segs = self.segments()
        k = self._start_segment(segs, ts_ms)
        seek = _TimeSeek(ts_ms)
        for i in range(k, len(segs)):
            found = self._seek_time_in(segs[i], seek, sealed=i < len(segs) - 1)
            if found is not None:
                return found
        return seek.settle(self.end_offset())

    def _first_ts(self, base: int) -> int:
        return _first_ts(self.dir, base)

    def _start_segment(self, segs: list[int], ts_ms: int) -> int:
        """The index of the last segment whose first record is known to be older than ts_ms (0 if
        none): where a time seek starts. Timestamps never decrease across the log, so the segments'
        first timestamps are bisected: O(log segments) heads read, not one a segment up to the
        answer. A head that cannot be read (_UNKNOWN_TS: damaged, or gone since the listing) is
        passed over for the next readable one in the range; a run of them is walked."""
        lo, hi = 0, len(segs)
        # Every readable head in [hi, n) is at or after ts_ms; the one at lo - 1 (if lo) is before.
        while lo < hi:
            mid = (lo + hi) // 2
            j, first = mid, _UNKNOWN_TS
            while j < hi and (first := self._first_ts(segs[j])) == _UNKNOWN_TS:
                j += 1
            if j == hi or first >= ts_ms:
                hi = mid  # nothing readable in [mid, j) and j's head is not before ts_ms
            else:
                lo = j + 1
        return max(lo - 1, 0)

    def _seek_time_in(self, base: int, seek: _TimeSeek, sealed: bool) -> int | None:
        """The first offset at or after the time in this segment, or None when it is not here."""
        ts_ms = seek.ts
        seg = fmt.segment_name(base)
        view = _View(self.dir / seg)
        try:
            size = view.size
            index = _load_index(self.dir, base, size)
            hint = _hint(view, size, index, bisect.bisect_left(index[2], ts_ms) - 1, (2**64, ts_ms))
            pos = 0
            if seek.expected < 0:
                seek.expected = base
            elif base > seek.expected:
                seek.hidden(seek.expected, seg, 0)  # a lost segment before this one
            if hint is not None:
                seek.expected, pos = hint[0], hint[1]
                seek.older()  # the hinted batch starts before the time (checked by _hint)
            while pos < size:
                hdr = view.header(pos)
                extent = view.whole(pos, hdr) if hdr is not None else -1
                good: list[Record] | None = None
                if extent < 0 and hdr is not None:
                    if not sealed:
                        break  # a torn or in-flight batch: not in the log yet
                    good, extent = [], size  # a batch cut short in a sealed segment: its header stays
                elif extent < 0:
                    # Bytes that are not a batch: searched in a copy (see _View).
                    data = view.copy(pos, size)
                    framed = _framed_by_records(data, 0, len(data))
                    found = _find_next_header(data, 1, len(data)) if framed is None else None
                    if framed is not None:
                        hdr, extent = framed[0], pos + framed[1]
                        good = fmt.check_records(data, fmt.BATCH_SIZE, framed[1])[0]
                    elif found is not None:
                        seek.hidden(seek.expected, seg, pos)
                        pos += found[0]
                        continue
                    else:
                        if sealed or _tail_kind(data, 0, len(data)) != "torn":
                            seek.hidden(seek.expected, seg, pos)
                        break
                assert hdr is not None
                if hdr.base > seek.expected:
                    seek.hidden(seek.expected, seg, pos)  # offsets with no batch: lost
                seek.expected = max(seek.expected, hdr.end)
                if hdr.max_ts < ts_ms:
                    seek.older()
                elif hdr.first_ts >= ts_ms:
                    return seek.settle(hdr.base)
                else:
                    if good is None:
                        start = pos + fmt.BATCH_SIZE
                        if _payload_ok(view.buf, pos, hdr):
                            good = fmt.decode_records(view.buf, start, extent)
                        else:
                            good = fmt.check_records(view.buf, start, extent)[0]
                    return seek.settle(seek.inside(hdr, good, seg, pos))
                pos = extent
            return None
        finally:
            view.close()

    def reader(
        self,
        start: int,
        stop: int | None = None,
        follow: bool = False,
        skip_corrupt: bool = False,
        on_corrupt: Callable[[CorruptRange], None] | None = None,
        poll_s: float = 0.05,
        idle_timeout: float | None = None,
        on_gap: Callable[[int, int], None] | None = None,
    ) -> LogReader:
        return LogReader(self, start, stop, follow, skip_corrupt, on_corrupt, poll_s, idle_timeout, on_gap)


def _scan_end(directory: Path, base: int, view: _View) -> tuple[int, CorruptRecord | None]:
    """The end offset of the newest segment, walked as the writer walks it, and the damage at its
    end that stops the writer, if any. Such damage counts as one record at the end offset (the
    lost batch holds at least one), so a bounded read that gets there reports it instead of
    ending quietly one short; a torn or in-flight tail is not counted."""
    size = view.size
    index = _load_index(directory, base, size)
    hint = _hint(view, size, index, len(index[0]) - 1)
    end, pos = hint[:2] if hint is not None else (base, 0)
    pos, end, _, state = _walk(view, size, pos, end, 0)
    if state == "damaged":
        return end + 1, _tail_damage(base, pos, end, size)
    return end, None


_TAIL_RELIST = 20  # polls at the end of the newest segment between two listings (see _is_last)


class LogReader:
    """Iterates record batches from `start` up to `stop` (exclusive); with follow, waits for more."""

    def __init__(
        self,
        log: TopicLog,
        start: int,
        stop: int | None,
        follow: bool,
        skip_corrupt: bool,
        on_corrupt: Callable[[CorruptRange], None] | None,
        poll_s: float,
        idle_timeout: float | None = None,
        on_gap: Callable[[int, int], None] | None = None,
    ):
        start = offset_arg("start", start)
        stop = None if stop is None else offset_arg("stop", stop)
        self.log = log
        # Offsets first..last that retention deleted before this reader got to them: told, never
        # read (a reader slower than retention, or one that starts below the first segment left).
        self.on_gap = on_gap
        self.idle_timeout = idle_timeout
        self.last_data = time.monotonic()
        self.next_offset = start
        self.stop = stop
        self.follow = follow
        self.skip_corrupt = skip_corrupt
        self.on_corrupt = on_corrupt
        self.poll_s = poll_s
        self.closed = False
        self.reported_at = (-1, -1)  # (segment, position) of unframed damage at the end, reported
        self._tail_at: tuple[int, int, int] | None = None  # where the last listing found the end
        self._tail_polls = 0  # polls there since

    def close(self) -> None:
        self.closed = True

    def __iter__(self) -> Iterator[list[Record]]:
        return self._run()

    def _open_at(self, offset: int) -> tuple[int, _View, int]:
        while True:
            segs = self.log.segments()
            while not segs:
                if not self.follow:
                    raise _EndOfLog
                time.sleep(self.poll_s)
                segs = self.log.segments()
            if offset < segs[0]:
                # retention removed the records before: start at the first still there
                self._aged_out(offset, segs[0])
                offset = segs[0]
                self.next_offset = offset
            i = max(bisect.bisect_right(segs, offset) - 1, 0)
            base = segs[i]
            view = self._open_segment(base)
            if view is None:
                continue  # deleted since the listing: list again, go on from what is left
            index = _load_index(self.log.dir, base, view.size)
            j = bisect.bisect_right(index[0], offset) - 1
            hint = _hint(view, view.size, index, j, (offset, 2**63))
            return base, view, hint[1] if hint is not None else 0

    def _open_segment(self, base: int) -> _View | None:
        """The segment's file, or None when retention deleted it after it was listed."""
        try:
            return _View(self.log.dir / fmt.segment_name(base))
        except FileNotFoundError:
            return None

    def _next_segment(self, done: int) -> tuple[int, _View] | None:
        """The segment after `done`, opened (None: the read ends in a hole that is damage). One
        deleted by retention between the listing and the open is skipped like the ones before.

        Segments are contiguous: the one after `done` starts at the read's next offset, so it is
        opened by name, with no listing (a listing costs a whole directory: O(segments) per
        segment read). Only when no file has that name is the directory listed, to find what
        follows, and whether the hole before it is retention or damage."""
        nxt = self.next_offset
        if nxt > done:
            view = self._open_segment(nxt)
            if view is not None:
                return nxt, view
        while True:
            segs = self.log.segments()
            later = segs[bisect.bisect_right(segs, done) :]
            if not later:
                return None  # the topic was emptied under the reader
            if self._lost_before(later[0], segs, done):
                return None
            if later[0] > self.next_offset:
                # a hole _lost_before did not take for damage: retention's (a report that covers
                # the hole up to the next segment, _cut_short's or _report's, moved next_offset
                # there: it is not told again)
                self._aged_out(self.next_offset, later[0])
                # told once: a segment deleted before the open below is not told again from here
                self.next_offset = later[0]
            view = self._open_segment(later[0])
            if view is not None:
                return later[0], view

    def _aged_out(self, first: int, upto: int) -> None:
        """Offsets first..upto-1 (within the read's range) are gone to retention: tell the caller."""
        last = upto - 1 if self.stop is None else min(upto, self.stop) - 1
        if last >= first and self.on_gap is not None:
            self.on_gap(first, last)

    def _run(self) -> Iterator[list[Record]]:
        stop = self.stop
        if stop is not None and self.next_offset >= stop:
            return
        try:
            base, view, pos = self._open_at(self.next_offset)
        except _EndOfLog:
            return
        try:
            while not self.closed:
                # Past the stable part of the file, the header is read with pread and the batch
                # is served from the map only once all of it is in the file (see _View).
                hdr = view.header(pos)
                extent = view.whole(pos, hdr) if hdr is not None else -1
                framed: tuple[fmt.BatchHeader, bytes] | None = None
                if extent < 0:
                    state, where, framed = self._at_gap(base, view, pos)
                    if state == "grown":
                        continue
                    if framed is not None:
                        hdr = framed[0]
                        extent = pos + fmt.BATCH_SIZE + hdr.payload_len
                    elif state == "skip":
                        pos = where
                        continue
                    elif state == "next":
                        view.close()
                        entered = self._next_segment(base)
                        if entered is None:
                            return
                        base, view = entered
                        pos = 0
                        continue
                    elif not self._wait():
                        return
                    else:
                        yield []  # nothing yet: the caller may stop on the clock (--to @t -f)
                        continue
                assert hdr is not None
                if hdr.end <= self.next_offset:
                    pos = extent  # before the start: skip without checking the payload
                    continue
                if framed is None and _payload_ok(view.buf, pos, hdr):
                    records = fmt.decode_records(view.buf, pos + fmt.BATCH_SIZE, extent)
                else:
                    # A full-length batch that fails its CRC, even the last one, is damage: a
                    # crash only ever leaves a batch cut short, which never gets here. A framed
                    # batch is read from the copy it was framed in (its bytes are not stable).
                    data, at = (framed[1], 0) if framed is not None else (view.buf, pos)
                    records, damage = self._damaged(data, at, base, pos, hdr)
                    if damage is not None:
                        # Serve the good records before the bad one, then stop there (if the read
                        # reaches it).
                        records = [r for r in records if r[0] < damage.offset]
                        if stop is None or damage.offset < stop:
                            wanted = [r for r in records if r[0] >= self.next_offset]
                            if wanted:
                                yield wanted
                            raise damage
                first_needed = self.next_offset
                if records and (
                    records[0][0] < first_needed or (stop is not None and records[-1][0] >= stop)
                ):
                    records = [r for r in records if first_needed <= r[0] and (stop is None or r[0] < stop)]
                self.next_offset = hdr.end
                pos = extent
                if records:
                    self.last_data = time.monotonic()
                    yield records
                if stop is not None and self.next_offset >= stop:
                    return
        finally:
            view.close()

    def _wait(self) -> bool:
        """At the end: False to stop (no follow, or idle too long), else sleep a poll interval."""
        if not self.follow or self.closed:
            return False
        if self.idle_timeout is not None and time.monotonic() - self.last_data > self.idle_timeout:
            return False
        time.sleep(self.poll_s)
        return True

    def _is_last(self, base: int, pos: int) -> bool:
        nxt = self.next_offset
        if nxt > base and os.path.exists(self.log.dir / fmt.segment_name(nxt)):
            return False  # the next segment, found by name (see _next_segment)
        # Only damage (a segment cut short, one deleted by hand) puts a newer segment under another
        # name: a follower waiting at the same spot lists the directory on its first look and then
        # every _TAIL_RELIST polls, not on each (21 ms a listing at 11000 segments, every 50 ms).
        at = (base, pos, nxt)
        if at == self._tail_at and self._tail_polls < _TAIL_RELIST:
            self._tail_polls += 1
            return True
        segs = self.log.segments()
        last = not segs or segs[-1] == base
        self._tail_at, self._tail_polls = (at if last else None), 0
        return last

    def _at_gap(
        self, base: int, view: _View, pos: int
    ) -> tuple[str, int, tuple[fmt.BatchHeader, bytes] | None]:
        """No whole batch at pos: the file grew, a batch framed by its records (its header
        rebuilt, and a copy of its bytes), the next segment, damage to skip, or the end."""
        sealed = not self._is_last(base, pos)  # a newer segment exists: this one will not grow again
        size = view.refresh()
        hdr = view.header(pos)
        if hdr is not None and view.whole(pos, hdr) >= 0:
            return "grown", pos, None
        if pos >= size:
            return ("next", 0, None) if sealed else ("end", pos, None)
        if hdr is not None:
            # A valid header whose batch runs past the end: in flight or torn, never searched
            # inside (a record value may hold bytes laid out like a batch). A sealed segment
            # will not grow: the file was cut short, and what it held from here on is lost.
            if not sealed:
                return "end", pos, None
            self._cut_short(base, size)
            return "next", 0, None
        if sealed and size - pos < fmt.BATCH_SIZE:
            self._cut_short(base, size)  # less than a batch header left: cut inside one
            return "next", 0, None
        # The bytes from here on are not stable (a new writer may truncate them): searched in a
        # copy, never through the map.
        data = view.copy(pos, size)
        framed = _framed_by_records(data, 0, len(data))
        if framed is not None:
            return "framed", pos, (framed[0], data[: framed[1]])
        found = _find_next_header(data, 1, len(data))
        if found is None and not sealed:
            if _tail_kind(data, 0, len(data)) == "torn":
                return "end", pos, None  # a torn or in-flight tail: never served
            # Damage that does not frame at the end of the newest segment: nothing can be read
            # after it (the writer refuses to append after it either).
            if (base, pos) != self.reported_at:
                self._report(base, pos, -1)
                self.reported_at = (base, pos)
            return "end", pos, None
        # Bytes that do not frame, with valid batches after them or in a sealed segment (then
        # nothing of it can be read after them: lost up to the next segment).
        last = found[1].base - 1 if found else self._before_next(base)
        if (base, pos) == self.reported_at:
            # Told already, as damage up to an unknown end, while it was the end of the newest
            # segment (a follow); a live writer has appended after it since, or rolled. Each offset
            # is told once: it was told again from the same offset ((3, -1), then (3, 5)).
            if last >= 0:
                self.next_offset = max(self.next_offset, last + 1)
        else:
            self._report(base, pos, last)
        return ("skip", pos + found[0], None) if found else ("next", 0, None)

    def _before_next(self, base: int) -> int:
        """The last offset before the segment after `base` that this read wants (-1: unknown)."""
        later = [s for s in self.log.segments() if s > base]
        if not later:
            return -1
        return later[0] - 1 if self.stop is None else min(later[0], self.stop) - 1

    def _cut_short(self, base: int, size: int) -> None:
        """Sealed segment `base` ends at byte `size` inside a batch: the file was truncated, and
        the records from the read's next offset up to the next segment are lost. Raised as
        CorruptRecord naming the file and the offsets, or reported (on_corrupt) and skipped."""
        seg = fmt.segment_name(base)
        first, last = self.next_offset, self._before_next(base)
        lost = f"offsets {first}..{last}" if last > first else f"offset {first}"
        if not self.skip_corrupt:
            raise CorruptRecord(
                f"segment {seg} is cut short (truncated at byte {size}): {lost} are lost; "
                "pass --skip-corrupt to read past them",
                first,
                seg,
                size,
            )
        if self.on_corrupt is not None:
            self.on_corrupt(CorruptRange(first, last, seg, size))
        if last >= first:
            self.next_offset = last + 1

    def _lost_before(self, nxt: int, segs: list[int], done: int) -> bool:
        """Offsets between the segment just read and the next one have no file: a segment was
        deleted by hand or lost. Reported like corruption (True: the read range ends inside the
        hole; False: reported and skipped, or not damage). Retention only ever removes the oldest
        segments, so a hole with nothing before it is records aging out under a slow reader, not
        damage. A listing is no snapshot: retention deleting segments while the directory is read
        leaves an older one in it and not the newer ones it deleted after. So the hole is damage
        only if a segment before it is there still, looked at after the listing (retention had
        not got to it yet, so not to the hole after it either)."""
        first, stop = self.next_offset, self.stop
        # A report that covered the hole (this segment cut short, or damage up to its end) moved
        # next_offset to the next segment, or to the stop: nothing is left to tell. Damage reported
        # earlier in the segment just read does not cover a hole after it.
        if nxt <= first or segs[0] >= nxt or (stop is not None and first >= stop):
            return False
        seg_path = self.log.dir / fmt.segment_name(done)
        try:
            pos = seg_path.stat().st_size
        except FileNotFoundError:
            pos = -1
        if pos < 0 and (segs[0] >= done or not (self.log.dir / fmt.segment_name(segs[0])).exists()):
            return False  # the segment just read is gone too, and any before it: retention
        last = nxt - 1 if stop is None else min(nxt, stop) - 1
        seg = fmt.segment_name(nxt)
        lost = f"offsets {first}..{last}" if last > first else f"offset {first}"
        if pos >= 0:
            # The segment just read is still there and ends short of the next one: it was cut
            # at a batch boundary (the usual case: nothing else looks like this), or a whole
            # segment file after it was removed by hand. Either way damage, not retention.
            seg = fmt.segment_name(done)
            why = (
                f"{lost} are missing: segment {seg} ends (byte {pos}) before them and the next one, "
                f"{fmt.segment_name(nxt)}, starts at offset {nxt}; {seg} was cut short (truncated) "
                "or a segment file after it was deleted"
            )
        else:
            pos = 0
            why = f"{lost} are missing: their segment file, before {seg}, was deleted"
        if not self.skip_corrupt:
            raise CorruptRecord(f"{why}; pass --skip-corrupt to read past them", first, seg, pos)
        if self.on_corrupt is not None:
            self.on_corrupt(CorruptRange(first, last, seg, pos))
        self.next_offset = max(self.next_offset, nxt)  # reported: not told again as a gap
        return stop is not None and stop <= nxt

    def _report(self, base: int, pos: int, last_offset: int) -> None:
        seg = fmt.segment_name(base)
        first = self.next_offset
        if not self.skip_corrupt:
            raise CorruptRecord(
                f"corrupt batch at offset {first} (segment {seg}, byte {pos}): its header does not "
                "frame; pass --skip-corrupt to read past it",
                first,
                seg,
                pos,
            )
        if self.on_corrupt is not None:
            self.on_corrupt(CorruptRange(first, last_offset, seg, pos))
        if last_offset >= 0:
            self.next_offset = last_offset + 1

    def _damaged(
        self, buf: Any, at: int, base: int, pos: int, hdr: fmt.BatchHeader
    ) -> tuple[list[Record], CorruptRecord | None]:
        """A batch that failed its CRC (at `at` in buf; at pos in the segment): find the bad
        records. Only those this read wants count: the damage is the first bad one at or after
        the read's next offset."""
        good, bad = fmt.check_records(buf, at + fmt.BATCH_SIZE, at + fmt.BATCH_SIZE + hdr.payload_len)
        seg = fmt.segment_name(base)
        first = max(hdr.base, self.next_offset)
        last = hdr.end if self.stop is None else min(hdr.end, self.stop)
        good = [r for r in good if hdr.base <= r[0] < hdr.end]
        have = {r[0] for r in good}
        if not bad and not self.skip_corrupt:
            have = set()  # the records check out but the batch does not: trust none
        missing = [o for o in range(first, last) if o not in have]
        bad_at = {o: p for o, p in bad}  # positions in buf of the bad records
        where = pos
        if bad:
            where = bad_at.get(missing[0], bad[0][1]) if missing else bad[0][1]
            where += pos - at
        if not self.skip_corrupt:
            if not missing:
                return good, None  # the damage lies outside what this read wants
            return [r for r in good if r[0] in have], CorruptRecord(
                f"corrupt record at offset {missing[0]} (segment {seg}, byte {where}): CRC mismatch; "
                "pass --skip-corrupt to read past it",
                missing[0],
                seg,
                where,
            )
        if self.on_corrupt is not None:
            for o in _runs(missing):
                self.on_corrupt(CorruptRange(o[0], o[1], seg, where))
        return [r for r in good if r[0] in have], None


def _runs(values: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in values:
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


class _EndOfLog(Exception):
    pass


def _check_unclaimed(directory: Path) -> None:
    """A new topic goes only into an empty directory: `rq produce .` (or `~`, `..`) must not scatter
    segments and a writer.lock among someone's files, nor let retention loose beside them. A temp
    file left by a crash while topic.json was first written does not count."""
    try:
        names = os.listdir(directory)
    except NotADirectoryError:
        raise TopicError(f"{directory} is a file, not a topic directory") from None
    if CONFIG_NAME in names:
        return  # another writer created it a moment ago
    # another writer is creating it (it takes writer.lock before it writes topic.json: the lock
    # then refuses this one), or one was stopped in between
    if any(
        n != "writer.lock" and not (n.startswith(f".{CONFIG_NAME}.") and n.endswith(".tmp")) for n in names
    ):
        raise TopicError(
            f"{directory} is a directory that is not a topic (no {CONFIG_NAME}) and not empty: "
            "give a new or empty directory"
        )


_LOCK_TRIES = 8


def _lock_writer(directory: Path) -> int:
    """writer.lock, opened and flocked: the fd, or WriterBusy while another writer holds it.

    A creation that fails unlinks the writer.lock it made (the directory is left as it was). A
    writer that opened that file before the unlink and locks it after holds a lock on a file no
    longer in the directory, and the next writer makes a new writer.lock and locks that: two
    writers at once. So, once locked, writer.lock must still be the file this fd locked; if not,
    the lock is taken again on the one there now (bounded: each retry follows a failed creation)."""
    path = directory / "writer.lock"
    for _ in range(_LOCK_TRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise WriterBusy(
                f"topic {directory} is being written by another process (or another LogWriter in this one)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            held, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
            if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
                return fd
        except FileNotFoundError:
            pass  # unlinked by a creation that failed: make and lock a new one
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise WriterBusy(f"topic {directory}: writer.lock kept changing while it was taken; try again")


class LogWriter:
    """The one writer of a topic. `append` returns once the batch is durable (fdatasync).

    Thread-safe: appends from several threads through one writer are taken one at a time (each
    gets its own offsets), and close waits for an append under way."""

    def __init__(
        self,
        directory: Path,
        config: TopicConfig | None = None,
        create: bool = True,
        max_ahead_ms: int | None = MAX_AHEAD_MS,
    ):
        # Reentrant: a signal handler that closes the writer runs in the thread it interrupted.
        self._lock = threading.RLock()
        if max_ahead_ms is not None and (type(max_ahead_ms) is not int or max_ahead_ms < 0):
            raise SpecError(
                f"LogWriter: max_ahead_ms must be a whole number of ms or None, not {max_ahead_ms!r}"
            )
        self.max_ahead_ms = max_ahead_ms  # None: any stamp (a copy keeping its source's stamps)
        if config is not None and not isinstance(config, TopicConfig):
            raise SpecError(f"LogWriter: config must be a TopicConfig, not {type(config).__name__}")
        if config is not None:
            config.check()  # before anything is made or written
        self.dir = directory
        exists = (directory / CONFIG_NAME).is_file()
        if not exists and not create:
            raise TopicNotFound(f"topic {directory} does not exist")
        try:
            if not exists:
                parent_new = not directory.exists()
                if not parent_new:
                    _check_unclaimed(directory)
                make_dirs(directory)
                if parent_new:
                    fsync_dir(directory.parent)
            _read_config(directory)  # a bad or newer topic.json: refused before anything else
            self.lock_fd = _lock_writer(directory)
        except (FileNotFoundError, NotADirectoryError) as exc:
            # a path that cannot hold a topic (a file on the way, a parent that cannot be made)
            raise SpecError(
                f"cannot make topic {directory}: {exc.filename or directory}: {exc.strerror}; "
                "name a path where a directory can be made"
            ) from None
        except OSError as exc:
            raise not_writable(f"topic {directory}", exc) or exc from None
        # Only the writer that holds the lock writes topic.json: a second one, refused above, has
        # changed nothing (its --retention-bytes must not reach the next writer's retention).
        new = not (directory / CONFIG_NAME).is_file()
        try:
            if config is None:
                self.config = TopicConfig.load(directory)  # read again: made or changed since?
            else:
                _read_config(directory)  # (a newer format: refused, never written over)
                self.config = config
            if config is not None or new:
                self.config.save(directory)
        except BaseException as exc:
            if new:  # a topic not made (a full disk): its directory is left as it was, empty
                with contextlib.suppress(OSError):
                    os.unlink(directory / "writer.lock")
            os.close(self.lock_fd)
            if isinstance(exc, OSError):
                raise not_writable(f"topic {directory}", exc) or exc from None
            raise
        self.fd = -1
        self.idx_fd = -1
        try:
            self._recover()
        except OSError as exc:
            self.close()
            # a topic whose files another user owns: its directory may be writable, its segment not
            raise not_writable(f"topic {directory}", exc) or exc from None
        except BaseException:
            self.close()
            raise

    # -- opening and recovery -------------------------------------------------------------------

    def _recover(self) -> None:
        # The sealed segments (base, bytes), oldest first, that retention weighs on each roll: kept
        # here, so that a roll does not list and stat the whole directory (O(segments) a roll).
        # They go out of step when a segment goes another way (deleted by hand, by an operator
        # clearing space): the directory's mtime, taken before each listing and after each change
        # of the writer's own, tells a change made by anyone else, and the books are then listed
        # again (_resync). Changes made below (a new index, segment 0) count as one: the first
        # roll lists once.
        self._dir_seen = self._dir_mtime()
        segs = _list_segments(self.dir)
        self._sealed: collections.deque[tuple[int, int]] = collections.deque(
            (b, _file_size(self.dir / fmt.segment_name(b))) for b in segs[:-1]
        )
        self._sealed_bytes = sum(size for _, size in self._sealed)
        if not segs:
            self._new_segment(0)
            self.last_ts = 0
            self._drop_orphan_indexes()
            return
        base = segs[-1]
        path = self.dir / fmt.segment_name(base)
        view = _View(path)
        try:
            good_end, end_offset, last_ts = self._valid_prefix(base, view)
            size = view.size
        finally:
            view.close()
        if good_end < size:
            # A torn tail: bytes after the last complete, CRC-valid batch. Never acknowledged.
            with open(path, "r+b") as fh:
                fh.truncate(good_end)
                os.fsync(fh.fileno())
        self._truncate_index(base, good_end)
        self.base = base
        self.next_offset = end_offset
        self.last_ts = last_ts if last_ts else self._last_ts_before(segs)
        self.fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
        self.size = good_end
        self.idx_fd = os.open(self.dir / fmt.index_name(base), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _, positions, _ = _load_index(self.dir, base, good_end)
        self.last_index_pos = positions[-1] if positions else 0
        self._drop_orphan_indexes()
        self._apply_retention()

    def _valid_prefix(self, base: int, view: _View) -> tuple[int, int, int]:
        """(bytes to keep, end offset, newest timestamp) of the newest segment.

        Only a torn tail is cut (see _tail_kind): a batch cut short, or zeros. A full-length batch
        that fails its CRC, and damage with valid batches after it, stay for readers to report
        (and --skip-corrupt to step over); damage at the end that cannot be framed stops the writer.
        """
        size = view.size
        index = _load_index(self.dir, base, size)
        # Start at the last index entry that checks out: a damaged one must not pass for the end.
        hint = _hint(view, size, index, len(index[0]) - 1)
        end, pos, last_ts = hint if hint is not None else (base, 0, 0)
        pos, end, last_ts, state = _walk(view, size, pos, end, last_ts)
        if state == "damaged":
            raise _tail_damage(base, pos, end, size)
        return pos, end, last_ts

    def _last_ts_before(self, segs: list[int]) -> int:
        """The newest timestamp before an empty newest segment (a roll stopped by a signal or a
        full disk before its first batch): the last one of the segment before it, not its first,
        so that timestamps given with the records (`tail --record`) still never go backwards."""
        for base in reversed(segs[:-1]):
            try:
                view = _View(self.dir / fmt.segment_name(base))
            except FileNotFoundError:
                continue
            try:
                size = view.size
                index = _load_index(self.dir, base, size)
                hint = _hint(view, size, index, len(index[0]) - 1)
                end, pos, last_ts = hint if hint is not None else (base, 0, 0)
                last_ts = _walk(view, size, pos, end, last_ts)[2]
            finally:
                view.close()
            if last_ts:
                return last_ts
        return 0

    def _truncate_index(self, base: int, size: int) -> None:
        path = self.dir / fmt.index_name(base)
        offsets, _, _ = _load_index(self.dir, base, size)
        keep = len(offsets) * fmt.INDEX_SIZE
        with contextlib.suppress(FileNotFoundError), open(path, "r+b") as fh:
            if os.fstat(fh.fileno()).st_size != keep:
                fh.truncate(keep)

    def _new_segment(self, base: int) -> None:
        fd, idx_fd = self._open_new_segment(base)
        # One step with no call in it: self.fd and self.idx_fd always name open files.
        self.fd, self.idx_fd, self.base, self.next_offset, self.size, self.last_index_pos = (
            fd,
            idx_fd,
            base,
            base,
            0,
            0,
        )

    def _open_new_segment(self, base: int) -> tuple[int, int]:
        """Opens (creates) segment `base` and its index, synced into the directory. An empty one
        already there is what a roll stopped by a signal left (the writer holds the lock, so no
        one else made it): it is taken over; one holding data is never written over."""
        path = self.dir / fmt.segment_name(base)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            if os.fstat(fd).st_size:
                raise TopicError(f"cannot start segment {path}: it exists and holds data")
            idx_fd = os.open(
                self.dir / fmt.index_name(base), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644
            )
            try:
                fsync_dir(self.dir)
            except BaseException:
                os.close(idx_fd)
                raise
        except BaseException:
            os.close(fd)
            raise
        return fd, idx_fd

    # -- appending ------------------------------------------------------------------------------

    def append(self, records: Iterable[fmt.Pending]) -> tuple[int, int]:
        """Appends one batch durably; returns (first offset, last offset). Any iterable of records
        is taken (a generator too); an empty one stores nothing and returns (end, end - 1).

        One that stops after some of its records are durable (a batch split into parts: a later
        part failed; or a KeyboardInterrupt, a signal, once a part's bytes were all written) raises
        AppendedPartly, or AppendInterrupted for the interrupt, with what it stored. The file then
        holds exactly what is counted: a part cut short is truncated away, not left for the next
        open to find, and one written whole is synced and counted, as a rerun would find it."""
        batch = records if isinstance(records, (list, tuple)) else list(records)
        with self._lock:
            if not batch:
                if self.fd < 0:
                    raise TopicError("writer is closed")
                return self.next_offset, self.next_offset - 1
            return self._append_locked(batch)

    def _append_locked(self, records: Sequence[fmt.Pending]) -> tuple[int, int]:
        if self.fd < 0:
            raise TopicError("writer is closed")
        base = self.next_offset
        try:
            return self._append(records)
        except BaseException as exc:
            stored = self.next_offset - base
            if stored <= 0 or isinstance(exc, (AppendedPartly, AppendInterrupted)):
                raise  # nothing of the batch is stored: the plain error says it all
            # The parts before are durable and stay: a caller that counted none of the batch
            # would commit short of them and a rerun would store them twice.
            first, last = base, self.next_offset - 1
            if isinstance(exc, KeyboardInterrupt):
                raise AppendInterrupted(str(self.dir), first, last, stored, exc) from exc
            if isinstance(exc, Exception):
                raise AppendedPartly(str(self.dir), first, last, stored, exc) from exc
            raise

    def _append(self, records: Sequence[fmt.Pending]) -> tuple[int, int]:
        now = now_ms()
        stamps: list[int] = []
        last = self.last_ts
        first = self.next_offset
        try:
            for rec in records:
                ts = rec[0]
                if ts is None:
                    ts = now
                elif type(ts) is not int:  # numpy's int64 is taken, a float or a bool refused
                    if (number := as_int(ts)) is None:
                        raise TypeError(f"timestamp {ts!r} is not an int")
                    ts = number
                if ts < 0:  # i64 on disk, but a time before 1970 was stored as the previous one's
                    raise ValueError(f"timestamp {ts} is before 1970 (Unix ms of 0 or more)")
                if (
                    self.max_ahead_ms is not None and now + self.max_ahead_ms < ts < 1 << 63
                ):  # past i64: below
                    raise SpecError(
                        f"cannot append to {self.dir}: a record is stamped {ts}, "
                        f"{(ts - now) / 1000:.0f} s ahead of this clock (at most "
                        f"{self.max_ahead_ms / 1000:.0f} s); timestamps never decrease, so every later "
                        "record would carry that stamp. Nothing of the batch was written"
                    )
                last = ts if ts > last else last  # timestamps never go backwards: seeks stay exact
                stamps.append(last)
            data = fmt.encode_batch(first, records, stamps)
        except SpecError:
            raise
        except (struct.error, TypeError, ValueError, AttributeError, OverflowError) as exc:
            # nothing written: one line, not struct's "required argument is not an integer"
            raise SpecError(
                "cannot append: each record is (timestamp: Unix ms as an int of 0 to 2**63-1, or "
                f"None; key: bytes or None; headers: ((str, bytes), ...); value: bytes): {exc}"
            ) from None
        if len(data) - fmt.BATCH_SIZE > fmt.MAX_BATCH_PAYLOAD:
            # Readers take a header claiming more for damage: a batch this big would be acknowledged
            # and then cut off as a torn tail. Split it, or refuse a record too big on its own.
            return self._append_split(records)
        if self.size and self.size + len(data) > self.config.segment_bytes:
            self._roll()
        pos = self.size
        try:
            view = memoryview(data)
            written = 0
            while written < len(data):
                written += os.pwrite(self.fd, view[written:], pos + written)
            os.fdatasync(self.fd)
            self._settle(first, len(records), pos, len(data), stamps[0], last)
        except BaseException as exc:
            # An interrupt may land anywhere in here (a signal handler raises at the next
            # bytecode, e.g. right after fdatasync returned): count the batch by what the file holds.
            counted = self.next_offset == first + len(records)
            if not counted and self._written_whole(exc, pos, len(data)):
                self._settle(first, len(records), pos, len(data), stamps[0], last)
            raise
        return first, self.next_offset - 1

    def _written_whole(self, exc: BaseException, pos: int, length: int) -> bool:
        """After a batch's write at `pos` was stopped: True if it is in the file whole and synced
        (an interrupt, not an error of the write, came after its last byte was written); else
        its bytes are truncated away, so that the file holds only batches counted."""
        if isinstance(exc, KeyboardInterrupt):
            with contextlib.suppress(OSError):
                if os.fstat(self.fd).st_size >= pos + length:
                    os.fdatasync(self.fd)
                    return True
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, pos)
        return False

    def _settle(self, first: int, count: int, pos: int, length: int, first_ts: int, last_ts: int) -> None:
        """The books after a batch is durable; idempotent (an interrupt may repeat it)."""
        self.size = pos + length
        self.next_offset = first + count
        self.last_ts = last_ts
        if pos and pos - self.last_index_pos >= fmt.INDEX_INTERVAL:
            self.last_index_pos = pos  # first: an entry is a hint, never written twice
            os.write(self.idx_fd, fmt.INDEX.pack(first, pos, first_ts))

    def _append_split(self, records: Sequence[fmt.Pending]) -> tuple[int, int]:
        """A batch over the payload limit: refuse a record too big alone (before writing anything),
        else append it as several batches (append says what they stored if one fails)."""
        sizes = [fmt.record_size(key, headers, value) for _, key, headers, value in records]
        for i, size in enumerate(sizes):
            if size > fmt.MAX_BATCH_PAYLOAD:
                # Counted as `rq produce` counts an input line: key, headers and value, without the
                # record's own 36-byte header (256 MiB holds it too).
                most = fmt.MAX_BATCH_PAYLOAD - fmt.RECORD_SIZE
                raise RecordTooLarge(
                    f"record {i + 1} of the batch is over {most} bytes (key, headers and value: "
                    f"{size - fmt.RECORD_SIZE}); a record holds at most {most} bytes"
                )
        first, last, total, start = -1, -1, 0, 0
        for i, size in enumerate([*sizes, -1]):  # -1: the end, the last part goes
            if size < 0 or total + size > fmt.MAX_BATCH_PAYLOAD:
                a, last = self._append(records[start:i])
                first = a if first < 0 else first
                start, total = i, 0
            total += size
        return first, last

    def _roll(self) -> None:
        # A signal may stop a roll anywhere (rq produce's Ctrl-C): the old segment's files are
        # closed only once the new ones are open and in place, so the writer is always on one
        # segment whose files it holds open (never a closed fd, or the old books with the new
        # file), and a roll stopped before that leaves at most an empty segment the next takes over.
        os.fsync(self.fd)
        old = self.fd, self.idx_fd
        sealed = self.base, self.size
        retention = self.config.retention_bytes is not None or self.config.retention_ms is not None
        # Changed by someone else since the writer last looked: one stat, before its own change.
        drift = retention and self._dir_mtime() != self._dir_seen
        self._new_segment(self.next_offset)
        self._sealed.append(sealed)
        self._sealed_bytes += sealed[1]
        if retention:
            self._dir_seen = self._dir_mtime()
        for fd in old:
            os.close(fd)
        self._apply_retention(drift)

    def _dir_mtime(self) -> int:
        return os.stat(self.dir).st_mtime_ns

    def _resync(self) -> None:
        """The sealed segments' books from a listing: a segment left the directory (or came into
        it) some other way than through this writer."""
        self._dir_seen = self._dir_mtime()  # before the listing: a change during it is seen next
        self._sealed = collections.deque(
            (b, _file_size(self.dir / fmt.segment_name(b))) for b in _list_segments(self.dir) if b < self.base
        )
        self._sealed_bytes = sum(size for _, size in self._sealed)
        self._drop_orphan_indexes()

    def _drop_orphan_indexes(self) -> None:
        """Removes each index (`NNNNN.idx`) whose segment file is not there: one left by a `.log`
        deleted by hand, or by a retention pass stopped between its two unlinks. Retention and the
        books know segments by their `.log`, so nothing else ever removed it. Only the writer, which
        holds the lock, makes segments, and it makes the `.log` before its index: an index without
        its log is no segment being made. Never the active segment's index (the writer's own), and
        never one whose `.log` is there when looked at just before the unlink. At the writer's open
        and when it lists again (_resync): one listing of its own, not on the common roll."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return  # a hint file left: nothing to fail the writer for
        logs = set(names)
        for name in names:
            m = _INDEX.match(name)
            if m is None or int(m.group(1)) == self.base or f"{m.group(1)}.log" in logs:
                continue
            if os.path.lexists(self.dir / f"{m.group(1)}.log"):  # came back since the listing
                continue
            with contextlib.suppress(OSError):  # gone already, or not ours to remove: a hint left
                os.unlink(self.dir / name)

    def _apply_retention(self, drift: bool = False) -> None:
        retention_bytes, retention_ms = self.config.retention_bytes, self.config.retention_ms
        if retention_bytes is None and retention_ms is None:
            return
        if drift:
            self._resync()
        removed = False
        while self._sealed:  # never the active segment
            base, size = self._sealed[0]
            too_big = retention_bytes is not None and self._sealed_bytes + self.size > retention_bytes
            # A sealed segment's newest record is no newer than the next segment's first one.
            after = self._sealed[1][0] if len(self._sealed) > 1 else self.base
            too_old = False
            if retention_ms is not None:
                first_ts = _first_ts(self.dir, after)
                if (
                    first_ts == _UNKNOWN_TS
                    and not drift
                    and not (self.dir / fmt.segment_name(after)).exists()
                ):
                    # In the books, not in the directory: they are out of step (a change the
                    # mtime did not tell). List, and weigh again.
                    drift = True
                    self._resync()
                    continue
                too_old = first_ts < now_ms() - retention_ms
            if not (too_big or too_old):
                break
            try:
                os.unlink(self.dir / fmt.segment_name(base))
            except FileNotFoundError:
                gone = True
            else:
                gone = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dir / fmt.index_name(base))
            removed = True
            if gone and not drift:
                # It was gone already: its bytes were not there to weigh, and others may be gone too.
                drift = True
                self._resync()
                continue
            self._sealed.popleft()
            self._sealed_bytes -= size
        if removed:
            fsync_dir(self.dir)
            self._dir_seen = self._dir_mtime()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        for attr in ("fd", "idx_fd"):
            fd = getattr(self, attr, -1)
            if fd >= 0:
                os.close(fd)
                setattr(self, attr, -1)
        if getattr(self, "lock_fd", -1) >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def check_topic_name(name: str) -> str:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$", name):
        if not name:
            raise SpecError("the topic name is an empty string (an unset variable?)")
        raise SpecError(
            f"bad topic name {name!r}: use ASCII letters, digits, '.', '_' or '-', starting with a letter or "
            "digit (at most 200), or give a path (./NAME)"
        )
    return name
