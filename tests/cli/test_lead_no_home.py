"""ct: with HOME unset and a uid that has no passwd entry (how OpenShift runs a container), every
command failed "unexpected RuntimeError: could not determine the home directory for '~/.config'",
exit 1, even with RQ_CACHE_DIR given: the optional config file's default path was looked up first.
Now there is no default config file there, and a default path that is really needed is exit 2
naming what to set."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import rq_command

UID = 1000650000  # OpenShift's range


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory that uid can use (pytest's own are root's alone)."""
    where = Path(tempfile.mkdtemp(prefix="rq-no-home-"))
    where.chmod(0o777)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _as_nobody_without_home(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["setpriv", f"--reuid={UID}", "--regid=0", "--clear-groups", *rq_command(), *args],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CI": "1", **env},
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )


@pytest.fixture(autouse=True)
def _needs_root_and_setpriv() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as a uid without a passwd entry")
    try:
        pwd.getpwuid(UID)
        pytest.skip(f"uid {UID} has a passwd entry here")
    except KeyError:
        pass


def test_a_given_cache_dir_is_used_without_a_home(open_dir: Path) -> None:
    done = _as_nobody_without_home(open_dir, "cache", "du", RQ_CACHE_DIR=str(open_dir / "c"))
    assert done.returncode == 3 and b"no rq cache at" in done.stderr, done.stderr  # (old: 1, RuntimeError)


@pytest.mark.parametrize(
    ("args", "named", "not_named"),
    [
        (("cache", "du"), "--cache-dir / RQ_CACHE_DIR", "RQ_TOPICS_DIR"),
        (("tail", "t"), "--topics-dir / RQ_TOPICS_DIR", "RQ_CACHE_DIR"),
        (("recv", "dest", "--once"), "--cert-dir and --token-file", "RQ_CACHE_DIR"),
    ],
)
def test_a_default_path_without_a_home_names_what_to_set(
    open_dir: Path, args: tuple[str, ...], named: str, not_named: str
) -> None:
    """The hint names the command's own path options (dr5: every command listed all of them)."""
    done = _as_nobody_without_home(open_dir, *args)
    err = done.stderr.decode()
    assert done.returncode == 2 and "no home directory for rq's default paths" in err, err
    assert named in err and not_named not in err and "unexpected" not in err, err


def test_doctor_without_a_home_diagnoses(open_dir: Path) -> None:
    """dr5: rq doctor exited 2 with the no-home line before checking anything; now that is its
    cache-disk finding and every other check still runs."""
    done = _as_nobody_without_home(open_dir, "doctor", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["check"]: r for r in map(json.loads, done.stdout.splitlines()) if r.get("event") == "finding"}
    assert {"quic", "udp-buffers", "cache-ram-orphans"} <= rows.keys(), rows
    assert rows["cache-disk"]["status"] == "warn" and "no home directory" in rows["cache-disk"]["detail"]
    assert "RQ_CACHE_DIR" in rows["cache-disk"]["fix"]
    assert rows["cache-ram"]["status"] == "skip"


def test_doctor_without_a_home_uses_a_given_cache_dir(open_dir: Path) -> None:
    done = _as_nobody_without_home(open_dir, "doctor", "--json", RQ_CACHE_DIR=str(open_dir / "c"))
    rows = {r["check"]: r for r in map(json.loads, done.stdout.splitlines()) if r.get("event") == "finding"}
    assert done.returncode == 0 and rows["cache-disk"]["status"] == "ok", (done.stderr, rows)
    assert str(open_dir / "c") in rows["cache-disk"]["detail"]
