"""The read loop shared by tail and replay: read batches, filter, count, digest, pace, emit.

Everything here works on whole batches; the per-record Python work is the filter (when given),
the digest (when asked for) and whatever the emitter does.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import xxhash

from topics.embedded.format import encode_headers
from topics.errors import SpecError, offset_arg, time_arg
from topics.expr import Context, Filter
from topics.record import Record
from topics.render import Decoded, decode, headers_json
from topics.sources.base import Source

Emit = Callable[[Sequence[Record], "Sequence[Decoded] | None"], None]
_DIGEST_HEAD = struct.Struct("<qqiII")


@dataclass
class Rate:
    """None: as fast as possible; otherwise a multiple of the records' own spacing."""

    speed: float | None = None

    @classmethod
    def parse(cls, text: str) -> Rate:
        t = text.strip().lower()
        if t == "max":
            return cls(None)
        if t == "original":
            return cls(1.0)
        if t.endswith("x"):
            try:
                speed = float(t[:-1])
            except ValueError:
                speed = -1.0
            if speed > 0:
                return cls(speed)
        raise SpecError(f"bad --rate {text!r}: use max, original, or a speed-up like 2x or 0.5x")


@dataclass
class Request:
    start: int
    stop: int | None = None  # exclusive
    follow: bool = False
    time_from: int | None = None  # exact time bounds, applied per record when the source needs it
    time_to: int | None = None
    time_per_record: bool = False  # apply them to every record (a saved spec's replay)
    where: Filter | None = None
    count: int | None = None
    rate: Rate = field(default_factory=Rate)
    skip_corrupt: bool = False
    decode_values: bool = False  # the emitter wants decoded values (json, template, fields)
    digest: bool = False

    def __post_init__(self) -> None:
        # A negative start told a phantom "aged out" gap and saved a spec its own load refuses;
        # 1.5 read on from 2 without a word.
        self.start = offset_arg("Request start", self.start)
        if self.stop is not None:
            self.stop = offset_arg("Request stop", self.stop)
        # A str, a datetime or NaN failed deep in the read (or compared False everywhere: nothing).
        if self.time_from is not None:
            self.time_from = time_arg("Request time_from", self.time_from)
        if self.time_to is not None:
            self.time_to = time_arg("Request time_to", self.time_to)


@dataclass
class Result:
    emitted: int = 0
    scanned: int = 0
    first_offset: int | None = None
    last_offset: int | None = None  # last emitted
    next_offset: int = 0  # consumption position: last record read + 1
    skipped: list[tuple[int, int, str]] = field(default_factory=list)
    # offsets first..last that retention deleted before the read got to them (never read)
    gaps: list[tuple[int, int]] = field(default_factory=list)
    skip_corrupt: bool = False  # the read skipped corrupt records (reported in res.skipped)
    hasher: xxhash.xxh3_128 = field(default_factory=xxhash.xxh3_128)

    @property
    def digest(self) -> str:
        return "xxh3_128:" + self.hasher.hexdigest()

    def snapshot(self) -> Result:
        """A copy that a read going on does not change (e.g. taken in on_progress, once a batch
        is out, to record a spec of what had been written when a stop comes mid-batch)."""
        return replace(self, skipped=list(self.skipped), gaps=list(self.gaps), hasher=self.hasher.copy())


def digest_records(hasher: xxhash.xxh3_128, records: Sequence[Record]) -> None:
    """Offset, timestamp, key, headers and value of each record, length-framed."""
    pack = _DIGEST_HEAD.pack
    update = hasher.update
    for offset, ts, key, headers, value in records:
        hdr = encode_headers(headers) if headers else b""
        update(pack(offset, ts, -1 if key is None else len(key), len(hdr), len(value)))
        if key:
            update(key)
        if hdr:
            update(hdr)
        update(value)


def _context(rec: Record, decoded: Decoded) -> Context:
    key = rec[2]
    headers = headers_json(rec[3]) if rec[3] else {}
    return Context(
        decoded[0],
        rec[0],
        rec[1],
        None if key is None else key.decode("utf-8", "replace"),
        headers,
    )


class Pacer:
    """Sleeps so records leave at their original spacing divided by `speed`; a long sleep is cut
    into slices with `on_idle` called between them (a caller may stop there)."""

    SLICE_S = 0.1

    def __init__(self, speed: float, on_idle: Callable[[], None] | None = None):
        self.speed = speed
        self.t0: int | None = None
        self.wall0 = 0.0
        self.on_idle = on_idle

    def split(self, records: Sequence[Record]) -> Iterator[Sequence[Record]]:
        i = 0
        while i < len(records):
            ts = records[i][1]
            if self.t0 is None:
                self.t0, self.wall0 = ts, time.monotonic()
            due = self.wall0 + (ts - self.t0) / 1000.0 / self.speed
            delay = due - time.monotonic()
            while delay > 0:
                time.sleep(min(delay, self.SLICE_S) if self.on_idle is not None else delay)
                if self.on_idle is not None:
                    self.on_idle()
                delay = due - time.monotonic()
            j = i + 1
            while j < len(records) and records[j][1] == ts:
                j += 1
            yield records[i:j]
            i = j


