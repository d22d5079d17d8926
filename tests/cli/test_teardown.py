"""A command may skip the interpreter's teardown, but only from the console entry point."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import run_rq

from rqcli import teardown
from rqcli.main import main


@pytest.fixture
def cache_dir(tmp_path: Path) -> Iterator[Path]:
    """A cache dir whose RAM tier is a private /dev/shm dir, removed afterwards (the default RAM
    root, derived from the cache dir, would outlive the test)."""
    from cache import Cache

    ram = Path("/dev/shm") / f"rqtest-{uuid.uuid4().hex[:10]}"
    Cache(tmp_path / "c", ram_dir=ram).close()
    yield tmp_path / "c"
    shutil.rmtree(ram, ignore_errors=True)


def test_in_process_caller_keeps_its_process(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "data"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 1000)
    monkeypatch.setattr(teardown, "_skip", False)
    with pytest.raises(SystemExit) as exc:  # os._exit here would end the test run itself
        main(["preload", str(src), "--cache-dir", str(cache_dir), "--json", "-q"])
    assert exc.value.code == 0
    assert teardown._skip  # preload asked for it; main() declined because it was called in-process
    monkeypatch.setattr(teardown, "_skip", False)


def test_console_preload_still_prints_its_summary_through_a_pipe(tmp_path: Path, cache_dir: Path) -> None:
    src = tmp_path / "data"
    src.mkdir()
    for i in range(50):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 4096)
    proc = run_rq("preload", str(src), "--cache-dir", str(cache_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["event"] == "summary" and last["objects"] == 50


_LEAVE = (  # stdout block-buffered whatever it is, so the text is still in the buffer at leave()
    "import io, sys; from rqcli import teardown; "
    "sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, 'w', closefd=False), 1 << 16)); "
    "sys.stdout.write('buffered, not flushed'); teardown.skip_teardown(); teardown.leave(0, True)"
)


def test_fast_exit_flushes_what_was_still_buffered() -> None:
    proc = subprocess.run([sys.executable, "-c", _LEAVE], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"buffered, not flushed"  # os._exit alone would have dropped it


def test_fast_exit_reports_output_it_could_not_write() -> None:
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([sys.executable, "-c", _LEAVE], stdout=full, stderr=subprocess.PIPE, timeout=60)
    assert proc.returncode == 120  # as the interpreter's own exit does when stdout cannot be flushed


_LATE_SIGNAL = """
import os, signal, sys
from rqcli import teardown
from rqcli.errors import Terminated

def terminate(signum, frame):  # what rqcli.main installs for SIGTERM
    raise Terminated()

signal.signal(signal.SIGTERM, terminate)

class Stdout:
    def write(self, text):
        return len(text)
    def flush(self):  # the signal lands in the last flush, after the answer was decided
        os.kill(os.getpid(), signal.SIGTERM)

sys.stdout = Stdout()
if sys.argv[1] == "skip":
    teardown.skip_teardown()
teardown.leave(0, True)
"""


@pytest.mark.parametrize("how", ["skip", "teardown"])
def test_a_signal_after_the_answer_does_not_change_the_exit_code(how: str) -> None:
    """A second SIGTERM (GNU timeout sends one to the child and one to its group) that came while
    rq flushed its last line made a finished command exit 1 with a traceback, or 143."""
    done = subprocess.run(
        [sys.executable, "-c", _LATE_SIGNAL, how], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-800:]
    assert b"Traceback" not in done.stderr
