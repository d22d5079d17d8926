"""Offsets given to the library: starts, stops and commits of the wrong type or sign (tw)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from topics import LogWriter, ReplaySpec, TopicLog
from topics.errors import SpecError
from topics.pipeline import Request, run
from topics.sources.embedded import EmbeddedSource


def _topic(tmp_path: Path, n: int = 10) -> Path:
    t = tmp_path / "t"
    with LogWriter(t) as w:
        w.append([(None, None, (), b"v%d" % i) for i in range(n)])
    return t


@pytest.mark.parametrize("start", [-5, 1.5, True, "1", None])
def test_a_start_that_is_no_offset_is_refused(tmp_path: Path, start: object) -> None:
    t = _topic(tmp_path)
    with pytest.raises(SpecError, match="start must be an offset"):
        Request(start=start, stop=3, digest=True)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="start must be an offset"):
        TopicLog(t).reader(start)  # type: ignore[arg-type]


@pytest.mark.parametrize("stop", [-1, 2.5, False])
def test_a_stop_that_is_no_offset_is_refused(tmp_path: Path, stop: object) -> None:
    t = _topic(tmp_path)
    with pytest.raises(SpecError, match="stop must be an offset"):
        Request(start=0, stop=stop)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="stop must be an offset"):
        TopicLog(t).reader(0, stop=stop)  # type: ignore[arg-type]


def test_numpy_offsets_read_commit_and_save_as_ints(tmp_path: Path) -> None:
    t = _topic(tmp_path)
    src = EmbeddedSource(t)
    req = Request(start=np.int64(2), stop=np.int64(5), digest=True)
    got: list[int] = []
    res = run(src, req, lambda recs, _d: got.extend(r[0] for r in recs))
    assert got == [2, 3, 4] and res.gaps == []
    spec = ReplaySpec.from_result(src, req, res)
    spec.last_offset = np.int64(4)  # type: ignore[assignment]
    spec.save(tmp_path / "s.json")
    loaded = ReplaySpec.load(tmp_path / "s.json")
    assert (loaded.start, loaded.stop, loaded.last_offset) == (2, 5, 4)
    log = TopicLog(t)
    log.groups.commit("g", np.int64(7))  # type: ignore[arg-type]
    assert log.groups.committed("g") == 7
    assert list(TopicLog(t).reader(np.int64(8))) != []  # type: ignore[arg-type]


@pytest.mark.parametrize("offset", [7.5, True, "3", None])
def test_a_commit_that_is_no_offset_is_refused_and_stores_nothing(tmp_path: Path, offset: object) -> None:
    t = _topic(tmp_path)
    log = TopicLog(t)
    with pytest.raises(SpecError, match="cannot commit offset"):
        log.groups.commit("g", offset)  # type: ignore[arg-type]
    assert log.groups.committed("g") is None
