"""Times given to the topics library's public API are checked at the boundary (tp2)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from topics.errors import SpecError
from topics.pipeline import Request

BAD = [
    "1700000000000",
    datetime(2026, 1, 1),
    datetime(2026, 1, 1, tzinfo=UTC),
    True,
    float("nan"),
    1.5,
    2**63,
]


@pytest.mark.parametrize("name", ["time_from", "time_to"])
@pytest.mark.parametrize("value", BAD)
def test_a_time_bound_not_int_ms_is_refused_in_one_line(name: str, value: object) -> None:
    # A str or a datetime failed deep in the read with a TypeError; NaN compared False with every
    # timestamp and a bool was taken as 0/1 ms: a wrong answer without a word.
    with pytest.raises(SpecError, match=f"Request {name} must be Unix time in milliseconds") as err:
        Request(0, **{name: value})  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_a_datetime_is_told_how_to_convert() -> None:
    with pytest.raises(SpecError, match=r"int\(dt.timestamp\(\) \* 1000\)"):
        Request(0, time_from=datetime(2026, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize("value", [0, -5, 1_700_000_000_000, np.int64(1_700_000_000_000)])
def test_int_times_are_taken_as_plain_ints(value: object) -> None:
    req = Request(0, time_from=value, time_to=value)  # type: ignore[arg-type]
    assert type(req.time_from) is int and req.time_from == int(value)  # type: ignore[call-overload]
    assert type(req.time_to) is int
