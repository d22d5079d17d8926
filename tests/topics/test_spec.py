"""SPEC grammar: parsing, range order, resolution against a topic's bounds; saved-spec checks (unit tests)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from topics.errors import SpecError
from topics.plan import parse_window, resolve_window
from topics.savedspec import ReplaySpec
from topics.spec import parse_duration_ms, parse_position, parse_range, resolve


@dataclass
class FakeTopic:
    """Bounds of a topic with offsets first..end-1 and the given timestamps (pure, no I/O)."""

    first: int
    stamps: list[int] = field(default_factory=list)
    kind: str = "fake"
    url: str = "fake"
    live_only: bool = False
    monotonic_time: bool = True

    def first_offset(self) -> int:
        return self.first

    def end_offset(self) -> int:
        return self.first + len(self.stamps)

    def offset_for_time(self, ts_ms: int) -> int:
        return self.first + bisect.bisect_left(self.stamps, ts_ms)

    def offset_before_end(self, n: int) -> int:
        return max(self.end_offset() - n, self.first)


TOPIC = FakeTopic(first=100, stamps=[1000 + 10 * i for i in range(50)])  # offsets 100..149


@pytest.mark.parametrize(
    ("text", "offset"),
    [
        ("start", 100),
        ("end", 150),
        ("120", 120),
        ("5", 100),  # before the first offset still there: clamped
        ("+3", 103),
        ("-3", 147),
        ("-500", 100),
        ("@1000", 100),
        ("@1005", 101),  # the first record at or after the time
        ("@1490", 149),
        ("@1491", 150),
        ("@1970-01-01T00:00:01.005Z", 101),
        ("@1970-01-01T00:00:01.005+00:00", 101),
    ],
)
def test_positions_resolve(text: str, offset: int) -> None:
    assert resolve(parse_position(text), TOPIC) == offset


def test_relative_time_uses_the_clock() -> None:
    pos = parse_position("@-1h")
    assert pos.kind == "ago" and pos.value == 3_600_000
    assert resolve(pos, TOPIC, now_ms=lambda: 3_600_000 + 1200) == 120
    assert parse_position("@-1h30m").value == 5_400_000
    assert parse_position("@-500ms").value == 500
    assert parse_position("@-2500").value == 2500


@pytest.mark.parametrize(
    "bad",
    ["@yesterday", "yesterday", "5:3", "@2026-13-01T00:00:00Z", "+", "-x", "@-1y", "1.5", "@-", "10:@5:3"],
)
def test_bad_specs_are_spec_errors(bad: str) -> None:
    with pytest.raises(SpecError):
        parse_range(bad)


def test_ranges() -> None:
    r = parse_range("10:20")
    assert (r.start.value, r.stop and r.stop.value) == (10, 20)
    r = parse_range("@2026-11-22T10:00:00Z:@2026-11-22T11:00:00Z")
    assert r.start.kind == "time" and r.stop is not None and r.stop.value - r.start.value == 3_600_000
    assert parse_range(":5").start.text == "start"
    assert parse_range("-5:").stop is not None and parse_range("-5:").stop.text == "end"  # type: ignore[union-attr]
    # A full RFC 3339 time on its own is one position, not a range split at a colon.
    assert parse_range("@2026-11-22T10:00:30").stop is None
    with pytest.raises(SpecError):
        parse_range("@2026-11-22T11:00:00Z:@2026-11-22T10:00:00Z")


def test_window_exits_at_the_end_without_follow() -> None:
    start, stop = parse_window("120", "1000000")
    w = resolve_window(TOPIC, start, stop, follow=False)  # type: ignore[arg-type]
    assert (w.start, w.stop) == (120, 150)
    w = resolve_window(TOPIC, start, stop, follow=True)  # type: ignore[arg-type]
    assert w.stop == 1_000_000
    w = resolve_window(TOPIC, None, None, follow=False, committed=140)  # type: ignore[arg-type]
    assert (w.start, w.stop) == (140, 150)
    with pytest.raises(SpecError):
        parse_window("1:5", "7")
    with pytest.raises(SpecError):
        parse_window("9", "3")


def test_durations() -> None:
    assert parse_duration_ms("2d") == 172_800_000
    with pytest.raises(SpecError):
        parse_duration_ms("1h1")


@given(st.text(max_size=40))
def test_any_text_parses_or_raises_spec_error(text: str) -> None:
    try:
        parse_range(text)
    except SpecError:
        pass


@given(st.integers(0, 10**12), st.integers(0, 10**12))
def test_offset_ranges_are_ordered(a: int, b: int) -> None:
    if b < a:
        with pytest.raises(SpecError):
            parse_range(f"{a}:{b}")
    else:
        r = parse_range(f"{a}:{b}")
        assert r.start.value == a and r.stop is not None and r.stop.value == b


@given(st.integers(0, 60), st.integers(0, 60))
def test_time_resolution_is_exact(i: int, delta: int) -> None:
    """The resolved offset is the first whose timestamp >= t: nothing before t, nothing skipped."""
    ts = 1000 + 10 * i - delta
    off = resolve(parse_position(f"@{ts}"), TOPIC)
    stamps = TOPIC.stamps
    assert all(s < ts for s in stamps[: off - 100])
    assert all(s >= ts for s in stamps[off - 100 :])


@pytest.mark.parametrize(
    "bad", ["²", "+²", "@²", "@99999999999999999999", "@-99999999999w", "@-999999999999999999"]
)
def test_odd_digits_and_huge_times_are_spec_errors(bad: str) -> None:
    with pytest.raises(SpecError):
        parse_range(bad)


@pytest.mark.parametrize(
    ("field", "value"),
    [("source", 5), ("where", 5), ("fields", ["a"]), ("digest", None), ("start", True), ("stop", -1)],
)
def test_saved_spec_with_wrong_types_is_a_spec_error(tmp_path: Path, field: str, value: object) -> None:
    good = ReplaySpec(source="/t", kind="embedded", start=0, stop=3, records=3, digest="xxh3_128:0")
    path = tmp_path / "s.json"
    good.save(path)
    assert ReplaySpec.load(path) == good
    body = orjson.loads(path.read_bytes())
    body[field] = value
    path.write_bytes(orjson.dumps(body))
    with pytest.raises(SpecError, match=field):
        ReplaySpec.load(path)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2004-03-13T23:55:30.570Z", 1079222130570),  # float arithmetic made this ...569
        ("2004-03-13t23:55:30.570z", 1079222130570),  # RFC 3339 allows lowercase t and z
        ("2004-03-13T23:55:30Z", 1079222130000),
        ("2004-03-13T23:55:30.000500Z", 1079222130001),  # below a ms: rounds up (at or after)
        ("2004-03-13T23:55:30.0000000001Z", 1079222130001),  # more digits than microseconds
        ("2004-03-13T23:55:30.9999Z", 1079222131000),
        ("2004-03-14T00:55:30.570+01:00", 1079222130570),
        ("2004-03-13", 1079136000000),
        ("1969-12-31T23:59:59.999Z", -1),
    ],
)
def test_rfc3339_times_are_exact_to_the_millisecond(text: str, ms: int) -> None:
    pos = parse_position("@" + text)
    assert (pos.kind, pos.value) == ("time", ms)
