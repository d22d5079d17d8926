"""`rq cache stat|path DIR-or-PREFIX` typed without its slash said only "not cached" (exit 3),
where `rq cache cat` adds that entries are cached under it; the two now say so too."""

from __future__ import annotations

from pathlib import Path

import pytest
from rqtest import run_rq


@pytest.mark.parametrize("command", ["stat", "path"])
def test_a_prefix_without_its_slash_is_told_where_entries_are(tmp_path: Path, command: str) -> None:
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "train" / "a").write_bytes(b"a")
    cache = str(tmp_path / "c")
    assert run_rq("preload", f"{src}/", "--cache-dir", cache, "-q").returncode == 0
    r = run_rq("cache", command, str(src / "train"), "--cache-dir", cache)
    assert r.returncode == 3, r.stderr
    assert f"entries are cached under {src}/train/".encode() in r.stderr, r.stderr
    r = run_rq("cache", command, str(src / "nope"), "--cache-dir", cache)
    assert r.returncode == 3 and b"entries are cached" not in r.stderr, r.stderr
