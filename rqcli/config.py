"""The config file: TOML whose tables are named for commands and feed Click's default_map.

Precedence is Click's own: command-line flag > RQ_* environment variable > config file > default.

    # ~/.config/rq/config.toml
    [preload]
    workers = 64
    cache_dir = "/mnt/nvme/rq-cache"
    [cache.ls]          # nested groups nest tables
    cache_dir = "/mnt/nvme/rq-cache"
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import click
from platformdirs import user_config_path

from rqcli.errors import CliError
from rqcli.exitcodes import ExitCode


def default_config_path() -> Path:
    return Path(os.environ.get("RQ_CONFIG") or user_config_path("rq") / "config.toml")


def load_config(path: Path | None) -> dict[str, Any]:
    """Reads the config file; a missing default file is an empty config, a missing explicit one an error."""
    explicit = path is not None or "RQ_CONFIG" in os.environ
    target = path or default_config_path()
    try:
        with open(target, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        if explicit:
            raise CliError(f"config file {target} does not exist", ExitCode.USAGE) from None
        return {}
    except OSError as exc:  # a directory, no permission: the default path is checked nowhere else
        raise CliError(f"config file {target} cannot be read: {exc.strerror}", ExitCode.USAGE) from None
    import tomllib  # only when there is a file: most runs have none, and every run starts here

    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"config file {target} is not valid TOML: {exc}", ExitCode.USAGE) from None
    return _normalise(data)


def check_config(
    config: dict[str, Any],
    root: click.Group,
    ctx: click.Context,
    commands: Collection[str],
    path: Path | None,
) -> None:
    """Refuses what Click's default_map would misread: a key naming no option (a typo silently
    ignored) or a value of the wrong type (a TypeError deep inside Click). Only the invoked command's
    table is checked key by key, so `rq tail` does not import the modules of every other command."""
    where = path or default_config_path()
    for key, value in list(config.items()):  # (_check_key may rename a key: see there)
        if key in commands:
            if not isinstance(value, dict):
                raise CliError(
                    f"config file {where}: {key!r} must be a table of options, not a value",
                    ExitCode.USAGE,
                    hint=f"write [{key}] on its own line, then the options under it",
                )
            if key == ctx.invoked_subcommand:
                command = root.get_command(ctx, key)
                if command is not None:
                    _check_table(value, command, click.Context(command, parent=ctx), key, where)
        elif not isinstance(value, dict):
            # rq's own options (--json, -q, -v) are read before the file is: a top-level key would
            # be accepted and do nothing
            raise CliError(
                f"config file {where}: top-level {key!r} is not read; options go in a command's table",
                ExitCode.USAGE,
                hint=f"write it under the command it is for, e.g. [preload] then {key} = …",
            )
        else:
            near = difflib.get_close_matches(key, sorted(commands), n=1)
            raise CliError(
                f"config file {where}: [{key}]: no such command",
                ExitCode.USAGE,
                hint=f"did you mean {near[0]!r}?" if near else f"known: {', '.join(sorted(commands))}",
            )


def _check_table(
    table: dict[str, Any], command: click.Command, ctx: click.Context, name: str, where: Path
) -> None:
    subcommands = command.commands if isinstance(command, click.Group) else {}
    for key, value in list(table.items()):  # (_check_key may rename a key: see there)
        if _dashed_twin(table, key):
            continue
        sub = subcommands.get(key) or subcommands.get(key.replace("_", "-"))
        if sub is not None:
            if not isinstance(value, dict):
                raise CliError(
                    f"config file {where}: [{name}] {key!r} must be a table of options, not a value",
                    ExitCode.USAGE,
                    hint=f"write [{name}.{key}] on its own line, then the options under it",
                )
            _check_table(value, sub, click.Context(sub, parent=ctx), f"{name}.{key}", where)
        else:
            _check_key(table, key, command, ctx, name, where, sorted(subcommands))


def _check_key(
    table: dict[str, Any],
    key: str,
    command: click.Command,
    ctx: click.Context,
    name: str,
    where: Path,
    subcommands: list[str],
) -> None:
    """One `key = value` of a command's table: an option of that command, of a type it accepts."""
    params = {p.name: p for p in command.params if p.name and p.name != "help"}
    label = f"[{name}] {key}" if name else key
    param = params.get(key)
    if param is None:
        # the option's own name (`from` for --from, `format` for --format), as the docs say keys
        # are, where it differs from the parameter Click fills (`from_spec`, `fmt`): default_map
        # only knows the parameter, so the key is stored again under that name
        param = _by_flag(command).get(key.replace("-", "_"))
        if param is not None and param.name:
            table[param.name] = table.pop(key)
            key = param.name
    if param is None:
        # named as the docs and --help name them (`to`, `dry-run`), not as Click's parameters
        known = sorted(flag.replace("_", "-") for flag in _by_flag(command)) + subcommands
        near = difflib.get_close_matches(key.replace("_", "-"), known, n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"known here: {', '.join(known) or 'none'}"
        what = "option" if name else "command or option"
        raise CliError(f"config file {where}: {label}: no such {what}", ExitCode.USAGE, hint=hint)
    value = table[key]
    many = getattr(param, "multiple", False) or param.nargs != 1
    if many and isinstance(value, str):
        value = table[key] = [value]  # `include = "*.tar"` means one pattern, not one per character
    scalars = value if many and isinstance(value, list) else [value]
    try:
        if any(isinstance(v, (dict, list)) for v in scalars):
            raise TypeError("a list or table")
        param.type_cast_value(ctx, value)
    except click.BadParameter as exc:
        raise CliError(f"config file {where}: {label}: {exc.message}", ExitCode.USAGE) from None
    except (TypeError, ValueError):
        shown = f"{value!r} ({type(value).__name__})"
        raise CliError(
            f"config file {where}: {label}: {shown} is not a valid {param.type.name}", ExitCode.USAGE
        ) from None


def _by_flag(command: click.Command) -> dict[str, click.Parameter]:
    """A command's options by their long flag names, dashes as underscores (`--retention-age`:
    `retention_age`)."""
    return {
        opt[2:].replace("-", "_"): p
        for p in command.params
        if p.name != "help"
        for opt in getattr(p, "opts", [])
        if opt.startswith("--")
    }


def _dashed_twin(table: dict[str, Any], key: str) -> bool:
    """`[cache.foo-bar]` is stored under both spellings (see _normalise); check it once."""
    dashed = key.replace("_", "-")
    return dashed != key and table.get(dashed) is table[key] and isinstance(table[key], dict)


def _normalise(table: dict[str, Any]) -> dict[str, Any]:
    """TOML keys may use dashes like the flags do; Click's default_map wants parameter names."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        out[name] = _normalise(value) if isinstance(value, dict) else value
        if isinstance(value, dict):
            out[key] = out[name]  # subcommand names keep their dashes
    return out
