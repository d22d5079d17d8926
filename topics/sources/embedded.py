"""The embedded log as a Source and a Sink."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from topics.embedded.log import CorruptRange, LogWriter, TopicConfig, TopicLog
from topics.record import Record
from topics.sources.base import Appended, Pending


class EmbeddedSource:
    kind = "embedded"
    live_only = False
    monotonic_time = True

    def __init__(self, directory: Path, idle_timeout: float | None = None):
        self.log = TopicLog(directory)
        self.idle_timeout = idle_timeout
        self.url = str(directory)

    def first_offset(self) -> int:
        return self.log.first_offset()

    def end_offset(self) -> int:
        return self.log.end_offset()

    def check_end(self) -> None:
        self.log.check_end()

    def lost(self) -> list[tuple[int, int, str]]:
        return self.log.lost()

    def offset_for_time(self, ts_ms: int) -> int:
        return self.log.offset_for_time(ts_ms)

    def offset_before_end(self, n: int) -> int:
        return max(self.log.end_offset() - n, self.log.first_offset())

    def read(
        self,
        start: int,
        stop: int | None,
        follow: bool,
        skip_corrupt: bool = False,
        on_skip: Callable[[int, int, str], None] | None = None,
        on_gap: Callable[[int, int], None] | None = None,
    ) -> Iterator[list[Record]]:
        def report(r: CorruptRange) -> None:
            if on_skip is not None:
                on_skip(r.first, r.last, f"segment {r.segment}, byte {r.position}")

        return iter(
            self.log.reader(
                start, stop, follow, skip_corrupt, report, idle_timeout=self.idle_timeout, on_gap=on_gap
            )
        )

    def committed(self, group: str) -> int | None:
        return self.log.groups.committed(group)

    def commit(self, group: str, offset: int) -> None:
        self.log.groups.commit(group, offset)

    def groups(self) -> list[str]:
        return self.log.groups.groups()

    def close(self) -> None:
        pass


class EmbeddedSink:
    def __init__(self, directory: Path, config: TopicConfig | None = None):
        self.writer = LogWriter(directory, config)
        self.url = str(directory)

    def append(self, records: Sequence[Pending]) -> Appended:
        first, last = self.writer.append(records)
        return Appended(first, last, len(records))

    def close(self) -> None:
        self.writer.close()
