"""A cached copy whose bytes changed on disk was dropped and read again from the origin without a
word: `rq -v cache cat` exited 0 with nothing on stderr, and `Cache(on_event=…)` saw nothing, so a
failing disk under the cache went unnoticed (only a new `created` stamp showed it). The read is
still served from good bytes; the library reports `cache.events.Damaged(url, path, reason)` and
the CLI warns (and, for the commands that print JSON, emits a `damaged` line)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cache import Cache
from cache.events import Damaged, Event

RQ = [sys.executable, "-m", "rqcli"]


def _flip(path: Path, at: int = 1000) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _cached(tmp_path: Path, ram_dir: Path) -> tuple[Path, Path, bytes, Path]:
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(200_000)
    (src / "a.bin").write_bytes(data)
    root = tmp_path / "cache"
    with Cache(root, ram_dir=ram_dir) as c:
        c.preload([str(src) + "/"], tier="disk")
        blob = c.path(str(src / "a.bin"))
    return root, src / "a.bin", data, blob


def test_open_reports_a_damaged_copy_it_read_again(tmp_path: Path, ram_dir: Path) -> None:
    root, url, data, blob = _cached(tmp_path, ram_dir)
    _flip(blob)
    seen: list[Event] = []
    with Cache(root, ram_dir=ram_dir, on_event=seen.append) as c:
        with c.open(str(url)) as fh:
            assert fh.read() == data
        again = [e for e in seen if isinstance(e, Damaged)]
        assert len(again) == 1, seen
        assert again[0].url == str(url) and again[0].path == str(blob)
        assert "digest" in again[0].reason
        seen.clear()
        with c.open(str(url)) as fh:  # the copy fetched again is sound: nothing more to say
            assert fh.read() == data
        assert not [e for e in seen if isinstance(e, Damaged)]


def test_cache_cat_warns_of_the_damaged_copy(tmp_path: Path, ram_dir: Path) -> None:
    root, url, data, blob = _cached(tmp_path, ram_dir)
    _flip(blob)
    out = subprocess.run(
        [*RQ, "cache", "cat", str(url), "--cache-dir", str(root)],
        capture_output=True,
        timeout=60,
        check=False,
        env={**os.environ, "RQ_RAM_DIR": str(ram_dir)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == data
    err = out.stderr.decode()
    assert "dropped a damaged cached copy" in err and str(url) in err and "rq cache verify" in err, err
