"""jx: a bounded `rq replay` (or `rq tail -n`) that was behind when the rest of its range was
purged waited forever: the last message delivered said more were pending, the consumer then only
sent idle heartbeats, and the read ended only on pending 0. Now an idle heartbeat during a bounded
read asks the consumer: nothing pending and all it delivered come, the read ends and the gap up to
its end is told (as with a purge keep=N). Real server; the heartbeat lowered to 0.3 s."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import js_call, popen_rq_with, run_rq

pytestmark = pytest.mark.integration

N = 3000
# The heartbeat lowered; the reader, once it has its first batch, waits for the test's gate (it
# is behind for sure when the purge comes), and says so in a file.
_SETUP = """
import os, time
import topics.sources.natswire as w
w.HEARTBEAT_S = 0.3
_take = w.OrderedReader._take
def take(self, frames):
    batch, restart = _take(self, frames)
    if batch and not os.path.exists({gate!r}):
        open({waiting!r}, "w").close()
        while not os.path.exists({gate!r}):
            time.sleep(0.01)
    return batch, restart
w.OrderedReader._take = take
"""


def _purged_behind(nats_url: str, tmp_path: Path, subjects: list[str], args: list[str], purge: Any) -> None:
    with made_streams(nats_url, "JXPUR") as make:
        name = make(subjects=subjects)
        url = f"{nats_url}/{name}"
        value = b"v" * 4000
        r = run_rq("produce", f"{url}/{name}.a", "--format", "lines", input=(value + b"\n") * N)
        assert r.returncode == 0, r.stderr
        gate, waiting = tmp_path / "gate", tmp_path / "waiting"
        setup = _SETUP.format(gate=str(gate), waiting=str(waiting))
        proc = popen_rq_with(setup, *[a.format(url=url, name=name) for a in args], "--json")
        assert proc.stdout is not None
        deadline = time.monotonic() + 20
        while not waiting.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert waiting.exists(), proc.stderr.read() if proc.stderr else b""
        js_call(nats_url, lambda js: purge(js, name))
        gate.touch()
        try:
            out, errb = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail("a bounded read whose rest was purged did not end (waited 20 s)")
        code, err = proc.returncode, errb.decode()
        assert code == 0, err
        lines = [json.loads(x) for x in out.decode().splitlines() if x.strip()]
        offsets = [x["offset"] for x in lines if x.get("event") is None]
        gaps = [x for x in lines if x.get("event") == "gap"]
        assert gaps, (len(offsets), err)  # it was behind: some records were purged before it read them
        assert gaps[-1]["last"] == N and gaps[-1]["reason"] == "deleted", gaps
        seen = set(offsets)
        for g in gaps:
            seen |= set(range(g["first"], g["last"] + 1))
        first_offset = offsets[0] if offsets else gaps[0]["first"]
        assert seen == set(range(first_offset, N + 1))


def test_a_replay_behind_a_full_purge_ends_with_the_gap(nats_url: str, tmp_path: Path) -> None:
    async def purge(js: Any, name: str) -> None:
        await js.purge_stream(name)

    _purged_behind(nats_url, tmp_path, ["{name}.>"], ["replay", "{url}", "--format", "json"], purge)


def test_a_tail_n_behind_a_subject_purge_ends_with_the_gap(nats_url: str, tmp_path: Path) -> None:
    async def purge(js: Any, name: str) -> None:
        await js.purge_stream(name, subject=f"{name}.a")

    args = ["tail", "{url}/{name}.a", "-n", str(N - 100), "--format", "json"]
    _purged_behind(nats_url, tmp_path, ["{name}.>"], args, purge)


def test_a_bounded_follow_behind_a_purge_of_its_range_ends_with_the_gap(
    nats_url: str, tmp_path: Path
) -> None:
    """`--to N -f` with N already stored: the purged rest of its range will never come, so the
    follow ends there (it waited for the next publish, for ever on a quiet stream)."""

    async def purge(js: Any, name: str) -> None:
        await js.purge_stream(name)

    args = ["replay", "{url}", "--to", str(N + 1), "-f", "--format", "json"]
    _purged_behind(nats_url, tmp_path, ["{name}.>"], args, purge)
