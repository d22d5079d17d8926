"""The library replays a saved spec with the guarantee the CLI gives: the records replayed are the
ones the spec pinned (range before the read, count and digest after), else DigestMismatch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rqtest import run_rq


def _produce(topics: Path, name: str, values: list[bytes]) -> None:
    r = run_rq("produce", name, input=b"".join(v + b"\n" for v in values), env={"RQ_TOPICS_DIR": str(topics)})
    assert r.returncode == 0, r.stderr


def _saved(topics: Path, tmp_path: Path, *args: str) -> Path:
    spec = tmp_path / "run.json"
    r = run_rq(
        "replay", "data", "--from", "start", *args, "--save-spec", str(spec), "--format", "raw",
        env={"RQ_TOPICS_DIR": str(topics)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return spec


def _replay(spec_file: Path, values: list[bytes] | None = None) -> list[bytes]:
    """What a training script does: load the spec, open its source, replay it through `emit`."""
    from topics.savedspec import ReplaySpec, replay_spec
    from topics.sources import open_source, parse_topic

    spec = ReplaySpec.load(spec_file)
    source = open_source(parse_topic(spec.source, spec_file.parent))
    values = [] if values is None else values
    try:
        replay_spec(source, spec, lambda records, _decoded: values.extend(r[4] for r in records))
    finally:
        source.close()
    return values


@pytest.mark.parametrize("where", [[], ["--where", '$value != "b"']])
def test_a_saved_spec_replayed_by_the_library_over_changed_records_raises(
    tmp_path: Path, where: list[str]
) -> None:
    """The check lived in the CLI only: a training script replaying a saved spec through the
    library got whatever the topic held now, without a word."""
    from topics.errors import DigestMismatch

    topics = tmp_path / "topics"
    _produce(topics, "data", [b"a", b"b", b"c"])
    spec = _saved(topics, tmp_path, *where)
    assert _replay(spec) == ([b"a", b"b", b"c"] if not where else [b"a", b"c"])  # unchanged: the same
    # the same offsets, other data (written anew: new timestamps, one value changed)
    shutil.rmtree(topics / "data")
    _produce(topics, "data", [b"a", b"b", b"X"])
    with pytest.raises(DigestMismatch, match="REPLAY DOES NOT MATCH THE SPEC") as caught:
        _replay(spec)
    assert "\n" not in str(caught.value)


def test_a_saved_spec_over_a_topic_that_lost_records_raises_before_emitting(tmp_path: Path) -> None:
    from topics.errors import DigestMismatch

    topics = tmp_path / "topics"
    _produce(topics, "data", [b"a", b"b", b"c"])
    spec = _saved(topics, tmp_path)
    shutil.rmtree(topics / "data")
    _produce(topics, "data", [b"a", b"b"])
    emitted: list[bytes] = []
    with pytest.raises(DigestMismatch, match="needs offsets up to 2 but the topic ends at 1"):
        _replay(spec, emitted)
    assert emitted == []


def _record(topics: Path, spec_file: Path, start: int, where: str | None, count: int | None) -> list[bytes]:
    """What a training script does to pin the data it consumed: read with the digest, keep the
    spec of the result."""
    from topics.expr import compile_where
    from topics.pipeline import Request, run
    from topics.savedspec import ReplaySpec
    from topics.sources import open_source, parse_topic

    source = open_source(parse_topic("data", topics))
    consumed: list[bytes] = []
    try:
        req = Request(
            start=start,
            stop=source.end_offset(),
            where=compile_where(where) if where else None,
            count=count,
            digest=True,
        )
        res = run(source, req, lambda records, _decoded: consumed.extend(r[4] for r in records))
        ReplaySpec.from_result(source, req, res).save(spec_file)
    finally:
        source.close()
    return consumed


@pytest.mark.parametrize(
    ("where", "count", "expected"),
    [(None, None, [b"2", b"3", b"4", b"5"]), ("$value > 2", 2, [b"3", b"4"])],
)
def test_a_spec_recorded_by_the_library_replays_and_verifies_through_the_cli(
    tmp_path: Path, where: str | None, count: int | None, expected: list[bytes]
) -> None:
    """A library user had no way to produce a spec but to build ReplaySpec by hand (the CLI's
    _spec_of was private): ReplaySpec.from_result pins what a read returned, and `rq replay --spec`
    replays and verifies it, and refuses it once the data changed."""
    topics = tmp_path / "topics"
    env = {"RQ_TOPICS_DIR": str(topics)}
    _produce(topics, "data", [b"1", b"2", b"3", b"4", b"5"])
    spec = tmp_path / "consumed.json"
    assert _record(topics, spec, 1, where, count) == expected
    r = run_rq("replay", "--spec", str(spec), "--format", "raw", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == expected
    assert b"replay matches spec" in r.stderr
    # the same pins the CLI's own --save-spec writes for that read
    cli_spec = tmp_path / "cli.json"
    args = ["--where", where] if where else []
    args += ["--count", str(count)] if count else []
    r = run_rq(
        "replay", "data", "--from", "1", *args, "--format", "raw", "--save-spec", str(cli_spec), env=env
    )
    assert r.returncode == 0, r.stderr
    pins = ("source", "kind", "start", "stop", "records", "digest", "where", "first_offset", "last_offset")
    ours, theirs = json.loads(spec.read_bytes()), json.loads(cli_spec.read_bytes())
    assert {k: ours[k] for k in pins} == {k: theirs[k] for k in pins}
    shutil.rmtree(topics / "data")
    _produce(topics, "data", [b"1", b"2", b"3", b"4", b"6"])
    r = run_rq("replay", "--spec", str(spec), "--format", "raw", env=env)
    assert r.returncode == 5 and b"REPLAY DOES NOT MATCH THE SPEC" in r.stderr, r.stderr


def test_a_spec_of_a_read_without_its_digest_is_refused(tmp_path: Path) -> None:
    from topics.errors import SpecError
    from topics.pipeline import Request, run
    from topics.savedspec import ReplaySpec
    from topics.sources import open_source, parse_topic

    topics = tmp_path / "topics"
    _produce(topics, "data", [b"1"])
    source = open_source(parse_topic("data", topics))
    try:
        req = Request(start=0, stop=1)
        res = run(source, req, lambda _r, _d: None)
        with pytest.raises(SpecError, match=r"Request\(digest=True\)"):
            ReplaySpec.from_result(source, req, res)
    finally:
        source.close()
