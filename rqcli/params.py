"""Click parameter types shared by the commands."""

from __future__ import annotations

import math
import os
import re
from typing import Any, ClassVar

import click

_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
# what float() takes besides numbers; Seconds refuses them by value (nan, inf), with its own words
_FLOAT_WORDS = ("nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity")


def _plain_number(text: str) -> bool:
    """A number in ASCII digits: float() also takes `1_0` and other scripts' digits (`٣d`)."""
    return _NUMBER.fullmatch(text) is not None


class Whole(click.IntRange):
    """A whole number in ASCII digits: Click's INT is int(), which takes `1_6` and other scripts'
    digits (`--workers ٤` ran with 4 workers)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value) is None:
            self.fail(f"{value!r} is not a whole number", param, ctx)
        return super().convert(value, param, ctx)


class Seconds(click.FloatRange):
    """A finite number of seconds: `nan` slips through FloatRange (no comparison holds for it),
    and a retry or timeout of nan or inf never ends."""

    name = "number of seconds"

    def __init__(self, positive: bool = False) -> None:
        super().__init__(min=0, min_open=positive)
        self.positive = positive

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if (
            isinstance(value, str)
            and not _plain_number(value.strip())
            and value.strip().lower() not in _FLOAT_WORDS
        ):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            kind = "a positive number" if self.positive else "a number"
            self.fail(f"{value!r} is not {kind} of seconds", param, ctx)
        return seconds

    def get_metavar(self, *args: Any, **kwargs: Any) -> str:
        return "SECONDS"


class Age(click.ParamType):
    """A duration: 90, 90s, 30m, 12h, 7d, 2w; `never` or 0 -> None (keep for ever)."""

    name = "age"
    _UNITS: ClassVar[dict[str, int]] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

    @classmethod
    def text(cls, seconds: float) -> str:
        """An age the way --keep-partial takes it back: 7d, 12h, 90s."""
        for unit in "wdhm":
            if seconds >= cls._UNITS[unit] and seconds % cls._UNITS[unit] == 0:
                return f"{seconds / cls._UNITS[unit]:g}{unit}"
        return f"{seconds:g}s"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, float):
            return value
        text = str(value).strip().lower()
        if text in ("never", "0"):
            return None
        unit = self._UNITS.get(text[-1:])
        number = text[:-1] if unit else text
        seconds = float(number) * (unit or 1) if _plain_number(number) else math.nan
        if not math.isfinite(seconds) or seconds < 0:
            self.fail(f"{value!r} is not an age (e.g. 7d, 12h, 30m, never)", param, ctx)
        return seconds or None

    def get_metavar(self, *args: Any, **kwargs: Any) -> str:
        return "AGE"


class _NonEmpty(click.ParamType):
    """Refuses an empty string, typed (`--cache-dir "$DIR"` with DIR unset) or from the config file:
    to the OS '' is the current directory, and to a listener the default address, so the cache, the
    topics or the certificate were made in the working directory without a word. (An empty
    environment variable is unset to Click: the default applies.)"""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail("an empty string (an unset variable?)", param, ctx)
        return super().convert(value, param, ctx)


class NonEmptyPath(_NonEmpty, click.Path):
    """click.Path that refuses '' (see _NonEmpty) and expands a leading `~`: a path from the config
    file (TOML expands nothing), an environment variable or `--opt=~/x` (which some shells leave
    as typed) became a directory named `~` in the working directory, so the cache moved with the
    job's working directory. Arguments (SOURCE, DEST_DIR) are left as typed, as cp and rsync do."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.startswith("~"):
            value = os.path.expanduser(value)
        return super().convert(value, param, ctx)


class NonEmptyText(_NonEmpty, click.types.StringParamType):
    """Text that may not be '' (`--listen ""`: see _NonEmpty)."""


class OnePerLine(click.types.StringParamType):
    """Text for a repeatable option whose environment variable holds one value per line: Click
    splits such a variable at any white space, so RQ_PRELOAD_EXCLUDE='f g.tar' excluded `f` and
    `g.tar`, and the object named in it was fetched. A pattern or a header may hold spaces; a
    line break never does (and a config file's string is one value, as before)."""

    name = "text"

    def split_envvar_value(self, rv: str) -> list[str]:
        return [line for line in rv.splitlines() if line]


class CommandEnvFirst(click.Option):
    """An option with a well-known environment variable (RQ_CACHE_DIR, AWS_ENDPOINT_URL) that the
    command's own RQ_<COMMAND>_<OPTION> still overrides. Click reads the named variable first and
    the command's only when it is unset; the more specific setting should win, as a flag beats both."""

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        if self.allow_from_autoenv and ctx.auto_envvar_prefix is not None and self.name:
            value = os.environ.get(f"{ctx.auto_envvar_prefix}_{self.name.upper()}")
            if value:
                return value
        return super().resolve_envvar_value(ctx)


def documented_env_names_everywhere(command: click.Command, name: str) -> None:
    """documented_env_names for a command and, for a group (`rq cache`), each of its subcommands
    under the name Click's automatic variables use (RQ_CACHE_DU_JSON)."""
    documented_env_names(command, name)
    if isinstance(command, click.Group):
        for sub_name, sub in command.commands.items():
            documented_env_names_everywhere(sub, f"{name}_{sub_name}")


def documented_env_names(command: click.Command, name: str) -> None:
    """The documented rule is RQ_<COMMAND>_<OPTION>, from the flag; Click's automatic name comes
    from the Python parameter (RQ_REPLAY_FMT for --format, RQ_REPLAY_FROM_SPEC for --from). Each
    option whose two differ reads the documented name (and still the automatic one)."""
    for param in command.params:
        if not isinstance(param, click.Option) or param.envvar is not None or not param.name:
            continue
        longs = [o for o in param.opts if o.startswith("--")]
        flag = longs[0][2:].replace("-", "_").upper() if longs else ""
        if flag and flag != param.name.upper():
            param.envvar = [f"RQ_{name.upper()}_{flag}", f"RQ_{name.upper()}_{param.name.upper()}"]
