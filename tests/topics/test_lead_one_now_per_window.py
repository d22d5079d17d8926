"""resolve_window read the clock once per bound: `--from @-1h --to @-59m` found its start offset
with one "now" and recorded `time_from` with a later one, so the read began with records stamped
before its own time_from (ck: ~30-50 of them on a topic with 2 records per ms), and `rq replay
--spec`, which filters by the saved bounds, failed "the data ... changed" on a topic nobody
touched. A window now reads the clock once: here a clock that moves 7 ms per reading."""

from __future__ import annotations

import itertools
from pathlib import Path

from topics.embedded.log import LogWriter
from topics.plan import resolve_window
from topics.sources.embedded import EmbeddedSource
from topics.spec import parse_position

BASE = 1_700_000_000_000
HOUR = 3_600_000


def test_a_relative_window_agrees_with_the_offsets_it_resolved_to(tmp_path: Path) -> None:
    topic = tmp_path / "t"
    with LogWriter(topic) as w:  # one record per ms from an hour and 100 ms before "now" on
        w.append([(BASE - HOUR - 100 + i, None, (), b"%d" % i) for i in range(400)])
    ticks = itertools.count()

    def clock() -> int:  # each reading is 7 ms later than the one before
        return BASE + 7 * next(ticks)

    source = EmbeddedSource(topic)
    win = resolve_window(source, parse_position("@-1h"), parse_position("@-59m59900ms"), False, now_ms=clock)
    assert win.time_from is not None and win.time_to is not None
    assert win.time_to - win.time_from == HOUR - (59 * 60_000 + 59_900)
    # the first record read is the first stamped at or after time_from, the stop the first at or after time_to
    assert win.start == win.time_from - (BASE - HOUR - 100)
    assert win.stop == win.time_to - (BASE - HOUR - 100)
