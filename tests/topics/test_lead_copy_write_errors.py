"""`rq replay --to-topic` and `rq tail --record` onto an embedded log whose file system refuses a
write other than for space: a failing disk (EIO), one gone read-only (EROFS). A full disk was
already one line naming the target, what it stored and how to go on (exit 7); these were the bare
strerror, "rq: error: Input/output error" (exit 1), as `rq produce`'s were (tf). The fault is
injected in the rq process (os.pwrite raising on its third call), as test_tf_produce_write_errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rqtest import run_rq
from test_tf_produce_write_errors import _FAIL_NTH

from rqcli.exitcodes import ExitCode

_CASES = {
    "EIO": ("failed (Input/output error)", "check the disk"),
    "EROFS": ("is read-only", "writable again"),
}


def _rq_with(setup: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    code = f"{setup}\nimport sys\nsys.argv[0] = 'rq'\nfrom rqcli.console import main\nmain()\n"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        timeout=120,
        env={**os.environ, "CI": "1", **env},
        check=False,
    )


def _source(env: dict[str, str]) -> None:
    for k in range(10):  # ten batches: the copy fails inside the source, not at its start
        chunk = "".join(f"{k:02d}-{i:05d}\n" for i in range(500)).encode()
        assert run_rq("produce", "src", input=chunk, env=env).returncode == 0


@pytest.mark.parametrize("name", sorted(_CASES))
def test_a_copy_whose_writes_are_refused_names_the_target(tmp_path: Path, name: str) -> None:
    says, hint = _CASES[name]
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    _source(env)
    target = tmp_path / "dst"
    setup = _FAIL_NTH.format(func="pwrite", call=3, name=name)
    r = _rq_with(setup, "replay", "src", "--group", "g", "--commit", "--to-topic", str(target), env=env)
    err = r.stderr.decode().strip()
    assert r.returncode == ExitCode.FAILURE and len(err.splitlines()) == 1, err
    assert f"holding {target} {says}: the copy to" in err, err  # was the bare strerror
    assert "record(s) before it" in err and "group g is committed at offset" in err, err
    assert hint in err.split(" — ")[1], err


@pytest.mark.parametrize("name", sorted(_CASES))
def test_a_capture_whose_writes_are_refused_names_it(tmp_path: Path, name: str) -> None:
    says, hint = _CASES[name]
    env = {"RQ_TOPICS_DIR": str(tmp_path / "topics")}
    _source(env)
    cap = tmp_path / "cap"
    setup = _FAIL_NTH.format(func="pwrite", call=3, name=name)
    r = _rq_with(setup, "tail", "src", "-n", "5000", "--record", str(cap), "--format", "raw", env=env)
    err = r.stderr.decode().strip()
    assert r.returncode == ExitCode.FAILURE and len(err.splitlines()) == 1, err
    assert f"holding {cap} {says}: --record to" in err and "stdout shows exactly those" in err, err
    assert hint in err.split(" — ")[1], err
