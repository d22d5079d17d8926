"""Replay specs: what `--save-spec` writes and `--spec` replays and verifies.

A spec pins a replay to exact offsets, so replaying it later yields the same records in the same
order or fails loudly: the digest covers each replayed record's offset, timestamp, key, headers and
value (xxh3-128, length-framed; see pipeline.digest_records).

To record the exact sequence a training script consumed, read with `digest=True` and keep the
spec of what the read returned (the CLI's --save-spec does the same):

    req = Request(start=source.first_offset(), stop=source.end_offset(), digest=True)
    res = run(source, req, emit)
    ReplaySpec.from_result(source, req, res).save(Path("run42.json"))

To replay it later, `replay_spec` is the whole check (the CLI uses the same steps):

    spec = ReplaySpec.load(Path("run42.json"))
    source = open_source(parse_topic(spec.source, topics_dir))
    try:
        replay_spec(source, spec, emit)  # DigestMismatch if the records are not the ones pinned
    finally:
        source.close()
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass
from dataclasses import fields as dataclass_fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from topics.embedded.files import not_writable, write_atomic
from topics.errors import DigestMismatch, SpecError, SpecFileNotFound, Unsupported, as_int
from topics.expr import compile_where
from topics.pipeline import Emit, Rate, Request, Result, dry_run, run
from topics.sources.base import Source

VERSION = 1
# The spec's version ("rq_replay_spec"). Not raised when time_from, time_to and aged_out were added:
# every rq refuses a field it does not know (this one in one line; the rqs from before those fields
# with "unexpected keyword argument"), so no rq replays a spec without the bounds it pins; a version
# 2 would only have changed their message. A change in what a field already there means raises it;
# a newer version is refused (Unsupported, rq exit 10).

LATER_FIELDS = ("time_from", "time_to", "aged_out")  # not in the first version-1 specs


def _as_int(value: Any) -> int:
    """An integer of another type in a spec's field (numpy's int64 offsets): stored as an int."""
    number = as_int(value)
    if number is None:
        raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")
    return number


@dataclass
class ReplaySpec:
    source: str  # canonical topic (path or URL)
    kind: str
    start: int  # first offset read (inclusive)
    stop: int  # end offset (exclusive): exact, resolved when the spec was saved
    records: int  # how many records were replayed (after --where)
    digest: str
    from_spec: str | None = None  # the SPEC as the user wrote it, for people reading the file
    to_spec: str | None = None
    group: str | None = None
    where: str | None = None
    fields: str | None = None
    first_offset: int | None = None
    last_offset: int | None = None
    created: str | None = None
    # Exact time bounds (Unix ms) the replay applied record by record: a follow from a time still
    # to come starts at the end offset and drops what is stamped before it. Replayed with them.
    time_from: int | None = None
    time_to: int | None = None
    # Offsets [first, last] inside start..stop that retention deleted before the replay read them:
    # never replayed, so not in the digest (a copy that still holds them does not match the spec).
    aged_out: list[list[int]] | None = None

    @classmethod
    def from_result(
        cls,
        source: Source,
        req: Request,
        res: Result,
        stop: int | None = None,
        *,
        from_spec: str | None = None,
        to_spec: str | None = None,
        group: str | None = None,
        fields: str | None = None,
    ) -> ReplaySpec:
        """The spec that pins what `run(source, req, emit)` emitted, `res` being its Result: the
        offsets read, `req`'s --where and time bounds, the count and digest, and the offsets that
        aged out unread. `req` must ask for the digest (Request(digest=True)). `stop`: where the
        pinned range ends, by default where the read ended (`req.stop`, or the position reached
        when it followed or stopped at its --count); never at or below the last record emitted
        (SpecError: the digest covers it). The keyword fields only describe the replay
        for people reading the file (the SPECs as written, the group, --fields)."""
        if not req.digest:
            raise SpecError("a replay spec needs the read's digest: read with Request(digest=True)")
        if stop is None:
            cut = req.count is not None and res.emitted >= req.count
            stop = req.stop if req.stop is not None and not cut else res.next_offset
        elif res.last_offset is not None and stop <= res.last_offset:
            # The count and digest cover records up to last_offset: a stop at or below it pinned
            # records outside the range, a spec whose every replay fails "data changed".
            raise SpecError(
                f"stop={stop} would leave out records the read emitted and digested (up to offset "
                f"{res.last_offset}): to pin less, read less (Request(stop=...) or count=...)"
            )
        url = source.url
        if source.kind == "embedded" and not os.path.isabs(url):
            # canonical, as the CLI stores it: a relative path named another topic once replayed
            # from another working directory
            url = os.path.abspath(os.path.expanduser(url))
        return cls(
            source=url,
            kind=source.kind,
            start=req.start,
            stop=max(stop, req.start),
            records=res.emitted,
            digest=res.digest,
            from_spec=from_spec,
            to_spec=to_spec,
            group=group,
            where=req.where.text if req.where is not None else None,
            fields=fields,
            first_offset=res.first_offset,
            last_offset=res.last_offset,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            time_from=req.time_from,
            time_to=req.time_to,
            aged_out=[[a, b] for a, b in res.gaps if a < stop] or None,
        )

    def save(self, path: Path) -> None:
        # Fields added after the first rq_replay_spec 1 are left out while null (absent reads as
        # null here): a spec that pins no time bounds and lost nothing to retention is then the
        # file an older rq wrote, which it replays the same; one that pins them still carries
        # them, and the older rq, refusing a field it does not know, refuses it.
        body = {"rq_replay_spec": VERSION}
        body.update((k, v) for k, v in asdict(self).items() if v is not None or k not in LATER_FIELDS)
        try:
            data = orjson.dumps(body, option=orjson.OPT_INDENT_2, default=_as_int)
        except orjson.JSONEncodeError as exc:
            # a field of a type JSON cannot hold: refused in one line before anything is written
            raise SpecError(f"cannot save the replay spec {path}: {exc}") from None
        write_atomic(path, data + b"\n")

    @staticmethod
    def check_savable(path: Path) -> None:
        """Before a read whose spec is to be saved at `path`: its directory takes a new file. A
        read-only file system or a directory rq may not write in is told before anything is read,
        written out or committed, not once the replay is over (its spec lost, the group moved).
        A disk that fills meanwhile can still fail `save`."""
        probe = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
        try:
            try:
                os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(probe)
        except OSError as exc:
            exc.filename = os.fspath(path)  # the spec asked for, not the probe's name
            raise not_writable(f"the replay spec {path}", exc) or exc from None

    @classmethod
    def load(cls, path: Path) -> ReplaySpec:
        try:
            data: Any = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            raise SpecFileNotFound(f"replay spec {path} does not exist") from None
        except IsADirectoryError:
            raise SpecError(
                f"replay spec {path} is a directory: name the spec file saved by --save-spec"
            ) from None
        except orjson.JSONDecodeError as exc:
            raise SpecError(f"replay spec {path} is not valid JSON: {exc}") from None
        version = data.get("rq_replay_spec") if isinstance(data, dict) else None
        if type(version) is int and version > VERSION:
            raise Unsupported(
                f"replay spec {path} is version {version}, newer than this rq understands "
                f"(it knows {VERSION}): upgrade rq to replay it"
            )
        if version != VERSION:
            raise SpecError(f"{path} is not an rq replay spec (version {VERSION})")
        given = {k: v for k, v in data.items() if k != "rq_replay_spec"}
        names = [f.name for f in dataclass_fields(cls)]
        unknown = [k for k in given if k not in names]
        if unknown:
            raise SpecError(
                f"replay spec {path} has fields this rq does not know: {', '.join(map(repr, unknown))} "
                "(saved by a newer rq?)"
            )
        missing = [f.name for f in dataclass_fields(cls) if f.name not in given and f.default is MISSING]
        if missing:
            raise SpecError(f"replay spec {path} lacks fields: {', '.join(missing)}")
        spec = cls(**given)
        for name in ("start", "stop", "records"):
            value = getattr(spec, name)
            if type(value) is not int or value < 0:  # not a bool either
                raise SpecError(f"replay spec {path}: {name} must be a non-negative integer")
        for name in ("source", "kind", "digest"):
            if not isinstance(getattr(spec, name), str):
                raise SpecError(f"replay spec {path}: {name} must be a string")
        for name in ("time_from", "time_to"):
            value = getattr(spec, name)
            if value is not None and type(value) is not int:
                raise SpecError(f"replay spec {path}: {name} must be an integer (Unix ms) or null")
        for name in ("where", "fields", "group"):
            if getattr(spec, name) is not None and not isinstance(getattr(spec, name), str):
                raise SpecError(f"replay spec {path}: {name} must be a string or null")
        if spec.stop < spec.start:
            raise SpecError(f"replay spec {path}: stop comes before start")
        return spec

    def request(
        self,
        source: Source,
        rate: Rate | None = None,
        skip_corrupt: bool = False,
        decode_values: bool = False,
    ) -> Request:
        """The read this spec pins on `source`, once the source is checked to still hold it:
        DigestMismatch, before anything is read for output, when records it pins were deleted
        (retention, or JetStream messages deleted inside the range) or the topic ends before
        `stop`. The spec's own --where and time bounds are applied; the caller picks the pace."""
        self._check_range(source)
        req = Request(
            start=self.start,
            stop=self.stop,
            time_from=self.time_from,
            time_to=self.time_to,
            time_per_record=True,  # the bounds the saved replay applied record by record
            where=compile_where(self.where) if self.where else None,
            rate=rate or Rate(),
            skip_corrupt=skip_corrupt,
            decode_values=decode_values,
            digest=True,
        )
        self._check_filtered_range(source, req)
        return req

    def verify(self, res: Result) -> None:
        """After the read: the records replayed are the ones pinned (count and digest), else
        DigestMismatch. What was emitted before it is raised is not what the spec pinned."""
        if res.emitted != self.records or res.digest != self.digest:
            raise DigestMismatch(
                f"REPLAY DOES NOT MATCH THE SPEC: {res.emitted} records with digest {res.digest}, "
                f"the spec pinned {self.records} records with {self.digest} — the data in offsets "
                f"{self.start}..{self.stop - 1} changed"
            )

    def _check_range(self, source: Source) -> None:
        first, end = source.first_offset(), source.end_offset()
        if self.records and self.start < first and (self.first_offset is None or self.first_offset < first):
            raise DigestMismatch(
                f"the spec starts at offset {self.start} but the topic now starts at {first}: "
                "records the spec pins were deleted (retention?)"
            )
        if self.stop > end and self.stop > self.start:  # an empty spec needs no offsets
            raise DigestMismatch(
                f"the spec needs offsets up to {self.stop - 1} but the topic ends at {end - 1}"
            )
        # A source whose messages can be deleted in the middle (JetStream) counts what is left first.
        check_range = getattr(source, "check_spec_range", None)
        if callable(check_range):
            check_range(self.start, self.stop, self.records)

    def _check_filtered_range(self, source: Source, req: Request) -> None:
        """A spec with --where over a source that deleted messages in its range: counting what is
        left cannot tell a deleted record the filter kept from one it dropped, so the range is read
        once without writing, and a replay that would not match fails before anything is written."""
        deleted_in = getattr(source, "deleted_in", None)
        if not self.where or not callable(deleted_in) or not deleted_in(self.start, self.stop):
            return
        dry = dry_run(source, req)
        if dry.emitted < self.records:
            raise DigestMismatch(
                f"records the spec pins were deleted: offsets {self.start}..{self.stop - 1} of "
                f"{source.url} hold {dry.emitted} records that pass its --where now, the spec "
                f"pinned {self.records}"
            )
        self.verify(dry)


def replay_spec(
    source: Source,
    spec: ReplaySpec,
    emit: Emit,
    rate: Rate | None = None,
    decode_values: bool = False,
    on_idle: Callable[[], None] | None = None,
) -> Result:
    """Replays exactly what `spec` pinned from `source` through `emit`, and proves it: the range
    is checked before the read (records deleted since: DigestMismatch, nothing emitted) and count
    and digest after it (data changed: DigestMismatch once the records read were emitted, so a
    caller that must not use them keeps them aside until this returns)."""
    req = spec.request(source, rate=rate, decode_values=decode_values)
    res = run(source, req, emit, on_idle=on_idle)
    spec.verify(res)
    return res
