"""The done line of a `replay --to-topic` stopped inside a split batch (no --commit) must say where
a rerun goes on: its `next_offset` stayed at the batch's start while `stored` counted the parts the
target kept, so `rq replay --from NEXT_OFFSET --to-topic` copied those parts twice. Same stop as
test_split_batch_interrupted.py (splitbatch_kit's hook raises SIGTERM right after a part's fdatasync)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from jskit import MakeStream, made_streams
from rqtest import popen_rq_with, run_rq
from splitbatch_kit import LINES, hook_setup, topic_values

from rqcli.exitcodes import ExitCode


@pytest.fixture
def stream(nats_url: str) -> Iterator[MakeStream]:
    with made_streams(nats_url, "stop-done") as make:
        yield make


@pytest.mark.integration
def test_an_uncommitted_copy_stopped_in_a_split_batch_says_where_to_go_on(
    nats_url: str, stream: MakeStream, tmp_path: Path
) -> None:
    name = stream()
    src = f"{nats_url}/{name}/{name}.x"
    assert run_rq("produce", src, input=b"\n".join(LINES) + b"\n").returncode == 0
    target = str(tmp_path / "dst")
    proc = popen_rq_with(
        hook_setup("after_sync", signal.SIGTERM), "--json", "replay", src, "--to-topic", target
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    kept = topic_values(target)
    assert 0 < len(kept) < len(LINES) and kept == LINES[: len(kept)], err
    done = json.loads(out.splitlines()[-1])
    assert done["event"] == "done" and done["stored"] == len(kept), out
    assert done["next_offset"] == len(kept) + 1, out  # a JetStream offset is a sequence, from 1
    rerun = run_rq("replay", src, "--from", str(done["next_offset"]), "--to-topic", target)
    assert rerun.returncode == 0, rerun.stderr
    assert topic_values(target) == LINES  # nothing lost, nothing twice
