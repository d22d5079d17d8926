"""tq: `rq offsets reset` says when a relative target (`-N`, `+N`) was clamped at the start or the
end of the topic, as it already did for an absolute one, and says a damaged group was damaged
rather than printing "from -" (a group that had never committed)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import run_rq
from test_jetstream import publish


def _reset(env: dict[str, str], topic: str, *args: str) -> Any:
    r = run_rq("offsets", "reset", topic, "--group", "g", *args, "--dry-run", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def five(tmp_path: Path) -> dict[str, str]:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", "T", input=b"1\n2\n3\n4\n5\n", env=env).returncode == 0
    return env


@pytest.mark.parametrize(
    ("to", "after", "clamped"),
    [
        ("-10", 0, "start"),  # was null: 5 records, 10 asked for
        ("-6", 0, "start"),
        ("-5", 0, None),
        ("-4", 1, None),
        ("+10", 5, "end"),  # was null
        ("+5", 5, None),
        ("99", 5, "end"),
        ("2", 2, None),
    ],
)
def test_relative_reset_clamp_is_flagged(five: dict[str, str], to: str, after: int, clamped: Any) -> None:
    got = _reset(five, "T", "--to", to)
    assert (got["after"], got["clamped"]) == (after, clamped)


def test_relative_reset_clamp_line(five: dict[str, str]) -> None:
    r = run_rq("offsets", "reset", "T", "--group", "g", "--to", "-10", "--dry-run", env=five)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip().endswith("from - to 0 (clamped to the start 0)")


def test_reset_of_a_damaged_group_says_damaged(five: dict[str, str], tmp_path: Path) -> None:
    groups = tmp_path / "T" / "groups"
    groups.mkdir()
    (groups / "g.json").write_text("garbage")
    got = _reset(five, "T", "--to", "2")
    assert got["before"] is None and "is damaged" in got["damaged"]  # was no damaged key at all
    r = run_rq("offsets", "reset", "T", "--group", "g", "--to", "2", env=five)
    assert r.returncode == 0, r.stderr
    said = (r.stdout + r.stderr).decode()
    assert "from a damaged offset to 2" in said and "from -" not in said  # was "from - to 2"
    assert run_rq("offsets", "T", "--group", "g", "--json", env=five).returncode == 0  # mended
    new = _reset(five, "T", "--to", "3")
    assert new["before"] == 2 and "damaged" not in new


@pytest.fixture
def stream(services: Any) -> Iterator[tuple[str, str]]:
    with made_streams(services.nats_url, "tq_reset") as make:
        yield services.nats_url, make(subjects=["{name}.>"])


@pytest.mark.integration
def test_relative_reset_clamp_on_a_filtered_stream(stream: tuple[str, str]) -> None:
    url, name = stream
    publish(url, f"{name}.a", [b"1", b"2"])
    publish(url, f"{name}.b", [b"x"] * 5)
    topic = f"{url}/{name}/{name}.a"
    assert _reset({}, topic, "--to", "-2")["clamped"] is None
    got = _reset({}, topic, "--to", "-3")  # 7 messages in the stream, 2 on the subject
    assert (got["after"], got["clamped"]) == (1, "start")
