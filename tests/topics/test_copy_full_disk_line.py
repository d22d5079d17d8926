"""`rq replay --to-topic DEST` onto an embedded log on a full disk (a real small tmpfs).

(1) The line names DEST, how many records it stored, where the group stands and how to go on, as
`rq produce` names its topic; the old line was the bare "No space left on device", exit 7.
(2) A batch over the embedded log's batch limit is stored in parts, each durable alone: a full
disk on a later part kept the earlier parts, but the old code committed none of the batch (a
rerun stored them twice) and `rq produce` did not count them. The format's batch limit is
lowered in the rq process so that the test does not write 256 MiB (the source is then JetStream
or stdin: an embedded source's batches written under the real limit would read as damaged)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from jskit import MakeStream, made_streams
from rqtest import run_rq, small_tmpfs

from rqcli.exitcodes import ExitCode
from topics.embedded import format as fmt
from topics.embedded.log import LogWriter, TopicLog
from topics.errors import AppendedPartly

_LINES = [b"%05d-" % i + b"y" * 94 for i in range(5000)]
_PART = 8192  # the lowered batch limit: ~80 records of ~100 bytes a part


def _produce_src(env: dict[str, str]) -> None:
    for k in range(10):  # ten batches: the copy fails inside the source, not at its start
        chunk = b"\n".join(_LINES[k * 500 : (k + 1) * 500]) + b"\n"
        assert run_rq("produce", "src", input=chunk, env=env).returncode == 0


def _values(url: str, env: dict[str, str] | None = None) -> list[bytes]:
    r = run_rq("replay", url, "--from", "start", "--format", "raw", env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def _committed(topic: str, env: dict[str, str] | None = None) -> int | None:
    r = run_rq("offsets", topic, "--group", "g", "--json", env=env)
    assert r.returncode == 0, r.stderr
    groups = json.loads(r.stdout)["groups"]
    return groups[0]["committed"] if groups else None


def test_a_copy_onto_a_full_disk_names_the_target_what_it_stored_and_the_commit(tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    _produce_src(env)
    with small_tmpfs(tmp_path / "mnt", "256k") as mnt:
        target = str(mnt / "dst")
        r = run_rq("replay", "src", "--group", "g", "--commit", "--to-topic", target, env=env)
        assert r.returncode == ExitCode.NO_SPACE, r.stderr
        err = r.stderr.decode().strip()
        kept = len(_values(target))
        assert 0 < kept < 5000
        assert len(err.splitlines()) == 1, err
        assert f"holding {target} is full" in err, err  # was: "No space left on device" alone
        assert f"stored {kept} record(s)" in err, err
        assert f"group g is committed at offset {kept}" in err, err
        assert "free space and re-run to continue" in err, err
        assert _committed("src", env) == kept

        # without --commit: the line says where to go on from
        subprocess.run(["rm", "-rf", target], check=True)
        r = run_rq("replay", "src", "--to-topic", target, env=env)
        assert r.returncode == ExitCode.NO_SPACE, r.stderr
        err = r.stderr.decode().strip()
        kept = len(_values(target))
        assert f"stored {kept} record(s)" in err and "nothing was committed" in err, err
        assert f"re-run to continue with --from {kept}" in err, err


def test_the_log_says_what_the_parts_of_a_split_batch_stored_before_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library: AppendedPartly carries what is stored, and the log holds exactly that."""
    monkeypatch.setattr(fmt, "MAX_BATCH_PAYLOAD", _PART)
    with small_tmpfs(tmp_path / "mnt", "64k") as mnt:
        writer = LogWriter(mnt / "dst")
        try:
            with pytest.raises(AppendedPartly) as caught:
                writer.append([(None, None, (), line) for line in _LINES[:2000]])
        finally:
            writer.close()
        exc = caught.value
        assert isinstance(exc.error, OSError) and exc.error.errno == 28
        held = [r[4] for batch in TopicLog(mnt / "dst").reader(0, None, False) for r in batch]
        assert 0 < exc.stored == len(held) < 2000 and (exc.first, exc.last) == (0, exc.stored - 1)
        assert held == _LINES[: exc.stored]


_LOWERED = (
    "import sys\n"
    "from topics.embedded import format as fmt\n"
    f"fmt.MAX_BATCH_PAYLOAD = {_PART}\n"
    "sys.argv[0] = 'rq'\n"
    "from rqcli.console import main\n"
    "main()\n"
)


def _rq_lowered(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", _LOWERED, *args], env={**env, "CI": "1"}, capture_output=True, timeout=120
    )


@pytest.fixture
def stream(nats_url: str) -> Iterator[MakeStream]:
    with made_streams(nats_url, "h-splitfull") as make:
        yield make


@pytest.mark.integration
def test_a_split_batch_cut_by_a_full_disk_commits_its_stored_parts(
    nats_url: str, stream: MakeStream, tmp_path: Path
) -> None:
    """A JetStream source (read batches of many records, over the lowered limit) copied into an
    embedded log on a 64k tmpfs: the group stops exactly where the stored records end, and with
    room the rerun completes the copy, nothing twice. Old code: committed short of the parts."""
    import os

    name = stream()
    src = f"{nats_url}/{name}/{name}.x"
    env = dict(os.environ)
    assert run_rq("produce", src, input=b"\n".join(_LINES[:2000]) + b"\n").returncode == 0
    with small_tmpfs(tmp_path / "mnt", "64k") as mnt:
        target = str(mnt / "dst")
        r = _rq_lowered("replay", src, "--group", "g", "--commit", "--to-topic", target, env=env)
        assert r.returncode == ExitCode.NO_SPACE, r.stderr
        kept = _values(target)
        assert 0 < len(kept) < 2000 and kept == _LINES[: len(kept)]
        assert _committed(src) == len(kept) + 1, r.stderr  # a JetStream offset is a sequence (from 1)
        assert f"stored {len(kept)} record(s)" in r.stderr.decode(), r.stderr
        remount = ["mount", "-o", "remount,size=1m", str(mnt)]
        assert subprocess.run(remount, capture_output=True).returncode == 0
        r = _rq_lowered("replay", src, "--group", "g", "--commit", "--to-topic", target, env=env)
        assert r.returncode == 0, r.stderr
        assert _values(target) == _LINES[:2000]


def test_produce_counts_the_stored_parts_of_a_split_batch(tmp_path: Path) -> None:
    """`rq produce --json` into a full disk: its done line counts the parts stored (old: 0)."""
    import os

    with small_tmpfs(tmp_path / "mnt", "64k") as mnt:
        target = str(mnt / "dst")
        data = b"\n".join(_LINES[:2000]) + b"\n"
        r = subprocess.run(
            [sys.executable, "-c", _LOWERED, "--json", "produce", target],
            env={**os.environ, "CI": "1"},
            input=data,
            capture_output=True,
            timeout=120,
        )
        assert r.returncode == ExitCode.NO_SPACE, r.stderr
        kept = _values(target)
        assert 0 < len(kept) < 2000
        done = json.loads(r.stdout.splitlines()[-1])
        assert (done["records"], done["first_offset"], done["last_offset"]) == (len(kept), 0, len(kept) - 1)
        assert f"the {len(kept)} record(s) acknowledged before it" in r.stderr.decode(), r.stderr
