"""The interface every topic source and sink implements."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from topics.record import Headers, Record

# What a sink appends: (timestamp ms or None for "now", key, headers, value).
Pending = tuple[int | None, bytes | None, Headers, bytes]


class Source(Protocol):
    """A readable topic. Offsets are the source's own (log offset, stream sequence, arrival count)."""

    kind: str  # "embedded", "jetstream", "mqtt"
    url: str  # canonical description, stored in saved specs
    live_only: bool  # True: no history, no offsets to seek to (MQTT)
    monotonic_time: bool  # True: timestamps never decrease with offset, so time seeks are exact

    def first_offset(self) -> int: ...

    def end_offset(self) -> int: ...

    def offset_for_time(self, ts_ms: int) -> int: ...

    def offset_before_end(self, n: int) -> int: ...  # where the last n records start (tail -n, SPEC -N)

    def read(
        self,
        start: int,
        stop: int | None,
        follow: bool,
        skip_corrupt: bool = False,
        on_skip: Callable[[int, int, str], None] | None = None,
        on_gap: Callable[[int, int], None] | None = None,
    ) -> Iterator[list[Record]]: ...  # with follow, an empty list now and then while waiting

    def committed(self, group: str) -> int | None: ...

    def commit(self, group: str, offset: int) -> None: ...

    def groups(self) -> list[str]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Appended:
    """What one `Sink.append` did with its records: `stored + duplicates == len(records)`.

    A JetStream stream acknowledges a record whose Nats-Msg-Id is in its dedup window without
    storing it again (its ack says `duplicate`): counted apart, so a copy never reports records it
    did not store. `first`/`last` are the offsets of the first and last record stored by this
    append (None when none was, or where the topic has no offsets: MQTT); on JetStream they need not
    be contiguous (another publisher may interleave), `stored` is the count."""

    first: int | None
    last: int | None
    stored: int
    duplicates: int = 0


class Sink(Protocol):
    """A writable topic: each append is one durable batch, every record of it confirmed."""

    url: str

    def append(self, records: Sequence[Pending]) -> Appended: ...

    def close(self) -> None: ...
