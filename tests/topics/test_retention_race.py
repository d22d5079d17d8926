"""Readers and retention: a segment deleted under a reader, and records that age out unread.

Before: a segment deleted between the reader's listing and its open failed the read (exit 3 naming
the segment file); records a slow reader lost to retention were skipped with exit 0 and no word,
and `--commit` / `--save-spec` then covered records never replayed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rqtest import run_rq
from test_log import fill, value

import topics.embedded.log as logmod
from topics.embedded.log import LogWriter, TopicConfig, TopicLog


def _deleting_view(monkeypatch: pytest.MonkeyPatch, doomed: dict[str, list[Path]]) -> None:
    """Opening the segment named in `doomed` first deletes the files listed for it, as retention
    would in the moment between the reader's listing and its open."""
    real = logmod._View

    def view(path: Path) -> Any:
        for victim in doomed.pop(path.name, []):
            victim.unlink()
        return real(path)

    monkeypatch.setattr(logmod, "_View", view)


def _segments(topic: Path) -> list[Path]:
    return sorted(topic.glob("*.log"))


def _read(log: TopicLog, start: int, stop: int | None = None) -> tuple[list[int], list[tuple[int, int]]]:
    gaps: list[tuple[int, int]] = []
    offsets = [r[0] for b in log.reader(start, stop, on_gap=lambda a, z: gaps.append((a, z))) for r in b]
    return offsets, gaps


def test_a_segment_deleted_before_the_reader_opens_it_is_a_gap_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tmp_path / "t"
    fill(t, 400, batch=20, config=TopicConfig(segment_bytes=4_000))
    segs = _segments(t)
    assert len(segs) >= 4
    second = int(segs[1].stem)
    _deleting_view(monkeypatch, {segs[0].name: [segs[0]]})
    offsets, gaps = _read(TopicLog(t), 0)
    assert offsets == list(range(second, 400))
    assert gaps == [(0, second - 1)]


def test_segments_deleted_while_the_reader_is_in_an_older_one_are_a_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tmp_path / "t"
    fill(t, 400, batch=20, config=TopicConfig(segment_bytes=4_000))
    segs = _segments(t)
    second, third = int(segs[1].stem), int(segs[2].stem)
    # The reader holds segment 0 open; as it moves on, retention has deleted it and segment 1.
    _deleting_view(monkeypatch, {segs[1].name: [segs[0], segs[1]]})
    offsets, gaps = _read(TopicLog(t), 0)
    assert offsets == list(range(second)) + list(range(third, 400))
    assert gaps == [(second, third - 1)]
    # A bounded read reports only the part of the gap inside its range.
    fill(t2 := tmp_path / "t2", 400, batch=20, config=TopicConfig(segment_bytes=4_000))
    segs2 = _segments(t2)
    _deleting_view(monkeypatch, {segs2[1].name: [segs2[0], segs2[1]]})
    offsets, gaps = _read(TopicLog(t2), 0, second + 3)
    assert offsets == list(range(second)) and gaps == [(second, second + 2)]


def _age_out_front(topic: Path) -> int:
    """Retention by the writer (on open): only the newest segments of ~2 kB are kept."""
    with LogWriter(topic, TopicConfig(segment_bytes=4_000, retention_bytes=9_000)):
        pass
    return TopicLog(topic).first_offset()


def test_rq_says_which_offsets_aged_out_before_a_group_read_them(tmp_path: Path) -> None:
    topics_dir = tmp_path / "topics"
    t = topics_dir / "ev"
    fill(t, 400, batch=20, config=TopicConfig(segment_bytes=4_000))
    env = {"RQ_TOPICS_DIR": str(topics_dir)}
    r = run_rq("replay", "ev", "--group", "g", "--count", "10", "--commit", "-q", env=env)
    assert r.returncode == 0, r.stderr
    first = _age_out_front(t)
    assert first > 10
    spec = tmp_path / "run.json"
    r = run_rq(
        "replay",
        "ev",
        "--group",
        "g",
        "--commit",
        "--json",
        "--format",
        "raw",
        "--save-spec",
        str(spec),
        env=env,
    )
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    assert f"offsets 10..{first - 1} aged out (retention) before they were read" in err, err
    events = [json.loads(x) for x in r.stdout.decode().splitlines() if x.startswith("{")]
    gap = [e for e in events if e.get("event") == "gap"]
    assert gap and (gap[0]["first"], gap[0]["last"], gap[0]["reason"]) == (10, first - 1, "retention")
    saved = json.loads(spec.read_text())
    assert saved["aged_out"] == [[10, first - 1]] and saved["records"] == 400 - first
    # Nothing aged out: no warning, and the spec says so.
    r = run_rq("replay", "ev", "--from", str(first), "--format", "raw", "--save-spec", str(spec), env=env)
    assert r.returncode == 0 and b"aged out" not in r.stderr
    assert json.loads(spec.read_text()).get("aged_out") is None  # left out while null
    assert os.listdir(t)  # the topic is still there


# rq itself, with retention deleting the segments named in argv[1] at the moment the reader moves
# on from segment 0 (as in _deleting_view), which then waits for stdout's reader to leave.
_RQ_RETENTION_AS_HEAD_LEAVES = """
import select, sys, time
from pathlib import Path
import topics.embedded.log as logmod
real = logmod.LogReader._next_segment
victims, fired = sys.argv.pop(1).split(","), []
def next_segment(self, done):
    if not fired:
        fired.append(1)
        for victim in victims:
            Path(victim).unlink()
        poller = select.poll()
        poller.register(1, 0)  # POLLERR: head has gone
        until = time.monotonic() + 30
        while not poller.poll(50) and time.monotonic() < until:
            pass
    return real(self, done)
logmod.LogReader._next_segment = next_segment
from rqcli.console import main
main()
"""


def test_a_gap_line_that_finds_the_reader_gone_commits_nothing(tmp_path: Path) -> None:
    """`rq replay --group g --commit --json | head -n 1`, with retention deleting the next segment
    while rq is in the first: the {"event":"gap"} line was the write that found head gone, raised
    BrokenPipeError rather than ReaderLeft, and the group was committed past the 19 records head
    never read. Now it is a departed reader: nothing committed, exit 0."""
    topics_dir = tmp_path / "topics"
    t = topics_dir / "ev"
    fill(t, 200, batch=20, config=TopicConfig(segment_bytes=1_000))  # a batch per segment
    segs = _segments(t)
    assert int(segs[1].stem) == 20 and int(segs[2].stem) == 40
    hook = tmp_path / "rq_hooked.py"
    hook.write_text(_RQ_RETENTION_AS_HEAD_LEAVES)
    env = {**os.environ, "RQ_TOPICS_DIR": str(topics_dir), "CI": "1"}
    args = ["replay", "ev", "--group", "g", "--commit", "--json", "--format", "raw"]
    rq = subprocess.Popen(
        [sys.executable, str(hook), f"{segs[0]},{segs[1]}", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert rq.stdout is not None
    head = subprocess.run(["head", "-n", "1"], stdin=rq.stdout, capture_output=True, timeout=60, check=False)
    rq.stdout.close()  # head's end is the only reader left
    _, err = rq.communicate(timeout=60)
    assert head.stdout == value(0) + b"\n"
    assert b"offsets 20..39 aged out (retention)" in err, err  # the gap was met
    assert rq.returncode == 0, err
    r = run_rq("offsets", "ev", "--group", "g", "--json", env={"RQ_TOPICS_DIR": str(topics_dir)})
    assert r.returncode == 3, r.stderr  # nothing committed: the named group does not exist
    assert b"consumer group g does not exist" in r.stderr
