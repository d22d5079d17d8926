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

import os
import stat
from collections.abc import Collection
from pathlib import Path
from typing import Any

import click
from platformdirs import user_config_path

from rqcli.errors import CliError
from rqcli.exitcodes import ExitCode


def default_config_path() -> Path | None:
    """RQ_CONFIG (an empty one counts as unset, as every RQ_* does; `~` is the home directory, as
    for --config), else ~/.config/rq/config.toml; None where there is no home to find it in (HOME
    unset and the uid without a passwd entry, as OpenShift runs containers): every command failed
    there with "unexpected RuntimeError", though the file is optional."""
    named = os.environ.get("RQ_CONFIG")
    if named:
        return Path(os.path.expanduser(named))
    try:
        return user_config_path("rq") / "config.toml"
    except RuntimeError:  # platformdirs: "could not determine the home directory"
        return None


# The file the config was read from (None: none was), for errors Click raises later about a value
# that came from it: a callback's check of a size (rqcli/main.py names the file, table and key).
read_from: Path | None = None

# Each key as the file spells it (`cache-dir`), by its table and the name Click knows it by
# (`cache`, `cache_dir`; `replay`, `from_spec` for `from`): errors name the key the user wrote.
_written: dict[tuple[str, str], str] = {}


def written(table: str, name: str) -> str | None:
    """The key of [table] (dotted, `cache.ls`) that set the parameter `name`, as the file spells it."""
    return _written.get((table.replace("-", "_"), name))


