"""`rq --help` and `rq --version` without importing every command (pure, no servers).

rqcli.main.SHORT_HELP holds each command's line of `rq --help`, so the help does not import the
command modules (and cache, topics, transfer with them); these tests keep it equal to the commands.
"""

from __future__ import annotations

import os
import subprocess
import sys

import click
import click.testing
import pytest

from rqcli.main import COMMANDS, SHORT_HELP, cli


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_short_help_table_is_each_commands_own(name: str) -> None:
    command = cli.get_command(click.Context(cli, info_name="rq"), name)
    assert command is not None
    assert not command.hidden  # (the table lists only what `rq --help` shows)
    assert SHORT_HELP[name] == command.get_short_help_str(70)


def test_short_help_table_names_only_commands() -> None:
    assert set(SHORT_HELP) == set(COMMANDS)


def test_help_lists_every_command_with_its_line() -> None:
    result = click.testing.CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        command = cli.get_command(click.Context(cli, info_name="rq"), name)
        assert command is not None
        first = command.get_short_help_str(70).split()[0]
        assert any(line.split()[:2] == [name, first] for line in result.output.splitlines()), name


def test_version_line_transfer_part_is_the_transfer_commands() -> None:
    from rqcli.commands.transfer import transfer_versions as of_command
    from rqcli.versions import transfer_versions

    assert transfer_versions() == of_command()


_HEAVY = ("rqcli.commands.", "cache.api", "topics", "transfer.sender", "transfer.receiver")


def _imported_by(*args: str) -> tuple[list[str], str]:
    """The heavy modules `python -m rqcli ARGS` imported, and its stdout."""
    probe = (
        "import sys\n"
        f"sys.argv = ['rq', *{list(args)!r}]\n"
        "try:\n"
        "    from rqcli.main import main\n"
        f"    main({list(args)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stdout.flush()\n"
        f"heavy = sorted(m for m in sys.modules if m.startswith({_HEAVY!r}))\n"
        "print('HEAVY', ','.join(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=_env(), check=False
    )
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("HEAVY"), done.stderr
    return [m for m in last.partition(" ")[2].split(",") if m], done.stdout


def _env() -> dict[str, str]:
    return {**os.environ, "RQ_CONFIG": "/dev/null"}


def test_help_imports_no_command() -> None:
    heavy, out = _imported_by("--help")
    assert "Commands:" in out and "offsets" in out
    assert heavy == []


def test_version_imports_no_command_module() -> None:
    heavy, out = _imported_by("--version")
    assert out.startswith("rq, version ")
    assert not [m for m in heavy if m.startswith("rqcli.commands.")]


def test_cache_command_leaves_out_the_other_jobs() -> None:
    heavy, _ = _imported_by("cache", "--help")
    assert "rqcli.commands.cache" in heavy
    assert not [
        m for m in heavy if m.startswith(("topics", "rqcli.commands.transfer", "rqcli.commands.topics"))
    ]


def test_cache_command_does_not_load_ctypes_for_malloc() -> None:
    probe = (
        "import sys\n"
        "from rqcli.main import main\n"
        "try:\n"
        "    main(['cache', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('MALLOC', 'rqcli.malloc' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=_env(), check=False
    )
    assert done.stdout.strip().splitlines()[-1] == "MALLOC False", done.stderr
