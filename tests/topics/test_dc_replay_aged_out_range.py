"""A replay of a range retention had already deleted was silent (review, on-call at 3 a.m.):
`rq replay T --from 100 --to 200` on a topic now starting at 3000 printed nothing, no warning, no
`gap` event, exit 0 (and `--to 3005` started quietly at 3000), where a group whose committed offset
aged out is told `offsets 100..2999 aged out (retention) before they were read`. An offset asked
for by number is no longer clamped to the first one still there: the asked range that is gone is
told as a gap (warning + `gap` event, exit 0 as for a group), the done line's next_offset is past
it, and --save-spec pins it as aged_out. `start`, `+N` and a time bound ask for no offset known
lost: no gap. Embedded log and JetStream (max_msgs), against the real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import js_call, run_rq


def _events(out: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _aged_topic(tmp_path: Path) -> dict[str, str]:
    """A topic `t` whose offsets 0..2999 retention deleted: it holds 3000..3009."""
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    lines = b"".join(b"%d\n" % i for i in range(3000))
    r = run_rq("produce", "t", "--segment-bytes", "4K", "--retention-bytes", "20K", input=lines, env=env)
    assert r.returncode == 0, r.stderr
    r = run_rq("produce", "t", "--retention-bytes", "20K", input=b"x\n" * 10, env=env)
    assert r.returncode == 0, r.stderr
    r = run_rq("--json", "offsets", "t", env=env)
    assert r.returncode == 0, r.stderr
    assert b'"first":3000' in r.stdout.replace(b" ", b""), r.stdout  # retention did its work
    return env


def test_a_range_that_aged_out_whole_is_told_not_silent(tmp_path: Path) -> None:
    env = _aged_topic(tmp_path)
    r = run_rq("replay", "t", "--from", "100", "--to", "200", "--format", "raw", env=env)
    assert r.returncode == 0, r.stderr  # as for a group's aged-out offsets: told, exit 0
    assert r.stdout == b""
    assert b"offsets 100..199 aged out (retention) before they were read" in r.stderr, r.stderr
    r = run_rq("--json", "replay", "t", "--from", "100", "--to", "200", env=env)
    assert r.returncode == 0, r.stderr
    events = _events(r.stdout)
    assert events[0] == {
        "event": "gap",
        "topic": events[0]["topic"],
        "first": 100,
        "last": 199,
        "reason": "retention",
    }
    done = events[-1]
    assert done["event"] == "done" and done["records"] == 0
    assert done["start"] == 100 and done["next_offset"] == 200  # past what is gone for good


def test_a_range_that_aged_out_in_part_tells_the_part(tmp_path: Path) -> None:
    env = _aged_topic(tmp_path)
    r = run_rq("--json", "replay", "t", "--from", "100", "--to", "3005", env=env)
    assert r.returncode == 0, r.stderr
    events = _events(r.stdout)
    assert events[0]["event"] == "gap" and (events[0]["first"], events[0]["last"]) == (100, 2999)
    assert [e["offset"] for e in events[1:-1]] == list(range(3000, 3005))
    assert b"offsets 100..2999 aged out" in r.stderr
    # one offset: said in the singular
    r = run_rq("replay", "t", "--from", "2999", "--to", "3001", "--format", "raw", env=env)
    assert r.returncode == 0 and r.stdout == b"x\n", r.stderr
    assert b"offset 2999 aged out (retention) before it was read" in r.stderr, r.stderr


def test_start_and_a_time_bound_ask_for_nothing_known_lost(tmp_path: Path) -> None:
    env = _aged_topic(tmp_path)
    for spec in (
        ["--from", "start", "--to", "3002"],
        ["--from", "+0", "--to", "3002"],
        ["--from", "@0", "--to", "3002"],
    ):
        r = run_rq("--json", "replay", "t", *spec, env=env)
        assert r.returncode == 0, r.stderr
        assert [e.get("offset") for e in _events(r.stdout)[:-1]] == [3000, 3001], spec
        assert b"aged out" not in r.stderr, (spec, r.stderr)


def test_a_group_commit_moves_past_a_range_that_aged_out(tmp_path: Path) -> None:
    env = _aged_topic(tmp_path)
    r = run_rq(
        "replay", "t", "--group", "g", "--from", "100", "--to", "200", "--commit", "--format", "raw", env=env
    )
    assert r.returncode == 0, r.stderr
    r = run_rq("--json", "offsets", "t", env=env)
    assert b'"committed":200' in r.stdout.replace(b" ", b""), r.stdout  # was: nothing stored


def test_a_saved_spec_pins_the_aged_out_part_and_replays_it_told(tmp_path: Path) -> None:
    env = _aged_topic(tmp_path)
    spec = tmp_path / "s.json"
    r = run_rq(
        "replay", "t", "--from", "100", "--to", "3005", "--save-spec", str(spec), "--format", "raw", env=env
    )
    assert r.returncode == 0, r.stderr
    saved = json.loads(spec.read_bytes())
    assert (saved["start"], saved["stop"], saved["records"]) == (100, 3005, 5)
    assert saved["aged_out"] == [[100, 2999]]  # was: start 3000 and no word of 100..2999
    r = run_rq("replay", "--spec", str(spec), "--format", "raw", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"x\n" * 5
    assert b"offsets 100..2999 aged out" in r.stderr and b"replay matches spec" in r.stderr
    # the records it pins age out too: refused, never fewer records replayed
    r = run_rq(
        "produce", "t", "--segment-bytes", "4K", "--retention-bytes", "20K", input=b"y\n" * 9000, env=env
    )
    assert r.returncode == 0, r.stderr
    r = run_rq("replay", "--spec", str(spec), "--format", "raw", env=env)
    assert r.returncode != 0 and r.stdout == b"", r.stderr
    assert b"deleted (retention?)" in r.stderr, r.stderr


@pytest.mark.integration
def test_jetstream_a_range_below_the_first_sequence_is_told(nats_url: str) -> None:
    with made_streams(nats_url, "DCAGE") as make:
        name = make(max_msgs=10)

        async def fill(js: Any) -> None:
            for i in range(30):
                await js.publish(f"{name}.x", b"%d" % i)

        js_call(nats_url, fill)  # sequences 1..30; max_msgs keeps 21..30
        url = f"{nats_url}/{name}"
        r = run_rq("--json", "replay", url, "--from", "5", "--to", "12", env={})
        assert r.returncode == 0, r.stderr
        events = _events(r.stdout)
        assert [(e["event"], e.get("first"), e.get("last")) for e in events] == [
            ("gap", 5, 11),
            ("done", None, None),
        ], events
        assert events[-1]["records"] == 0 and events[-1]["next_offset"] == 12
        assert b"offsets 5..11 aged out (retention) before they were read" in r.stderr, r.stderr
        r = run_rq("--json", "replay", url, "--from", "5", "--to", "23", env={})
        assert r.returncode == 0, r.stderr
        events = _events(r.stdout)
        assert (events[0]["event"], events[0]["first"], events[0]["last"]) == ("gap", 5, 20)
        assert [e["offset"] for e in events[1:-1]] == [21, 22]
        r = run_rq("--json", "replay", url, "--from", "start", "--to", "23", env={})
        assert r.returncode == 0 and b"aged out" not in r.stderr, r.stderr
        assert [e.get("offset") for e in _events(r.stdout)[:-1]] == [21, 22]
