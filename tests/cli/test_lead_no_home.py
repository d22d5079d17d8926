"""ct: with HOME unset and a uid that has no passwd entry (how OpenShift runs a container), every
command failed "unexpected RuntimeError: could not determine the home directory for '~/.config'",
exit 1, even with RQ_CACHE_DIR given: the optional config file's default path was looked up first.
Now there is no default config file there, and a default path that is really needed is exit 2
naming what to set."""

from __future__ import annotations

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


@pytest.mark.parametrize("args", [("cache", "du"), ("tail", "t")])
def test_a_default_path_without_a_home_names_what_to_set(open_dir: Path, args: tuple[str, ...]) -> None:
    done = _as_nobody_without_home(open_dir, *args)
    err = done.stderr.decode()
    assert done.returncode == 2 and "no home directory for rq's default paths" in err, err
    assert "RQ_CACHE_DIR" in err and "unexpected" not in err
