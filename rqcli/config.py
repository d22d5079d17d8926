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
import tomllib
from pathlib import Path
from typing import Any

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
            data = tomllib.load(fh)
    except FileNotFoundError:
        if explicit:
            raise CliError(f"config file {target} does not exist", ExitCode.USAGE) from None
        return {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"config file {target} is not valid TOML: {exc}", ExitCode.USAGE) from None
    return _normalise(data)


def check_command_table(config: dict[str, Any], command: str | None, path: Path | None) -> None:
    """`tail = 5` instead of a `[tail]` table would reach Click's default_map and fail inside it."""
    if command is not None and command in config and not isinstance(config[command], dict):
        where = path or default_config_path()
        raise CliError(
            f"config file {where}: {command!r} must be a table of options, not a value",
            ExitCode.USAGE,
            hint=f"write [{command}] on its own line, then the options under it",
        )


def _normalise(table: dict[str, Any]) -> dict[str, Any]:
    """TOML keys may use dashes like the flags do; Click's default_map wants parameter names."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        out[name] = _normalise(value) if isinstance(value, dict) else value
        if isinstance(value, dict):
            out[key] = out[name]  # subcommand names keep their dashes
    return out
