"""A record timestamped before 1970 given to the embedded log's writer (tp2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from topics import LogWriter
from topics.errors import SpecError


@pytest.mark.parametrize("ts", [-1, -5000, -(2**63), np.int64(-1)])
def test_a_timestamp_before_1970_is_refused_with_nothing_written(tmp_path: Path, ts: object) -> None:
    # It was stored silently as the previous record's time (0 in an empty log): a wrong time,
    # and a time seek or --from would then place it where it never was.
    t = tmp_path / "t"
    with LogWriter(t) as w:
        w.append([(1000, None, (), b"first")])
        with pytest.raises(SpecError, match="before 1970") as err:
            w.append([(None, None, (), b"ok"), (ts, None, (), b"old")])
        assert "\n" not in str(err.value)
        assert w.append([(2000, None, (), b"next")]) == (1, 1)  # nothing of the batch was written


def test_time_zero_is_still_taken(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "t") as w:
        assert w.append([(0, None, (), b"epoch")]) == (0, 0)
