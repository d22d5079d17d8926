"""The console entry turns the collector off for start-up; every command gets it back."""

from __future__ import annotations

import gc
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from rqcli import teardown
from rqcli.main import COMMANDS, OWN_GC, cli, main


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    yield
    gc.enable()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_loading_a_command_turns_the_collector_back_on(name: str) -> None:
    gc.disable()
    with click.Context(cli) as ctx:
        assert cli.get_command(ctx, name) is not None
    assert gc.isenabled() == (name not in OWN_GC)


def test_preload_turns_it_back_on_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cache import Cache

    src = tmp_path / "data"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 1000)
    ram = Path("/dev/shm") / f"rqtest-{uuid.uuid4().hex[:10]}"
    Cache(tmp_path / "c", ram_dir=ram).close()  # a private RAM root, removed below
    monkeypatch.setattr(teardown, "_skip", False)
    gc.disable()
    try:
        with pytest.raises(SystemExit) as exc:
            main(["preload", str(src), "--cache-dir", str(tmp_path / "c"), "-q"])
    finally:
        shutil.rmtree(ram, ignore_errors=True)
        gc.unfreeze()
    assert exc.value.code == 0
    assert gc.isenabled()


def test_the_console_script_starts_with_it_off() -> None:
    code = "import gc, rqcli.console; print(gc.isenabled())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
