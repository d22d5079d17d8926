"""Formats written by a newer rq. topic.json's "format" was written and never read: a topic of
format 2 (with keys this rq does not know, say "compression") was appended to and tailed as format
1, and `--segment-bytes` wrote it back as format 1. It is now refused, for reading and for writing,
in one line (exit 10); format 1 and a topic.json without a format are read as before. A saved replay
spec with a field this rq does not know failed with Python's "ReplaySpec.__init__() got an
unexpected keyword argument"; it is now one line naming the fields (exit 2), and a spec of a newer
version says so (exit 10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rqtest import run_rq

from topics.embedded.log import LogWriter, TopicConfig, TopicLog
from topics.errors import SpecError, Unsupported
from topics.savedspec import ReplaySpec


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"RQ_TOPICS_DIR": str(tmp_path / "topics")}


def _topic(env: dict[str, str], **changes: object) -> Path:
    assert run_rq("produce", "ev", input=b"one\ntwo\n", env=env).returncode == 0
    top = Path(env["RQ_TOPICS_DIR"]) / "ev"
    conf = json.loads((top / "topic.json").read_text())
    conf.update(changes)
    (top / "topic.json").write_text(json.dumps({k: v for k, v in conf.items() if v is not None}))
    return top


def test_a_topic_of_a_newer_format_is_refused_for_reads_and_writes(env: dict[str, str]) -> None:
    top = _topic(env, format=2, compression="zstd")
    before = (top / "topic.json").read_bytes()
    line = f"rq: error: topic {top} has format 2, newer than this rq understands (it knows 1): upgrade rq"
    for args, given in [
        (("produce", "ev"), b"three\n"),
        (("produce", "ev", "--segment-bytes", "1M"), b"three\n"),
        (("tail", "ev", "-n", "5"), None),
        (("replay", "ev", "--from", "0", "--to", "1"), None),
    ]:
        res = run_rq(*args, input=given, env=env)
        err = res.stderr.decode()
        assert res.returncode == 10, (args, err)  # (old: 0, appended to and tailed)
        assert err.startswith(line) and err.count("\n") == 1, (args, err)
    assert (top / "topic.json").read_bytes() == before
    with pytest.raises(Unsupported):
        TopicLog(top)
    with pytest.raises(Unsupported):
        LogWriter(top, TopicConfig(segment_bytes=1 << 20))
    assert (top / "topic.json").read_bytes() == before  # never written back as format 1


@pytest.mark.parametrize("changes", [{"compression": "zstd"}, {"format": None}])
def test_format_one_and_no_format_are_read_as_before(env: dict[str, str], changes: dict[str, object]) -> None:
    top = _topic(env, **changes)
    assert run_rq("produce", "ev", input=b"three\n", env=env).returncode == 0
    res = run_rq("tail", "ev", "-n", "5", "--format", "raw", env=env)
    assert res.returncode == 0 and res.stdout == b"one\ntwo\nthree\n", res.stderr
    with LogWriter(top) as w:
        assert w.append([(None, None, (), b"four")]) == (3, 3)


def _spec(env: dict[str, str], tmp_path: Path) -> tuple[Path, dict[str, object]]:
    _topic(env)
    spec = tmp_path / "run.json"
    res = run_rq("replay", "ev", "--from", "0", "--to", "2", "--save-spec", str(spec), env=env)
    assert res.returncode == 0, res.stderr
    return spec, json.loads(spec.read_text())


def test_a_spec_with_fields_this_rq_does_not_know(env: dict[str, str], tmp_path: Path) -> None:
    spec, body = _spec(env, tmp_path)
    spec.write_text(json.dumps({**body, "compression": "zstd", "shard": 3}))
    res = run_rq("replay", "--spec", str(spec), env=env)
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert err.startswith(
        f"rq: error: replay spec {spec} has fields this rq does not know: 'compression', 'shard' "
        "(saved by a newer rq?)"
    ), err  # (old: "...unexpected fields: ReplaySpec.__init__() got an unexpected keyword argument")
    assert "__init__" not in err and err.count("\n") == 1

    spec.write_text(json.dumps({k: v for k, v in body.items() if k != "digest"}))
    with pytest.raises(SpecError, match=r"lacks fields: digest$"):
        ReplaySpec.load(spec)


def test_a_spec_of_a_newer_version_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    spec, body = _spec(env, tmp_path)
    spec.write_text(json.dumps({**body, "rq_replay_spec": 2}))
    res = run_rq("replay", "--spec", str(spec), env=env)
    err = res.stderr.decode()
    assert res.returncode == 10, err  # (old: 2, "is not an rq replay spec (version 1)")
    assert f"replay spec {spec} is version 2, newer than this rq understands (it knows 1)" in err, err
    spec.write_text(json.dumps({**body, "rq_replay_spec": 1}))
    assert run_rq("replay", "--spec", str(spec), env=env).returncode == 0
