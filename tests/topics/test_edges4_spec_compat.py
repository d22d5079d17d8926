"""A saved replay spec that pins no time bounds and lost nothing to retention carried
`"time_from": null, "time_to": null, "aged_out": null`, fields the rqs from before them do not
know: those refuse any field they do not know (`ReplaySpec(**fields)`: 'unexpected keyword
argument'), so a spec they could replay exactly was refused. Those fields are now left out while
null (absent reads as null); a spec that does pin time bounds still carries them, and the older
rq still refuses it rather than replay it without them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rqtest import run_rq

from topics.savedspec import ReplaySpec


@dataclass
class FirstSpec:
    """The fields of the first rq_replay_spec 1 (7a13a6a..95d458e~1), whose loader was
    `cls(**{k: v for k, v in data.items() if k != "rq_replay_spec"})`."""

    source: str
    kind: str
    start: int
    stop: int
    records: int
    digest: str
    from_spec: str | None = None
    to_spec: str | None = None
    group: str | None = None
    where: str | None = None
    fields: str | None = None
    first_offset: int | None = None
    last_offset: int | None = None
    created: str | None = None


def _older_rq_loads(path: Path) -> FirstSpec:
    data: dict[str, Any] = json.loads(path.read_text())
    assert data.pop("rq_replay_spec") == 1
    return FirstSpec(**data)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    env = {"RQ_TOPICS_DIR": str(tmp_path / "t")}
    made = run_rq("produce", "ev", input=b"a\nb\nc\nd\ne\n", env=env)
    assert made.returncode == 0, made.stderr
    return env


def test_a_spec_without_time_bounds_or_gaps_reads_in_an_older_rq(env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "s.json"
    r = run_rq("replay", "ev", "--from", "1:4", "--format", "raw", "--save-spec", str(spec), env=env)
    assert r.returncode == 0, r.stderr
    old = _older_rq_loads(spec)  # old code: TypeError, unexpected keyword argument 'time_from'
    assert (old.start, old.stop, old.records) == (1, 4, 3)
    new = ReplaySpec.load(spec)
    assert (new.time_from, new.time_to, new.aged_out) == (None, None, None)
    again = run_rq("replay", "--spec", str(spec), "--format", "raw", env=env)
    assert again.returncode == 0 and again.stdout == b"b\nc\nd\n", again.stderr


def test_a_spec_with_a_time_bound_still_carries_it(env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "s.json"
    r = run_rq("replay", "ev", "--from", "@0", "--format", "raw", "--save-spec", str(spec), env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(spec.read_text())["time_from"] == 0
    assert ReplaySpec.load(spec).time_from == 0
    with pytest.raises(TypeError, match="time_from"):
        _older_rq_loads(spec)  # refused by the older rq, not replayed without its bound
