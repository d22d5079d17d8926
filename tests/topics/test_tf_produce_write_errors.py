"""`rq produce` when the file system refuses a segment's write or its fdatasync partway.

A full disk (ENOSPC) was one line naming the topic, the records acknowledged before it and what to
do (exit 7); a quota used up (EDQUOT), a file system gone read-only (EROFS) and a failing disk
(EIO) were bare: `rq: error: Disk quota exceeded` (exit 7), `Read-only file system` (exit 1),
`Input/output error` (exit 1). They now have the full disk's shape: the topic, the records
acknowledged, and a hint of their own (a quota is said as a quota, not as no space). Exit codes as
documented: 7 for a disk full or a quota used up, 1 otherwise. What was acknowledged stays
readable, once each. The faults are injected (os.pwrite / os.fdatasync raising), no root needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rqtest import run_rq

from rqcli.exitcodes import ExitCode

# the `call`-th call of os.<func> raises errno.<name> (the first batches go in)
_FAIL_NTH = """
import errno, os
real = os.{func}
calls = [0]
def failing(*args):
    calls[0] += 1
    if calls[0] == {call}:
        raise OSError(errno.{name}, os.strerror(errno.{name}))
    return real(*args)
os.{func} = failing
"""

_CASES = {
    "ENOSPC": (ExitCode.NO_SPACE, "the disk holding {topic} is full", "free space"),
    "EDQUOT": (ExitCode.NO_SPACE, "the disk quota for {topic} is used up", "quota"),
    "EROFS": (ExitCode.FAILURE, "the file system holding {topic} is read-only", "writable again"),
    "EIO": (ExitCode.FAILURE, "the disk holding {topic} failed (Input/output error)", "check the disk"),
}


def _produce_with(setup: str, topics: Path, data: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`rq produce ev ARGS` with `setup` run first (as rqtest.popen_rq_with), `data` on stdin."""
    code = f"{setup}\nimport sys\nsys.argv[0] = 'rq'\nfrom rqcli.console import main\nmain()\n"
    return subprocess.run(
        [sys.executable, "-c", code, "produce", "ev", "--topics-dir", str(topics), *args],
        input=data,
        capture_output=True,
        timeout=120,
        env={**os.environ, "CI": "1"},
        check=False,
    )


@pytest.mark.parametrize("func", ["pwrite", "fdatasync"])
@pytest.mark.parametrize("name", sorted(_CASES))
def test_a_refused_write_names_the_topic_and_what_was_acknowledged(
    tmp_path: Path, name: str, func: str
) -> None:
    code, says, hint = _CASES[name]
    topic = tmp_path / "t" / "ev"
    data = "".join(f"{i}\n" for i in range(200_000)).encode()
    proc = _produce_with(_FAIL_NTH.format(func=func, call=3, name=name), tmp_path / "t", data, "--json")
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == code, err
    lines = [json.loads(x) for x in out.decode().splitlines()]
    acked = sum(x["records"] for x in lines if x["event"] == "ack")
    done = lines[-1]
    assert done["event"] == "done" and done["records"] == acked > 0, lines
    said = err.decode().strip().splitlines()
    assert len(said) == 1, err
    line = said[0]
    assert line.startswith(f"rq: error: {says.format(topic=topic)}: "), line  # was the bare strerror
    assert f"the {acked} record(s) acknowledged before it stay readable" in line, line
    assert hint in line.split(" — ")[1] and "appending resumes" in line, line
    if name == "EDQUOT":
        assert "full" not in line and "no space" not in line.lower(), line
    # exactly the acknowledged records, once each, in order
    back = run_rq("replay", "ev", "--topics-dir", str(tmp_path / "t"), "--format", "raw")
    assert back.returncode == 0, back.stderr
    assert back.stdout == data[: len(back.stdout)] and back.stdout.count(b"\n") == acked


def test_a_refused_first_write_says_nothing_was_appended(tmp_path: Path) -> None:
    proc = _produce_with(_FAIL_NTH.format(func="fdatasync", call=1, name="EIO"), tmp_path / "t", b"a\nb\n")
    err = proc.stderr
    assert proc.returncode == ExitCode.FAILURE, err
    line = err.decode().strip()
    assert line.startswith(f"rq: error: the disk holding {tmp_path / 't' / 'ev'} failed"), line
    assert "nothing was appended" in line, line