def run(
    source: Source,
    req: Request,
    emit: Emit,
    result: Result | None = None,
    on_progress: Callable[[Result], None] | None = None,
    on_idle: Callable[[], None] | None = None,
    on_aged_out: Callable[[int, int], None] | None = None,
    on_skipped: Callable[[int, int, str], None] | None = None,
) -> Result:
    """Reads [start, stop) (or follows), emits what passes the filters; returns the tally.

    `on_idle` is called whenever nothing is emitted for a while: the source is waiting for new
    records (a follow polls about every 50 ms), a batch left nothing after the filters, or the
    pacer sleeps. It may raise to end the read (the CLI does when stdout's reader has gone).
    `on_skipped(first, last, where)` tells each range --skip-corrupt stepped over (all are kept
    in `res.skipped` too) once the batch read with it has been emitted: a follow may run for days."""
    res = result or Result()
    res.next_offset = req.start
    res.skip_corrupt = req.skip_corrupt
    told = [0]  # res.skipped[: told[0]] went to on_skipped

    def on_skip(first: int, last: int, where: str) -> None:
        res.skipped.append((first, last, where))

    def tell_skips(before: int | None = None) -> None:
        """Those not told yet (only those that start before offset `before`, if given)."""
        while on_skipped is not None and told[0] < len(res.skipped):
            skip = res.skipped[told[0]]
            if before is not None and skip[0] >= before:
                return
            told[0] += 1
            on_skipped(*skip)

    where = req.where
    need_decode = req.decode_values or (where is not None and where.uses_value)
    timed = req.time_from is not None or req.time_to is not None
    # A source whose stamps may go backwards needs the time bounds record by record; so does a
    # follow, whose bounds may lie in the future (nothing stamped at or after t when it resolved).
    time_filter = timed and (req.follow or not source.monotonic_time or req.time_per_record)
    lo = req.time_from if req.time_from is not None else -(2**63)
    hi = req.time_to if req.time_to is not None else 2**63 - 1
    stop_on_time = req.follow and req.time_to is not None
    pacer = Pacer(req.rate.speed, on_idle) if req.rate.speed else None
    remaining = req.count
    if remaining is not None and remaining <= 0:
        return res

    def on_gap(first: int, last: int) -> None:
        res.gaps.append((first, last))
        # gone for good: the consumption position moves past them (a range that aged out whole,
        # `--from 100 --to 200` on a topic now starting at 3000, read nothing and stayed at 100,
        # so `--commit` stored nothing and the done line's next_offset pointed into the gap)
        res.next_offset = max(res.next_offset, last + 1)
        if on_aged_out is not None:
            on_aged_out(first, last)  # told as it happens: a follow may run for days

    # --to @t with --follow once the clock has passed t: records stamped before t may still have
    # landed while the source waited for more (the embedded reader sleeps its poll, then says
    # "nothing yet" without looking again), so the read goes on to the end it finds next and stops
    # at the next "nothing yet", never at the first one after t.
    draining = False
    for batch in source.read(req.start, req.stop, req.follow, req.skip_corrupt, on_skip, on_gap):
        if not batch:
            tell_skips()  # nothing of this read left to write out first
            if draining:
                break  # what was written before t has been read
            if stop_on_time and time.time_ns() // 1_000_000 >= hi:
                draining = True  # t has passed: read to the end once more, then stop
                continue
            if on_idle is not None:
                on_idle()
            continue
        # a skip found while this batch was read lies before it (a damaged segment stepped over
        # on the way) or inside it: told before its records, or after them
        tell_skips(before=batch[0][0])
        res.scanned += len(batch)
        read_to = batch[-1][0] + 1  # consumption position, whatever the filters keep
        past_end = False
        if time_filter:
            if stop_on_time:
                late = next((i for i, r in enumerate(batch) if r[1] >= hi), None)
                if late is not None:  # the first record at or after --to @t ends a follow
                    read_to, past_end = batch[late][0], True
                    batch = batch[:late]
            batch = [r for r in batch if lo <= r[1] < hi]
        decoded: list[Decoded] | None = [decode(r[4]) for r in batch] if need_decode else None
        if where is not None:
            keep = [
                i
                for i, r in enumerate(batch)
                if where(_context(r, decoded[i] if decoded is not None else (None, "none")))
            ]
            if len(keep) != len(batch):
                batch = [batch[i] for i in keep]
                if decoded is not None:
                    decoded = [decoded[i] for i in keep]
        if remaining is not None and len(batch) >= remaining:
            batch = batch[:remaining]
            decoded = decoded[:remaining] if decoded is not None else None
            read_to = batch[-1][0] + 1  # stopping early: consumed up to the last one emitted
        if batch:
            if req.digest:
                digest_records(res.hasher, batch)
            if res.first_offset is None:
                res.first_offset = batch[0][0]
            res.last_offset = batch[-1][0]
            res.emitted += len(batch)
            if pacer is None:
                emit(batch, decoded)
            else:
                done = 0
                for part in pacer.split(batch):
                    emit(part, decoded[done : done + len(part)] if decoded is not None else None)
                    done += len(part)
        elif on_idle is not None:
            on_idle()
        if remaining is not None:
            remaining -= len(batch)
        res.next_offset = max(read_to, res.next_offset)
        if on_progress is not None:
            on_progress(res)
        tell_skips()
        if past_end or (remaining is not None and remaining <= 0):
            break
    tell_skips()  # found by the read's last step (not after an exception: the caller has res.skipped)
    return res


def dry_run(source: Source, req: Request) -> Result:
    """What a read would emit (count and digest), with nothing emitted: a saved spec's replay
    checked before it writes anything (and paced at full speed: nothing is shown)."""
    return run(source, replace(req, rate=Rate(), decode_values=False, digest=True), lambda _r, _d: None)
