"""The library replays a saved spec with the guarantee the CLI gives: the records replayed are the
ones the spec pinned (range before the read, count and digest after), else DigestMismatch."""

from __future__ import annotations

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
