"""A follow `--to @t` that ends on the clock reads what was written before t first (review fx4).

pipeline.run stopped at the first "nothing yet" after the clock passed t. The embedded reader says
"nothing yet" after sleeping its 50 ms poll without looking again, so records written during that
sleep (stamped before t: part of the window) were never read: `rq replay kr --from $s --to @$t -f`
gave 740 lines where the same window replayed afterwards held 758-761. The interleaving is injected
here: a record is appended while the reader "sleeps", just before its first empty batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from topics.embedded.log import LogWriter, now_ms
from topics.pipeline import Request, run
from topics.record import Record
from topics.sources.embedded import EmbeddedSource


class _WrittenWhileItWaits:
    """An embedded source whose follow gets `landing[i]` appended just before its i-th empty batch."""

    def __init__(self, source: EmbeddedSource, writer: LogWriter, landing: list[Any]):
        self._source, self._writer, self._landing = source, writer, landing
        self.empty_batches = 0

    def read(self, *args: Any, **kw: Any) -> Iterator[list[Record]]:
        for batch in self._source.read(*args, **kw):
            if not batch:
                self.empty_batches += 1
                if self._landing:
                    self._writer.append([self._landing.pop(0)])
            yield batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)


def _follow_to(topic: Path, hi: int, landing: list[Any]) -> tuple[list[bytes], _WrittenWhileItWaits]:
    seen: list[bytes] = []
    with LogWriter(topic) as w:
        source = _WrittenWhileItWaits(EmbeddedSource(topic, idle_timeout=20), w, landing)
        req = Request(0, None, True, None, hi)
        run(source, req, lambda recs, _d: seen.extend(bytes(r[4]) for r in recs))  # type: ignore[arg-type]
    return seen, source


def test_records_written_while_the_reader_waited_are_read_before_the_clock_ends_it(tmp_path: Path) -> None:
    topic = tmp_path / "kr"
    hi = now_ms() - 60_000  # the clock is past t from the start: the first empty batch ends it
    with LogWriter(topic) as w:
        w.append([(hi - 100, None, (), b"1"), (hi - 90, None, (), b"2")])
    seen, _ = _follow_to(topic, hi, landing=[(hi - 50, None, (), b"written during the wait")])
    assert seen == [b"1", b"2", b"written during the wait"]


def test_a_follow_that_ends_on_the_clock_still_ends(tmp_path: Path) -> None:
    """Nothing lands: it stops once it has found the end again (a guard: passes on the old code)."""
    topic = tmp_path / "kr"
    hi = now_ms() - 60_000
    with LogWriter(topic) as w:
        w.append([(hi - 100, None, (), b"1")])
    seen, source = _follow_to(topic, hi, landing=[])
    assert seen == [b"1"]
    assert source.empty_batches >= 1


def test_a_record_at_or_after_t_read_in_the_drain_ends_it_there(tmp_path: Path) -> None:
    topic = tmp_path / "kr"
    hi = now_ms() - 60_000
    with LogWriter(topic) as w:
        w.append([(hi - 100, None, (), b"1")])
    landing = [(hi - 1, None, (), b"before t"), (hi, None, (), b"at t")]
    seen, _ = _follow_to(topic, hi, landing=landing)
    assert seen == [b"1", b"before t"]
