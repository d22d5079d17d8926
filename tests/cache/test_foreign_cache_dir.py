"""Another user's cache directory is refused whatever its mode. Only one that others could write
was refused: a 0755 cache of another user was opened, and its index (which its owner writes) names
the RAM root, where rq overwrote a file called `owner` and whose objects/ and tmp/ its sweeps
emptied. Found by a security review (the victim ran `rq cache ls`, then `verify --repair`)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from rqtest import run_rq

from cache import Cache
from cache.errors import UnsafeDirError

OTHER = 65534  # nobody

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another uid")


def foreign_cache(tmp_path: Path, aimed_at: Path) -> Path:
    """A cache made by another user, whose index names `aimed_at` (the victim's own directory) as
    its RAM root."""
    root = tmp_path / "theirs"
    with Cache(root, ram_dir=tmp_path / "their-ram"):
        pass
    db = sqlite3.connect(root / "index.sqlite3")
    db.execute("UPDATE settings SET value = ? WHERE key = 'ram_root'", (str(aimed_at),))
    db.commit()
    db.close()
    for path in [root, *root.rglob("*")]:
        os.chown(path, OTHER, OTHER, follow_symlinks=False)
    os.chmod(root, 0o755)
    return root


def victims_dir(tmp_path: Path) -> Path:
    mine = tmp_path / "proj"
    (mine / "objects" / "ab").mkdir(parents=True)
    (mine / "tmp").mkdir()
    (mine / "owner").write_text("PRECIOUS")
    (mine / "objects" / "ab" / "data.txt").write_text("KEEP")
    (mine / "tmp" / "work.txt").write_text("KEEP2")
    os.chmod(mine, 0o700)
    return mine


def untouched(mine: Path) -> bool:
    return (
        (mine / "owner").read_text() == "PRECIOUS"
        and (mine / "objects" / "ab" / "data.txt").read_text() == "KEEP"
        and (mine / "tmp" / "work.txt").read_text() == "KEEP2"
    )


def test_opening_another_users_cache_is_refused(tmp_path: Path) -> None:
    mine = victims_dir(tmp_path)
    theirs = foreign_cache(tmp_path, mine)
    with pytest.raises(UnsafeDirError, match=f"belongs to uid {OTHER}, not to you"):
        Cache(theirs)
    assert untouched(mine)


@pytest.mark.parametrize("command", [["cache", "ls"], ["cache", "verify", "--repair"]])
def test_rq_cache_on_another_users_cache_is_exit_2_and_touches_nothing(
    tmp_path: Path, command: list[str]
) -> None:
    mine = victims_dir(tmp_path)
    theirs = foreign_cache(tmp_path, mine)
    proc = run_rq(*command, "--cache-dir", str(theirs))
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert f"belongs to uid {OTHER}" in err and len(err.strip().splitlines()) == 1, err
    assert untouched(mine)
