"""pol: `rq offsets TOPIC --group G` for a group that never committed said `G  -  <lag>` (exit 0),
as if the group existed and had read nothing, so a typo looked like a new consumer. Kafka's
kafka-consumer-groups says "Consumer group 'X' does not exist.": rq now says so in one line, exit 3
(not found). Listing every group (no --group) is unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jskit import made_streams
from rqtest import run_rq
from test_jetstream import publish

from rqcli.exitcodes import ExitCode


def _env(tmp_path: Path) -> dict[str, str]:
    return {"RQ_TOPICS_DIR": str(tmp_path / "topics")}


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_embedded_named_group_that_never_committed_is_not_found(tmp_path: Path, json_flag: list[str]) -> None:
    env = _env(tmp_path)
    assert run_rq("produce", "ev", input=b"a\nb\n", env=env).returncode == 0
    assert run_rq("offsets", "reset", "ev", "--group", "real", "--to", "1", env=env).returncode == 0
    r = run_rq("offsets", "ev", "--group", "tpyo", *json_flag, env=env)
    err = r.stderr.decode()
    assert r.returncode == ExitCode.NOT_FOUND, (r.stdout, err)
    assert r.stdout == b""
    assert len(err.strip().splitlines()) == 1
    assert "consumer group tpyo does not exist" in err
    # the group that is there is shown as before, and the listing of all groups is unchanged
    got = json.loads(run_rq("offsets", "ev", "--group", "real", "--json", env=env).stdout)
    assert got["groups"] == [{"group": "real", "committed": 1, "lag": 1}]
    every = run_rq("offsets", "ev", "--json", env=env)
    assert every.returncode == 0
    assert json.loads(every.stdout)["groups"] == [{"group": "real", "committed": 1, "lag": 1}]


def test_embedded_listing_without_groups_still_exits_0(tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert run_rq("produce", "ev", input=b"a\n", env=env).returncode == 0
    r = run_rq("offsets", "ev", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["groups"] == []


@pytest.fixture
def stream(services: Any) -> Iterator[tuple[str, str]]:
    with made_streams(services.nats_url, "pol_off") as make:
        yield services.nats_url, make(subjects=["{name}.>"])


@pytest.mark.integration
def test_jetstream_named_group_that_does_not_exist_is_not_found(stream: tuple[str, str]) -> None:
    url, name = stream
    publish(url, f"{name}.a", [b"1", b"2"])
    topic = f"{url}/{name}/{name}.a"
    r = run_rq("offsets", topic, "--group", "nobody", "--json")
    err = r.stderr.decode()
    assert r.returncode == ExitCode.NOT_FOUND, (r.stdout, err)
    assert "consumer group nobody does not exist" in err
    assert run_rq("offsets", "reset", topic, "--group", "g", "--to", "start").returncode == 0
    got = json.loads(run_rq("offsets", topic, "--group", "g", "--json").stdout)
    assert got["groups"] == [{"group": "g", "committed": 1, "lag": 2}]
