"""`rq replay --to-topic DEST --group g --commit` when DEST refuses a record partway: the group's
position is exactly where the stored records end, so a rerun copies what was not stored, with no
gap and nothing twice. Real nats-server streams with limits (discard policy `new`,
max_msg_size), a real full tmpfs for the embedded log.

On the old code a JetStream refusal committed the start of the failing read batch (here nothing),
though the records before the refused one were stored (a rerun copied them again), and the
records already sent after it stayed stored (a rerun from the refused one copied those again)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jskit import MakeStream, made_streams
from rqtest import js_call, run_rq, small_tmpfs

from rqcli.exitcodes import ExitCode

_BIG = b"x" * 3000
_INPUT = b"a\nb\n" + _BIG + b"\nc\nd\n"


@pytest.fixture
def stream(nats_url: str) -> Iterator[MakeStream]:
    """make(**config) adds a stream (subjects NAME.x) and returns its name; all are deleted
    afterwards."""
    with made_streams(nats_url, "h-refcommit") as make:
        yield make


def _update(nats_url: str, name: str, **changes: Any) -> None:
    async def go(js: Any) -> None:
        config = (await js.stream_info(name)).config
        for k, v in changes.items():
            setattr(config, k, v)
        await js.update_stream(config)

    js_call(nats_url, go)


def _values(url: str, env: dict[str, str] | None = None) -> list[bytes]:
    r = run_rq("replay", url, "--from", "start", "--format", "raw", env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def _committed(env: dict[str, str]) -> int | None:
    r = run_rq("offsets", "src", "--group", "g", "--json", env=env)
    assert r.returncode == 0, r.stderr
    groups = json.loads(r.stdout)["groups"]
    return groups[0]["committed"] if groups else None


def _source(nats_url: str, name: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The target URL for stream `name`, and the environment of an embedded topic `src` holding
    a, b, a 3000-byte record, c, d."""
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", "src", input=_INPUT, env=env).returncode == 0
    return f"{nats_url}/{name}/{name}.x", env


def _copy(env: dict[str, str], target: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return run_rq("replay", "src", "--group", "g", "--commit", "--to-topic", target, *extra, env=env)


@pytest.mark.integration
def test_a_copy_refused_partway_commits_where_the_stored_records_end(
    nats_url: str, stream: Any, tmp_path: Path
) -> None:
    """max_bytes under discard new: the 3000-byte record does not fit, the small ones after it
    would. The group stops at the refused record, the stream holds exactly a, b; once the stream
    has room, the rerun copies the rest: a, b, x…, c, d, each once."""
    from nats.js.api import DiscardPolicy

    name = stream(discard=DiscardPolicy.NEW, max_bytes=2000)
    target, env = _source(nats_url, name, tmp_path)
    r = _copy(env, target)
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode().strip()
    assert "refused the record at offset 2," in err and "2 record(s) before it are stored" in err, err
    assert _values(target) == [b"a", b"b"]  # was: a, b, c, d
    assert _committed(env) == 2  # was: nothing committed (a rerun copied a and b again)
    assert "2 the stream took were removed again" in err, err

    _update(nats_url, name, max_bytes=-1)
    r = _copy(env, target)
    assert r.returncode == 0, r.stderr
    assert _values(target) == _INPUT.splitlines()
    assert _committed(env) == 5


@pytest.mark.integration
def test_a_record_over_max_msg_size_stops_the_copy_there_every_time(
    nats_url: str, stream: Any, tmp_path: Path
) -> None:
    """A record the stream will never take: each rerun stops at it again, and nothing after it is
    stored twice meanwhile."""
    name = stream(max_msg_size=1000)
    target, env = _source(nats_url, name, tmp_path)
    for _ in range(2):
        r = _copy(env, target)
        assert r.returncode == 1 and b"refused the record at offset 2," in r.stderr, r.stderr
        assert _values(target) == [b"a", b"b"]
        assert _committed(env) == 2
    # past it by hand: the rest, once
    r = run_rq("replay", "src", "--from", "3", "--group", "g", "--commit", "--to-topic", target, env=env)
    assert r.returncode == 0, r.stderr
    assert _values(target) == [b"a", b"b", b"c", b"d"]
    assert _committed(env) == 5


@pytest.mark.integration
def test_records_a_stream_will_not_let_go_are_said_and_never_committed_past(
    nats_url: str, stream: Any, tmp_path: Path
) -> None:
    """deny_delete: the records after the refused one cannot be removed. The line says they stay
    and that a rerun stores them again; the group still stops at the refused record."""
    from nats.js.api import DiscardPolicy

    name = stream(discard=DiscardPolicy.NEW, max_bytes=2000, deny_delete=True)
    target, env = _source(nats_url, name, tmp_path)
    r = _copy(env, target)
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and "2 stay stored (rq could not remove them" in err, err
    assert "a rerun from the refused record stores them again" in err, err
    assert _values(target) == [b"a", b"b", b"c", b"d"]
    assert _committed(env) == 2


@pytest.mark.integration
def test_produce_refused_partway_leaves_exactly_the_records_before_it(nats_url: str, stream: Any) -> None:
    """`rq produce`: the done line's records, the line and the stream agree: a and b, so feeding
    the input again from record 3 (`tail -n +3`) stores the rest once."""
    from nats.js.api import DiscardPolicy

    name = stream(discard=DiscardPolicy.NEW, max_bytes=2000)
    target = f"{nats_url}/{name}/{name}.x"
    r = run_rq("produce", "--json", target, input=_INPUT)
    assert r.returncode == 1, r.stderr
    assert b"refused record 3 of the input" in r.stderr, r.stderr
    done = json.loads(r.stdout.splitlines()[-1])
    assert (done["records"], done["first_offset"], done["last_offset"]) == (2, 1, 2), done
    assert _values(target) == [b"a", b"b"]
    _update(nats_url, name, max_bytes=-1)
    rest = b"\n".join(_INPUT.splitlines()[2:]) + b"\n"
    assert run_rq("produce", target, input=rest).returncode == 0
    assert _values(target) == _INPUT.splitlines()


def test_a_copy_onto_a_full_disk_commits_what_the_target_kept(tmp_path: Path) -> None:
    """The embedded log as DEST on a full file system: the group's position is the end of what
    the target holds; with more room, the rerun completes the copy, nothing twice."""
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    lines = [b"%05d-" % i + b"y" * 94 for i in range(5000)]
    for k in range(10):  # ten batches in the source: the copy fails inside it, not at its start
        chunk = b"\n".join(lines[k * 500 : (k + 1) * 500]) + b"\n"
        assert run_rq("produce", "src", input=chunk, env=env).returncode == 0
    with small_tmpfs(tmp_path / "mnt", "256k") as mnt:
        target = str(mnt / "dst")
        r = _copy(env, target)
        assert r.returncode == ExitCode.NO_SPACE, r.stderr
        kept = _values(target)
        assert 0 < len(kept) < 5000 and kept == lines[: len(kept)]
        assert _committed(env) == len(kept)
        remount = ["mount", "-o", "remount,size=4m", str(mnt)]
        assert subprocess.run(remount, capture_output=True).returncode == 0
        r = _copy(env, target)
        assert r.returncode == 0, r.stderr
        assert _values(target) == lines
        assert _committed(env) == 5000
