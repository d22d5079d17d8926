"""The read loop on a real embedded log: time bounds with --follow (records stamped by hand)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from topics.embedded.log import LogWriter, now_ms
from topics.pipeline import Request, run
from topics.plan import resolve_window
from topics.sources.embedded import EmbeddedSource
from topics.spec import parse_position


def follow(topic: Path, start: str | None, stop: str | None, **kw: object) -> tuple[list[bytes], int]:
    source = EmbeddedSource(topic, idle_timeout=20)
    win = resolve_window(
        source, parse_position(start) if start else None, parse_position(stop) if stop else None, True
    )
    seen: list[bytes] = []
    req = Request(win.start, win.stop, True, win.time_from, win.time_to, **kw)  # type: ignore[arg-type]
    res = run(source, req, lambda recs, _d: seen.extend(bytes(r[4]) for r in recs))
    return seen, res.next_offset


def test_a_future_time_bound_holds_with_follow(tmp_path: Path) -> None:
    t = tmp_path / "t"
    t0 = now_ms()
    with LogWriter(t) as w:
        w.append([(t0 - 1000, None, (), b"old")])
    hour = 3_600_000

    def later() -> None:
        time.sleep(0.3)
        with LogWriter(t, max_ahead_ms=None) as w:  # stamps hours ahead stand for records yet to come
            w.append([(t0, None, (), b"before t"), (t0 + 2 * hour, None, (), b"after t")])
            w.append([(t0 + 3 * hour, None, (), b"much later")])

    writer = threading.Thread(target=later)
    writer.start()
    # --from @+1h -f: nothing stamped before t, though it was written after the read began
    assert follow(t, "@+1h", None, count=1) == ([b"after t"], 3)
    writer.join()
    # --to @+1h -f: waits for t (not the end the topic had), stops at the first record after it
    assert follow(t, "start", "@+1h") == ([b"old", b"before t"], 2)


def test_a_follow_with_a_time_end_stops_when_the_clock_passes_it(tmp_path: Path) -> None:
    t = tmp_path / "t"
    with LogWriter(t) as w:
        w.append([(None, None, (), b"a")])
    assert follow(t, "start", "@+300ms") == ([b"a"], 1)
