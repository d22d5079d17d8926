"""`rq recv --keep-partial AGE`: as it starts, it removes the partial state of transfers nothing
touched for AGE and says so (an `expired` JSON line before `listening`, a line for people); `never`
keeps it; a bad AGE is a usage error. The library side is tests/transfer/test_partial_expiry.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from rqtest import rq_command
from xfer_kit import rq_env

from transfer.codec import digest
from transfer.manifest import FileEntry, file_key, make_manifest
from transfer.store import Store

CS = 1 << 20


def _abandoned(dest: Path) -> None:
    """A sender that sent one chunk of a 3 MiB file and never came back."""
    store = Store(dest)
    m = make_manifest(
        CS, [FileEntry(name="a.bin", size=3 * CS, mode=0o644, key=file_key("a.bin", 3 * CS, 1, 1, CS))]
    )
    plan = store.plan(m)
    data = b"\1" * CS
    plan.write(0, 0, data)
    plan.make_durable([(0, 0, digest(data))])
    if plan.reservation is not None:
        plan.reservation.wait()
    plan.close()


def _first_line(dest: Path, *args: str) -> dict[str, object]:
    proc = subprocess.Popen(
        [*rq_command(), "recv", str(dest), "--listen", "127.0.0.1:0", "--transport", "tcp", "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=rq_env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=10)
        return dict(json.loads(line))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_recv_removes_what_is_older_than_keep_partial_and_says_so(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    _abandoned(dest)
    assert any(p.suffix == ".part" for p in dest.rglob("*"))
    time.sleep(1.2)
    kept = _first_line(dest, "--keep-partial", "never")
    assert kept["event"] == "listening"
    assert any(p.suffix == ".part" for p in dest.rglob("*"))
    line = _first_line(dest, "--keep-partial", "1s")
    assert line["event"] == "expired" and line["older_than"] == 1.0
    assert line["files"] and isinstance(line["bytes"], int) and line["bytes"] >= 3 * CS
    assert not any(p.suffix == ".part" for p in dest.rglob("*"))


@pytest.mark.parametrize("bad", ["soon", "-1d", "inf"])
def test_a_bad_age_is_a_usage_error(tmp_path: Path, bad: str) -> None:
    out = subprocess.run(
        [*rq_command(), "recv", str(tmp_path / "d"), "--keep-partial", bad],
        capture_output=True,
        env=rq_env(),
        timeout=30,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert b"is not an age" in out.stderr and not (tmp_path / "d").exists()
