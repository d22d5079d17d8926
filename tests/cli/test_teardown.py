"""A command may skip the interpreter's teardown, but only from the console entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rqtest import run_rq

from rqcli import teardown
from rqcli.main import main


def test_in_process_caller_keeps_its_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "data"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 1000)
    monkeypatch.setattr(teardown, "_skip", False)
    with pytest.raises(SystemExit) as exc:  # os._exit here would end the test run itself
        main(["preload", str(src), "--cache-dir", str(tmp_path / "c"), "--json", "-q"])
    assert exc.value.code == 0
    assert teardown._skip  # preload asked for it; main() declined because it was called in-process
    monkeypatch.setattr(teardown, "_skip", False)


def test_console_preload_still_prints_its_summary_through_a_pipe(tmp_path: Path) -> None:
    src = tmp_path / "data"
    src.mkdir()
    for i in range(50):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 4096)
    proc = run_rq("preload", str(src), "--cache-dir", str(tmp_path / "c"), "--json")
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["event"] == "summary" and last["objects"] == 50
