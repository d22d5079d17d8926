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
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"config file {target} is not valid TOML: {exc}", ExitCode.USAGE) from None
    return _normalise(data)


def _normalise(table: dict[str, Any]) -> dict[str, Any]:
    """TOML keys may use dashes like the flags do; Click's default_map wants parameter names."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        out[name] = _normalise(value) if isinstance(value, dict) else value
        if isinstance(value, dict):
            out[key] = out[name]  # subcommand names keep their dashes
    return out
