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
CRC, even the newest, is corruption, never truncated. Corruption is raised as CorruptRecord with its offset, or skipped
(and reported through `on_corrupt`) when the reader is asked to.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import mmap
import os
import re
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from topics.embedded import format as fmt
from topics.embedded.files import fsync_dir, write_atomic
from topics.embedded.groups import GroupStore
from topics.errors import (
    CorruptRecord,
    RecordTooLarge,
    SpecError,
    TopicError,
    TopicNotFound,
    WriterBusy,
)
from topics.record import Record

_SEGMENT = re.compile(r"^(\d{20})\.log$")
CONFIG_NAME = "topic.json"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class TopicConfig:
    segment_bytes: int = 128 * 1024 * 1024
    retention_bytes: int | None = None  # total size above which the oldest segments are deleted
    retention_ms: int | None = None  # segments whose newest record is older than this are deleted

    @classmethod
    def load(cls, directory: Path) -> TopicConfig:
        try:
            data = orjson.loads((directory / CONFIG_NAME).read_bytes())
        except FileNotFoundError:
            return cls()
        except orjson.JSONDecodeError as exc:
            raise TopicError(f"{directory / CONFIG_NAME} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise TopicError(f"{directory / CONFIG_NAME} is not a topic config (a JSON object)")
        known = {k: data[k] for k in ("segment_bytes", "retention_bytes", "retention_ms") if k in data}
        for name, value in known.items():
            optional = name != "segment_bytes"
            if not ((value is None and optional) or (type(value) is int and value > 0)):
                raise TopicError(
                    f"{directory / CONFIG_NAME}: {name} must be a positive integer, not {value!r}"
                )
        return cls(**known)

    def save(self, directory: Path) -> None:
        write_atomic(directory / CONFIG_NAME, orjson.dumps({"format": 1, **asdict(self)}))


@dataclass
class CorruptRange:
    """Records a reader skipped: offsets first..last (last may be unknown: -1), where they sat."""

    first: int
    last: int
    segment: str
    position: int


class _View:
    """A read-only mapping of one segment, remapped when the file grows (or shrinks)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        self.mm: mmap.mmap | None = None
        self.size = 0
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
        return size

    @property
    def buf(self) -> Any:
        return self.mm if self.mm is not None else b""

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _list_segments(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        raise TopicNotFound(f"topic directory {directory} is gone") from None
    return sorted(int(m.group(1)) for n in names if (m := _SEGMENT.match(n)))


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
    buf: Any,
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
        hdr = fmt.read_batch_header(buf, pos)
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


def _walk(buf: Any, size: int, pos: int, end: int, last_ts: int) -> tuple[int, int, int, str]:
    """Walks the batches of the newest segment from pos (a batch start) to where the log ends:
    (that position, the end offset, the newest timestamp, what lies from there to the end of the
    file: 'end' nothing, 'torn' a torn tail (see _tail_kind), 'damaged' damage that cannot be
    framed). Damage in the middle is stepped over here; readers report it. The writer and
    end_offset both walk with this, so they agree on where the log ends."""
    while pos < size:
        hdr = fmt.read_batch_header(buf, pos) if pos + fmt.BATCH_SIZE <= size else None
        if hdr is not None:
            extent = pos + fmt.BATCH_SIZE + hdr.payload_len
            if extent > size:
                # A valid header whose batch runs past the end of the file: a write cut short.
                # Nothing inside its declared length is searched for headers: a record value may
                # hold bytes laid out like a batch (an rq segment produced with --format raw).
                return pos, end, last_ts, "torn"
        else:
            # A damaged header is framed by its records before any search for the next header,
            # which could find a batch-like record value inside this very batch.
            framed = _framed_by_records(buf, pos, size)
            found = _find_next_header(buf, pos + 1, size) if framed is None else None
            if framed is not None:
                hdr, extent = framed
            elif found is not None and _payload_ok(buf, *found):
                pos, hdr = found  # damage in the middle: skipped here, reported by readers
                extent = pos + fmt.BATCH_SIZE + hdr.payload_len
            else:
                return pos, end, last_ts, ("torn" if _tail_kind(buf, pos, size) == "torn" else "damaged")
        end, last_ts = hdr.end, hdr.max_ts
        pos = extent
    return pos, end, last_ts, "end"


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


class TopicLog:
    """Read-side handle of one topic directory. Cheap; create one per command."""

    def __init__(self, directory: Path):
        self.dir = directory
        if not (directory / CONFIG_NAME).is_file():
            raise TopicNotFound(f"topic {directory} does not exist (no {CONFIG_NAME})")
        self.groups = GroupStore(directory)

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

    def offset_for_time(self, ts_ms: int) -> int:
        """First offset whose timestamp is >= ts_ms; the end offset when there is none."""
        segs = self.segments()
        firsts: list[int] = []
        for base in segs:
            firsts.append(self._first_ts(base))
        # Segments are in time order: pick the last whose first record is older than ts_ms.
        k = bisect.bisect_left(firsts, ts_ms) - 1
        if k < 0:
            k = 0
        for i in range(k, len(segs)):
            found = self._seek_time_in(segs[i], ts_ms)
            if found is not None:
                return found
        return self.end_offset()

    def _first_ts(self, base: int) -> int:
        try:
            with open(self.dir / fmt.segment_name(base), "rb") as fh:
                head = fh.read(fmt.BATCH_SIZE)
        except FileNotFoundError:
            return 2**63 - 1
        hdr = fmt.read_batch_header(head, 0)
        return hdr.first_ts if hdr is not None else 2**63 - 1

    def _seek_time_in(self, base: int, ts_ms: int) -> int | None:
        view = _View(self.dir / fmt.segment_name(base))
        try:
            size = view.size
            index = _load_index(self.dir, base, size)
            buf = view.buf
            hint = _hint(buf, size, index, bisect.bisect_left(index[2], ts_ms) - 1, (2**64, ts_ms))
            pos = hint[1] if hint is not None else 0
            while pos + fmt.BATCH_SIZE <= size:
                hdr = fmt.read_batch_header(buf, pos)
                if hdr is None:
                    return None
                extent = pos + fmt.BATCH_SIZE + hdr.payload_len
                if extent > size:
                    return None
                if hdr.max_ts >= ts_ms and _payload_ok(buf, pos, hdr):
                    for rec in fmt.decode_records(buf, pos + fmt.BATCH_SIZE, extent):
                        if rec[1] >= ts_ms:
                            return rec[0]
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
    ) -> LogReader:
        return LogReader(self, start, stop, follow, skip_corrupt, on_corrupt, poll_s, idle_timeout)


def _scan_end(directory: Path, base: int, view: _View) -> tuple[int, CorruptRecord | None]:
    """The end offset of the newest segment, walked as the writer walks it, and the damage at its
    end that stops the writer, if any. Such damage counts as one record at the end offset (the
    lost batch holds at least one), so a bounded read that gets there reports it instead of
    ending quietly one short; a torn or in-flight tail is not counted."""
    size = view.size
    buf = view.buf
    index = _load_index(directory, base, size)
    hint = _hint(buf, size, index, len(index[0]) - 1)
    end, pos = hint[:2] if hint is not None else (base, 0)
    pos, end, _, state = _walk(buf, size, pos, end, 0)
    if state == "damaged":
        return end + 1, _tail_damage(base, pos, end, size)
    return end, None


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
    ):
        self.log = log
        self.idle_timeout = idle_timeout
        self.last_data = time.monotonic()
        self.next_offset = start
        self.stop = stop
        self.follow = follow
        self.skip_corrupt = skip_corrupt
        self.on_corrupt = on_corrupt
        self.poll_s = poll_s
        self.closed = False
        self.reported_in = -1  # base of the segment whose damage was last reported
        self.reported_at = (-1, -1)  # (segment, position) of unframed damage at the end, reported

    def close(self) -> None:
        self.closed = True

    def __iter__(self) -> Iterator[list[Record]]:
        return self._run()

    def _open_at(self, offset: int) -> tuple[int, _View, int]:
        segs = self.log.segments()
        while not segs:
            if not self.follow:
                raise _EndOfLog
            time.sleep(self.poll_s)
            segs = self.log.segments()
        if offset < segs[0]:
            offset = segs[0]  # retention removed the records before: start at the first still there
            self.next_offset = offset
        i = max(bisect.bisect_right(segs, offset) - 1, 0)
        base = segs[i]
        view = _View(self.log.dir / fmt.segment_name(base))
        index = _load_index(self.log.dir, base, view.size)
        j = bisect.bisect_right(index[0], offset) - 1
        hint = _hint(view.buf, view.size, index, j, (offset, 2**63))
        return base, view, hint[1] if hint is not None else 0

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
                buf, size = view.buf, view.size
                hdr = fmt.read_batch_header(buf, pos) if pos + fmt.BATCH_SIZE <= size else None
                extent = pos + fmt.BATCH_SIZE + hdr.payload_len if hdr is not None else -1
                damaged_header = False
                if hdr is None or extent > size:
                    state, where = self._at_gap(base, view, pos)
                    if state == "grown":
                        continue
                    if state == "framed":
                        framed = _framed_by_records(view.buf, pos, view.size)
                        assert framed is not None
                        (hdr, extent), buf, size = framed, view.buf, view.size
                        damaged_header = True
                    elif state == "skip":
                        pos = where
                        continue
                    elif state == "next":
                        view.close()
                        segs = self.log.segments()
                        later = [s for s in segs if s > base]
                        if self._lost_before(later[0], segs, base):
                            return
                        base = later[0]
                        self.next_offset = max(self.next_offset, base)
                        view = _View(self.log.dir / fmt.segment_name(base))
                        pos = 0
                        continue
                    elif not self._wait():
                        return
                    else:
                        yield []  # nothing yet: the caller may stop on the clock (--to @t -f)
                        continue
                if hdr.end <= self.next_offset:
                    pos = extent  # before the start: skip without checking the payload
                    continue
                if not damaged_header and _payload_ok(buf, pos, hdr):
                    records = fmt.decode_records(buf, pos + fmt.BATCH_SIZE, extent)
                else:
                    # A full-length batch that fails its CRC, even the last one, is damage: a
                    # crash only ever leaves a batch cut short, which never gets here.
                    records, damage = self._damaged(view, base, pos, hdr, extent)
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

    def _is_last(self, base: int) -> bool:
        segs = self.log.segments()
        return not segs or segs[-1] == base

    def _at_gap(self, base: int, view: _View, pos: int) -> tuple[str, int]:
        """No complete batch at pos: the file grew, the next segment, damage to skip, or the end."""
        sealed = not self._is_last(base)  # a newer segment exists: this one will not grow again
        size = view.refresh()
        hdr = fmt.read_batch_header(view.buf, pos) if pos + fmt.BATCH_SIZE <= size else None
        if hdr is not None and pos + fmt.BATCH_SIZE + hdr.payload_len <= size:
            return "grown", pos
        if pos >= size:
            return ("next", 0) if sealed else ("end", pos)
        if hdr is not None:
            # A valid header whose batch runs past the end: in flight or torn, never searched
            # inside (a record value may hold bytes laid out like a batch). A sealed segment
            # will not grow: the batch was cut, and what it held is lost.
            if not sealed:
                return "end", pos
            self._report(base, pos, hdr.end - 1)
            return "next", 0
        if _framed_by_records(view.buf, pos, size) is not None:
            return "framed", pos  # a damaged header; its records say where the batch ends
        found = _find_next_header(view.buf, pos + 1, size)
        if found is None and not sealed:
            if _tail_kind(view.buf, pos, size) == "torn":
                return "end", pos  # a torn or in-flight tail: never served
            # Damage that does not frame at the end of the newest segment: nothing can be read
            # after it (the writer refuses to append after it either).
            if (base, pos) != self.reported_at:
                self._report(base, pos, -1)
                self.reported_at = (base, pos)
            return "end", pos
        # Bytes that do not frame, with valid batches after them or in a sealed segment.
        self._report(base, pos, found[1].base - 1 if found else -1)
        return ("skip", found[0]) if found else ("next", 0)

    def _lost_before(self, nxt: int, segs: list[int], done: int) -> bool:
        """Offsets between the segment just read and the next one have no file: a segment was
        deleted by hand or lost. Reported like corruption (True: the read range ends inside the
        hole). Retention only ever removes the oldest segments, so a hole with nothing before it
        is records aging out under a slow reader, not damage."""
        first, stop = self.next_offset, self.stop
        if nxt <= first or segs[0] >= nxt or self.reported_in == done:
            return False
        last = nxt - 1 if stop is None else min(nxt, stop) - 1
        seg = fmt.segment_name(nxt)
        if not self.skip_corrupt:
            raise CorruptRecord(
                f"offsets {first}..{last} are missing: their segment file, before {seg}, is gone; "
                "pass --skip-corrupt to read past them",
                first,
                seg,
                0,
            )
        if self.on_corrupt is not None:
            self.on_corrupt(CorruptRange(first, last, seg, 0))
        return stop is not None and stop <= nxt

    def _report(self, base: int, pos: int, last_offset: int) -> None:
        seg = fmt.segment_name(base)
        first = self.next_offset
        self.reported_in = base  # what follows in this segment is already accounted for
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
        self, view: _View, base: int, pos: int, hdr: fmt.BatchHeader, extent: int
    ) -> tuple[list[Record], CorruptRecord | None]:
        """A batch that failed its CRC in the middle of the log: find the bad records."""
        good, bad = fmt.check_records(view.buf, pos + fmt.BATCH_SIZE, extent)
        seg = fmt.segment_name(base)
        bad_offsets = [o for o, _ in bad if hdr.base <= o < hdr.end]
        first_bad = bad_offsets[0] if bad_offsets else hdr.base
        where = bad[0][1] if bad else pos
        good = [r for r in good if hdr.base <= r[0] < hdr.end]
        if not self.skip_corrupt:
            if not bad:
                first_bad = hdr.base  # the records check out but the batch does not: trust none
            return good, CorruptRecord(
                f"corrupt record at offset {first_bad} (segment {seg}, byte {where}): CRC mismatch; "
                "pass --skip-corrupt to read past it",
                first_bad,
                seg,
                where,
            )
        if self.on_corrupt is not None:
            have = {r[0] for r in good}
            missing = [o for o in range(hdr.base, hdr.end) if o not in have]
            for o in _runs(missing):
                self.on_corrupt(CorruptRange(o[0], o[1], seg, where))
        return good, None


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
    if any(not (n.startswith(f".{CONFIG_NAME}.") and n.endswith(".tmp")) for n in names):
        raise TopicError(
            f"{directory} is a directory that is not a topic (no {CONFIG_NAME}) and not empty: "
            "give a new or empty directory"
        )


class LogWriter:
    """The one writer of a topic. `append` returns once the batch is durable (fdatasync)."""

    def __init__(self, directory: Path, config: TopicConfig | None = None, create: bool = True):
        self.dir = directory
        exists = (directory / CONFIG_NAME).is_file()
        if not exists and not create:
            raise TopicNotFound(f"topic {directory} does not exist")
        if not exists:
            parent_new = not directory.exists()
            if not parent_new:
                _check_unclaimed(directory)
            directory.mkdir(parents=True, exist_ok=True)
            if parent_new:
                fsync_dir(directory.parent)
        self.config = config or TopicConfig.load(directory)
        if config is not None or not exists:
            self.config.save(directory)
        self.lock_fd = os.open(directory / "writer.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.lock_fd)
            raise WriterBusy(f"topic {directory} is being written by another process") from None
        self.fd = -1
        self.idx_fd = -1
        try:
            self._recover()
        except BaseException:
            self.close()
            raise

    # -- opening and recovery -------------------------------------------------------------------

    def _recover(self) -> None:
        segs = _list_segments(self.dir)
        if not segs:
            self._new_segment(0)
            self.last_ts = 0
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
        self._apply_retention()

    def _valid_prefix(self, base: int, view: _View) -> tuple[int, int, int]:
        """(bytes to keep, end offset, newest timestamp) of the newest segment.

        Only a torn tail is cut (see _tail_kind): a batch cut short, or zeros. A full-length batch
        that fails its CRC, and damage with valid batches after it, stay for readers to report
        (and --skip-corrupt to step over); damage at the end that cannot be framed stops the writer.
        """
        size = view.size
        buf = view.buf
        index = _load_index(self.dir, base, size)
        # Start at the last index entry that checks out: a damaged one must not pass for the end.
        hint = _hint(buf, size, index, len(index[0]) - 1)
        end, pos, last_ts = hint if hint is not None else (base, 0, 0)
        pos, end, last_ts, state = _walk(buf, size, pos, end, last_ts)
        if state == "damaged":
            raise _tail_damage(base, pos, end, size)
        return pos, end, last_ts

    def _last_ts_before(self, segs: list[int]) -> int:
        log = TopicLog(self.dir)
        for base in reversed(segs[:-1]):
            ts = log._first_ts(base)
            if ts != 2**63 - 1:
                return ts
        return 0

    def _truncate_index(self, base: int, size: int) -> None:
        path = self.dir / fmt.index_name(base)
        offsets, _, _ = _load_index(self.dir, base, size)
        keep = len(offsets) * fmt.INDEX_SIZE
        with contextlib.suppress(FileNotFoundError), open(path, "r+b") as fh:
            if os.fstat(fh.fileno()).st_size != keep:
                fh.truncate(keep)

    def _new_segment(self, base: int) -> None:
        path = self.dir / fmt.segment_name(base)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        self.idx_fd = os.open(
            self.dir / fmt.index_name(base), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644
        )
        fsync_dir(self.dir)
        self.base = base
        self.next_offset = base
        self.size = 0
        self.last_index_pos = 0

    # -- appending ------------------------------------------------------------------------------

    def append(self, records: Sequence[fmt.Pending]) -> tuple[int, int]:
        """Appends one batch durably; returns (first offset, last offset)."""
        if not records:
            raise ValueError("append needs at least one record")
        if self.fd < 0:
            raise TopicError("writer is closed")
        now = now_ms()
        stamps: list[int] = []
        last = self.last_ts
        for rec in records:
            ts = rec[0] if rec[0] is not None else now
            last = ts if ts > last else last  # timestamps never go backwards: seeks stay exact
            stamps.append(last)
        first = self.next_offset
        data = fmt.encode_batch(first, records, stamps)
        if len(data) - fmt.BATCH_SIZE > fmt.MAX_BATCH_PAYLOAD:
            # Readers take a header claiming more for damage: a batch this big would be acknowledged
            # and then cut off as a torn tail. Split it, or refuse a record too big on its own.
            return self._append_split(records)
        if self.size and self.size + len(data) > self.config.segment_bytes:
            self._roll()
        pos = self.size
        view = memoryview(data)
        written = 0
        while written < len(data):
            written += os.pwrite(self.fd, view[written:], pos + written)
        os.fdatasync(self.fd)
        self.size = pos + len(data)
        if pos and pos - self.last_index_pos >= fmt.INDEX_INTERVAL:
            os.write(self.idx_fd, fmt.INDEX.pack(first, pos, stamps[0]))
            self.last_index_pos = pos
        self.next_offset = first + len(records)
        self.last_ts = last
        return first, self.next_offset - 1

    def _append_split(self, records: Sequence[fmt.Pending]) -> tuple[int, int]:
        """A batch over the payload limit: refuse a record too big alone (before writing anything),
        else append it as several batches."""
        sizes = [fmt.record_size(key, headers, value) for _, key, headers, value in records]
        for i, size in enumerate(sizes):
            if size > fmt.MAX_BATCH_PAYLOAD:
                raise RecordTooLarge(
                    f"record {i + 1} of the batch takes {size} bytes (key, headers and value); "
                    f"the embedded log stores at most {fmt.MAX_BATCH_PAYLOAD} bytes per record"
                )
        first, total, start = -1, 0, 0
        for i, size in enumerate(sizes):
            if total + size > fmt.MAX_BATCH_PAYLOAD:
                a, last = self.append(records[start:i])
                first = a if first < 0 else first
                start, total = i, 0
            total += size
        a, last = self.append(records[start:])
        return (a if first < 0 else first), last

    def _roll(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)
        os.close(self.idx_fd)
        self._new_segment(self.next_offset)
        self._apply_retention()

    def _apply_retention(self) -> None:
        retention_bytes, retention_ms = self.config.retention_bytes, self.config.retention_ms
        if retention_bytes is None and retention_ms is None:
            return
        segs = _list_segments(self.dir)
        sizes = {b: _file_size(self.dir / fmt.segment_name(b)) for b in segs}
        total = sum(sizes.values())
        log = TopicLog(self.dir)
        removed = False
        for i, base in enumerate(segs[:-1]):  # never the active segment
            too_big = retention_bytes is not None and total > retention_bytes
            # A sealed segment's newest record is no newer than the next segment's first one.
            too_old = retention_ms is not None and log._first_ts(segs[i + 1]) < now_ms() - retention_ms
            if not (too_big or too_old):
                break
            for name in (fmt.segment_name(base), fmt.index_name(base)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.dir / name)
            total -= sizes[base]
            removed = True
        if removed:
            fsync_dir(self.dir)

    def close(self) -> None:
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
        raise SpecError(f"bad topic name {name!r}: use letters, digits, '.', '_' or '-', or give a path")
    return name
