"""Click parameter types shared by the commands."""

from __future__ import annotations

import math
from typing import Any

import click


class Seconds(click.FloatRange):
    """A finite number of seconds: `nan` slips through FloatRange (no comparison holds for it),
    and a retry or timeout of nan or inf never ends."""

    name = "number of seconds"

    def __init__(self, positive: bool = False) -> None:
        super().__init__(min=0, min_open=positive)
        self.positive = positive

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            kind = "a positive number" if self.positive else "a number"
            self.fail(f"{value!r} is not {kind} of seconds", param, ctx)
        return seconds

    def get_metavar(self, *args: Any, **kwargs: Any) -> str:
        return "SECONDS"
