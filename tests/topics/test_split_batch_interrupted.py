"""Ctrl-C / SIGTERM while the embedded log stores a batch in parts (a batch over its size limit is
split, each part durable on its own). The stop is made deterministic inside a real rq process
(rqtest.popen_rq_with): the batch limit is lowered to 8 KiB so a read batch of ~100 B records
splits into parts, and a hook on the k-th part raises the signal there, then sleeps past
_Stops.GRACE_S (lowered) so the held stop is overdue inside the append, as on a slow disk:

- after_sync: right after a part's fdatasync returned (the part is durable, its bookkeeping not
  done yet);
- between_parts: as the next part is being encoded (the parts before it are durable).

Then the group must be committed exactly where the target's records end, the --json done line
must count what the target holds, and a rerun must complete the copy with nothing twice. The old
code committed none of the batch (its stored parts were copied again by the rerun) and `rq
produce` did not count them."""

from __future__ import annotations

import errno
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from jskit import MakeStream, made_streams
from rqtest import popen_rq_with, run_rq, small_tmpfs
from splitbatch_kit import LINES, hook_setup, topic_values

from rqcli.exitcodes import ExitCode
from topics.embedded import format as fmt
from topics.embedded.log import LogWriter
from topics.errors import AppendInterrupted


def _committed(topic: str) -> int | None:
    r = run_rq("offsets", topic, "--group", "g", "--json")
    assert r.returncode == 0, r.stderr
    groups = json.loads(r.stdout)["groups"]
    return groups[0]["committed"] if groups else None


@pytest.fixture
def stream(nats_url: str) -> Iterator[MakeStream]:
    with made_streams(nats_url, "split-sig") as make:
        yield make


_CASES = [("after_sync", signal.SIGTERM), ("between_parts", signal.SIGINT)]


@pytest.mark.integration
def test_a_stop_inside_a_split_batch_commits_exactly_the_stored_parts(
    nats_url: str, stream: MakeStream, tmp_path: Path
) -> None:
    """A JetStream source (its read batches are hundreds of records) copied into an embedded log
    with `--group g --commit`: SIGTERM lands inside the first batch's parts, right after one's
    fdatasync (the produce tests below also stop one between two parts)."""
    hook, sig = "after_sync", signal.SIGTERM
    name = stream()
    src = f"{nats_url}/{name}/{name}.x"
    assert run_rq("produce", src, input=b"\n".join(LINES) + b"\n").returncode == 0
    target = str(tmp_path / "dst")
    args = ("--json", "replay", src, "--group", "g", "--commit", "--to-topic", target)
    proc = popen_rq_with(hook_setup(hook, sig), *args)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    kept = topic_values(target)
    assert 0 < len(kept) < len(LINES) and kept == LINES[: len(kept)], err
    # exactly where the target's records end (a JetStream offset is a sequence, from 1): the old
    # code committed short of the parts stored (at the batch's start), so the rerun doubled them
    assert _committed(src) == len(kept) + 1, err
    done = json.loads(out.splitlines()[-1])
    assert done["event"] == "done" and done["stored"] == len(kept), out
    rerun = run_rq("replay", src, "--group", "g", "--commit", "--to-topic", target)
    assert rerun.returncode == 0, rerun.stderr
    assert topic_values(target) == LINES  # nothing lost, nothing twice


@pytest.mark.parametrize(("hook", "sig"), _CASES, ids=[c[0] for c in _CASES])
def test_produce_stopped_inside_a_split_batch_counts_the_stored_parts(
    tmp_path: Path, hook: str, sig: int
) -> None:
    """`rq produce --json`: the done line counts what the topic holds (old: not the parts), so a
    rerun of the input after them (`tail -n +N`) stores every record once."""
    target = str(tmp_path / "dst")
    feed = tmp_path / "input"
    feed.write_bytes(b"\n".join(LINES) + b"\n")
    stdin = f"os.dup2(os.open({str(feed)!r}, os.O_RDONLY), 0)\n"  # popen_rq_with gives no stdin pipe
    proc = popen_rq_with(hook_setup(hook, sig) + stdin, "--json", "produce", target)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    kept = topic_values(target)
    assert 0 < len(kept) < len(LINES) and kept == LINES[: len(kept)], err
    done = json.loads(out.splitlines()[-1])
    assert (done["records"], done["first_offset"], done["last_offset"]) == (len(kept), 0, len(kept) - 1), out
    rest = b"\n".join(LINES[done["records"] :]) + b"\n"
    assert run_rq("produce", target, input=rest).returncode == 0
    assert topic_values(target) == LINES


def test_the_log_says_what_an_interrupted_append_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library: a KeyboardInterrupt right after the second part's fdatasync is an
    AppendInterrupted (still a KeyboardInterrupt) counting both parts, and the log holds them."""
    monkeypatch.setattr(fmt, "MAX_BATCH_PAYLOAD", 8192)
    real, calls = os.fdatasync, [0]

    def interrupted(fd: int) -> None:
        real(fd)
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt

    writer = LogWriter(tmp_path / "dst")
    monkeypatch.setattr(os, "fdatasync", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            writer.append([(None, None, (), line) for line in LINES])
        exc = caught.value
        assert isinstance(exc, AppendInterrupted) and type(exc.error) is KeyboardInterrupt
        assert 0 < exc.stored < len(LINES) and (exc.first, exc.last) == (0, exc.stored - 1)
        assert writer.next_offset == exc.stored
    finally:
        monkeypatch.undo()
        writer.close()
    assert topic_values(str(tmp_path / "dst")) == LINES[: exc.stored]


def test_a_batch_cut_short_by_a_full_disk_is_not_left_in_the_file(tmp_path: Path) -> None:
    """What the writer counts is what the segment holds: the bytes of a batch that ENOSPC cut
    short are truncated away (old: left behind, the disk's last blocks taken by them)."""
    with small_tmpfs(tmp_path / "mnt", "64k") as mnt:
        writer = LogWriter(mnt / "dst")
        try:
            with pytest.raises(OSError) as caught:
                for i in range(0, len(LINES), 100):
                    writer.append([(None, None, (), line) for line in LINES[i : i + 100]])
            assert caught.value.errno == errno.ENOSPC
            assert os.path.getsize(mnt / "dst" / fmt.segment_name(writer.base)) == writer.size
        finally:
            writer.close()
