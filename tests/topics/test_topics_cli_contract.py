"""The topics commands against their documented contract (docs/cli.md, docs/topics.md, README's
exit codes): -q keeps what a command was asked for, a missing file is exit 3, a missing TOPIC a
usage error, --timeout only where a read follows, sizes read as everywhere else, MQTT has no
offsets, and an empty --format is refused."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from rqtest import run_rq


def _env(tmp_path: Path) -> dict[str, str]:
    return {"RQ_TOPICS_DIR": str(tmp_path / "topics")}


def _samples(tmp_path: Path) -> dict[str, str]:
    """Topic `samples` (records 1, 2, 3) with group g committed at 1."""
    env = _env(tmp_path)
    assert run_rq("produce", "samples", input=b"1\n2\n3\n", env=env).returncode == 0
    r = run_rq("offsets", "reset", "samples", "--group", "g", "--to", "1", env=env)
    assert r.returncode == 0, r.stderr
    return env


def test_quiet_offsets_still_prints_what_was_asked_for(tmp_path: Path) -> None:
    """`rq -q offsets T` printed nothing on a topic without groups, and the group table without
    the topic's line; `offsets reset --dry-run` under -q printed nothing at all."""
    env = _samples(tmp_path)
    assert run_rq("produce", "events", input=b"a\n", env=env).returncode == 0
    r = run_rq("-q", "offsets", "events", env=env)
    assert r.returncode == 0 and b"events: first 0, last 0, 1 records" in r.stdout, r.stdout
    r = run_rq("-q", "offsets", "samples", env=env)
    out = r.stdout.decode()
    assert r.returncode == 0 and "samples: first 0, last 2, 3 records" in out and "g" in out, out
    r = run_rq("-q", "offsets", "reset", "samples", "--group", "g", "--to", "0", "--dry-run", env=env)
    assert r.returncode == 0 and b"would move group g" in r.stdout and b"from 1 to 0" in r.stdout, r.stdout
    # a real move's line is a report, which -q drops (as it drops "evicted 3")
    r = run_rq("-q", "offsets", "reset", "samples", "--group", "g", "--to", "0", env=env)
    assert r.returncode == 0 and r.stdout == b"" and r.stderr == b"", r
    r = run_rq("offsets", "samples", "--group", "g", "--json", env=env)
    assert json.loads(r.stdout)["groups"][0]["committed"] == 0


def test_a_missing_spec_file_is_not_found(tmp_path: Path) -> None:
    """README: a file not found is exit 3; it was 2, as if the spec were malformed."""
    r = run_rq("replay", "--spec", str(tmp_path / "nofile.json"), env=_env(tmp_path))
    assert r.returncode == 3, r.stderr
    assert len(r.stderr.splitlines()) == 1 and b"does not exist" in r.stderr, r.stderr
    (tmp_path / "bad.json").write_text("{")  # a file that is there but is no spec: still 2
    assert run_rq("replay", "--spec", str(tmp_path / "bad.json"), env=_env(tmp_path)).returncode == 2


def test_offsets_reset_without_a_topic_says_topic_is_missing(tmp_path: Path) -> None:
    """`rq offsets reset` took `reset` as a topic name: 'topic …/reset does not exist', exit 3."""
    env = _env(tmp_path)
    for extra in ([], ["--group", "g", "--to", "0"]):
        r = run_rq("offsets", "reset", *extra, env=env)
        assert r.returncode == 2, r.stderr
        line = r.stderr.decode().strip()
        assert len(line.splitlines()) == 1 and "TOPIC is missing" in line and "does not exist" not in line, (
            line
        )


def test_timeout_without_follow_is_refused_on_the_command_line(tmp_path: Path) -> None:
    """`rq tail T --timeout 1` (no -f) ignored --timeout without a word; so did replay."""
    env = _samples(tmp_path)
    for cmd in (["tail", "samples"], ["replay", "samples"]):
        r = run_rq(*cmd, "--timeout", "1", "--format", "raw", env=env)
        assert r.returncode == 2 and r.stdout == b"", r.stderr
        assert len(r.stderr.splitlines()) == 1 and b"--follow" in r.stderr, r.stderr
    # with -f it ends the follow; from the environment it is a default for follows only
    r = run_rq("tail", "samples", "-f", "--timeout", "1", "--format", "raw", env=env, timeout=30)
    assert r.returncode == 0 and r.stdout == b"1\n2\n3\n", r.stderr
    r = run_rq("tail", "samples", "-n", "1", "--format", "raw", env={**env, "RQ_TAIL_TIMEOUT": "1"})
    assert r.returncode == 0 and r.stdout == b"3\n", r.stderr


@pytest.mark.integration
def test_timeout_applies_to_an_mqtt_tail_which_always_follows(mqtt_url: str, tmp_path: Path) -> None:
    r = run_rq(
        "tail",
        f"{mqtt_url}/h-topics/{uuid.uuid4().hex[:8]}",
        "--timeout",
        "1",
        env=_env(tmp_path),
        timeout=30,
    )
    assert r.returncode == 0 and r.stdout == b"", r.stderr


@pytest.mark.parametrize(
    ("size", "ok"),
    [
        ("1.5", False),
        ("0.5", False),
        ("0", False),
        ("1e3", False),
        ("abc", False),
        ("1.5K", True),
        ("4096", True),
    ],
)
def test_segment_bytes_reads_sizes_as_every_command_does(tmp_path: Path, size: str, ok: bool) -> None:
    """--segment-bytes had its own parser: '1.5' was a 1-byte segment (int(float())), '1e3' 1000
    bytes; docs/cli.md: a number without a unit must be whole, units are K/M/G/T."""
    env = _env(tmp_path)
    r = run_rq("produce", "seg", "--segment-bytes", size, input=b"x\n", env=env)
    if ok:
        assert r.returncode == 0, r.stderr
        return
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert not (tmp_path / "topics" / "seg").exists()  # nothing made


def test_segment_bytes_with_a_fraction_and_a_unit_is_whole_bytes(tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert run_rq("produce", "seg", "--segment-bytes", "1.5K", input=b"x\n", env=env).returncode == 0
    assert json.loads((tmp_path / "topics" / "seg" / "topic.json").read_text())["segment_bytes"] == 1536


@pytest.mark.integration
def test_produce_to_mqtt_reports_no_offsets(mqtt_url: str, tmp_path: Path) -> None:
    """MQTT has no offsets: the ack and done lines said 0..N-1 (a count kept by this process)."""
    url = f"{mqtt_url}/h-topics/{uuid.uuid4().hex[:8]}"
    r = run_rq("produce", url, "--json", input=b"a\nb\n", env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [line["event"] for line in lines] == ["ack", "done"], lines
    for line in lines:
        assert line["records"] == 2 and line["first_offset"] is None and line["last_offset"] is None, line
    r = run_rq("produce", url, input=b"a\n", env=_env(tmp_path))
    assert r.returncode == 0 and b"offsets" not in r.stderr, r.stderr


def test_an_empty_format_is_refused(tmp_path: Path) -> None:
    """`--format ''` (an unset variable) fell back to the default format without a word."""
    env = _samples(tmp_path)
    for cmd in (["tail", "samples"], ["replay", "samples"], ["replay", "samples", "--to-topic", "copy"]):
        r = run_rq(*cmd, "--format", "", env=env)
        assert r.returncode == 2 and r.stdout == b"", (cmd, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and b"--format" in r.stderr, r.stderr
    assert not (tmp_path / "topics" / "copy").exists()