def load_config(path: Path | None) -> dict[str, Any]:
    """Reads the config file; a missing default file is an empty config, a missing explicit one an error."""
    global read_from
    read_from = None
    _written.clear()
    # (an empty RQ_CONFIG is unset: Click gives no path for it, and the default file may be missing)
    explicit = path is not None or bool(os.environ.get("RQ_CONFIG"))
    target = path or default_config_path()
    if target is None:
        return {}  # no home to hold one
    try:
        # O_NONBLOCK: a FIFO with no writer would block the open (and a read) for ever
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if explicit:
            raise CliError(f"config file {target} does not exist", ExitCode.USAGE) from None
        return {}
    except OSError as exc:  # no permission: the default path is checked nowhere else
        raise CliError(f"config file {target} cannot be read: {exc.strerror}", ExitCode.USAGE) from None
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if _is_devnull(info):
            return {}  # `--config /dev/null` (or RQ_CONFIG=/dev/null): no config file, as for git and pip
        if not stat.S_ISREG(mode):  # a directory; a FIFO, whose read waits for a writer; a device
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device"
            raise CliError(
                f"config file {target} cannot be read: it is {kind}, not a regular file", ExitCode.USAGE
            )
        with open(fd, "rb", closefd=False) as fh:
            raw = fh.read()
    except OSError as exc:
        raise CliError(f"config file {target} cannot be read: {exc.strerror}", ExitCode.USAGE) from None
    finally:
        os.close(fd)
    import tomllib  # only when there is a file: most runs have none, and every run starts here

    try:
        # a UTF-8 byte order mark (Windows editors write one) is not TOML, but no file means it
        data = tomllib.loads(raw.decode().removeprefix("\ufeff"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"config file {target} is not valid TOML: {exc}", ExitCode.USAGE) from None
    read_from = target
    return _normalise(data, "")


def _is_devnull(info: os.stat_result) -> bool:
    if not stat.S_ISCHR(info.st_mode):
        return False
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(null.st_mode) and info.st_rdev == null.st_rdev


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
    if where is None:
        return  # no file was read (no home to hold one)
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
            import difflib  # (an error's hint only)

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
    spelled = written(name, key) or key  # as the file has it: `cache-dir`, not `cache_dir`
    label = f"[{name}] {spelled}" if name else spelled
    param = params.get(key)
    if param is None:
        # the option's own name (`from` for --from, `format` for --format), as the docs say keys
        # are, where it differs from the parameter Click fills (`from_spec`, `fmt`): default_map
        # only knows the parameter, so the key is stored again under that name
        param = _by_flag(command).get(key.replace("-", "_"))
        if param is not None and param.name:
            table[param.name] = table.pop(key)
            key = param.name
            _written[(name.replace("-", "_"), key)] = spelled
    if param is None:
        # named as the docs and --help name them (`to`, `dry-run`), not as Click's parameters
        known = sorted(flag.replace("_", "-") for flag in _by_flag(command)) + subcommands
        import difflib

        near = difflib.get_close_matches(spelled.replace("_", "-"), known, n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"known here: {', '.join(known) or 'none'}"
        what = "option" if name else "command or option"
        raise CliError(f"config file {where}: {label}: no such {what}", ExitCode.USAGE, hint=hint)
    value = table[key]
    many = getattr(param, "multiple", False) or param.nargs != 1
    if many and isinstance(value, str):
        value = table[key] = [value]  # `include = "*.tar"` means one pattern, not one per character
    scalars = value if many and isinstance(value, list) else [value]
    for scalar in scalars:
        wanted = _toml_kind(param)
        if not isinstance(scalar, (dict, list)) and not _is_kind(scalar, wanted):
            # Click converts what it is given (int(1.5) is 1, int(True) 1, str(5) "5"): the value
            # the file holds must already be of the option's kind, as on the command line
            raise CliError(
                f"config file {where}: {label}: {_toml_text(scalar)} ({type(scalar).__name__}) is not "
                f"a valid {wanted}",
                ExitCode.USAGE,
                hint="write it as " + _KIND_EXAMPLE[wanted].format(key=spelled),
            )
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


# Options Click reads as text that a number written bare in TOML means as well: sizes and durations
# (parsed by a callback: `ram-limit = 1073741824`, `retention-age = 90`), and positions.
_NUMBERS_AS_TEXT = {"from_spec", "to_spec"}
_KIND_EXAMPLE = {
    "whole number": "a number without a point ({key} = 64)",
    "number": "a number ({key} = 2.5)",
    "boolean": "true or false",
    "string": 'text in quotes ({key} = "…")',
    "string or number": 'a number or text in quotes ({key} = "…")',
}


def _toml_kind(param: click.Parameter) -> str:
    """What a TOML value of the option must be: the kind its flag's text would convert to."""
    kind = param.type
    if isinstance(kind, click.types.BoolParamType):
        return "boolean"
    if isinstance(kind, click.types.IntParamType):
        return "whole number"
    if isinstance(kind, click.types.FloatParamType):
        return "number"
    if isinstance(kind, click.types.StringParamType) and (param.callback or param.name in _NUMBERS_AS_TEXT):
        return "string or number"
    if isinstance(kind, (click.types.StringParamType, click.Path, click.Choice)):
        return "string"
    return "string or number"  # rq's own types (Age: `keep-partial = 0`) parse numbers too


def _is_kind(value: Any, kind: str) -> bool:
    """Text is what a flag is typed as: Click parses it as on the command line, for every kind."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (
        isinstance(value, str)
        or {
            "boolean": isinstance(value, bool),
            "whole number": isinstance(value, int) and not isinstance(value, bool),
            "number": number,
            "string or number": number,
            "string": False,
        }[kind]
    )


def _toml_text(value: Any) -> str:
    """A scalar as TOML writes it (true, not Python's True)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


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


def _normalise(table: dict[str, Any], path: str) -> dict[str, Any]:
    """TOML keys may use dashes like the flags do; Click's default_map wants parameter names.
    `path` is the table's own dotted name (`cache.ls`), "" for the file's top level."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        _written.setdefault((path, name), key)
        inner = f"{path}.{name}" if path else name
        out[name] = _normalise(value, inner) if isinstance(value, dict) else value
        if isinstance(value, dict):
            out[key] = out[name]  # subcommand names keep their dashes
    return out
