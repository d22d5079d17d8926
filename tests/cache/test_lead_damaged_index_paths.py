"""Names the cache index holds are data, checked before they become paths (fz). A row whose blob
was `ab/../../../victim/v.bin` or an absolute path (a damaged or hand-edited index) made `rq cache
cat`, `verify --repair`, `evict` and `clear` delete that file, wherever it was, exit 0 and silent;
a relative `ram_root` setting put the RAM tier under the working directory."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from cache import Cache


def _damage(cache_dir: Path, sql: str, *args: str) -> None:
    with sqlite3.connect(cache_dir / "index.sqlite3") as db:
        db.execute(sql, args)


@pytest.mark.parametrize("how", ["cat", "repair", "evict", "clear"])
@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_a_blob_name_from_the_index_never_reaches_outside_the_cache(
    tmp_path: Path, ram_dir: Path, how: str, where: str
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"f" * 9000)
    victim = tmp_path / "victim" / "v.bin"
    victim.parent.mkdir()
    victim.write_bytes(b"keep me")
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        c.preload([str(src) + "/"], tier="disk")
        [entry] = c.entries()
    # through the entry's own objects/ab/ (a directory that exists): up to the cache's parent
    blob = f"{entry.blob[:2]}/../../../victim/v.bin" if where == "relative" else str(victim)
    _damage(tmp_path / "c", "UPDATE entries SET blob = ? WHERE url = ?", blob, str(src / "f"))
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        if how == "cat":
            assert c.read_bytes(str(src / "f")) == b"f" * 9000  # read as missing: fetched again
        elif how == "repair":
            c.verify(repair=True)
        elif how == "evict":
            c.evict(str(src / "f"))
        else:
            c.clear()
    assert victim.read_bytes() == b"keep me"  # deleted before


def test_a_relative_ram_root_in_the_index_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    roots: list[Path] = []  # the default RAM roots this makes under /dev/shm, removed after
    try:
        with Cache(tmp_path / "c") as c:
            roots.append(c.layout.ram_root)
        _damage(tmp_path / "c", "UPDATE settings SET value = 'relroot' WHERE key = 'ram_root'")
        work = tmp_path / "work"
        work.mkdir()
        monkeypatch.chdir(work)
        with Cache(tmp_path / "c") as c:
            roots.append(c.layout.ram_root)
            assert c.layout.ram_root.is_absolute(), c.layout.ram_root
        assert list(work.iterdir()) == []  # relroot/{objects,tmp,owner} here before
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


def test_clear_still_sweeps_stray_files_under_objects(tmp_path: Path, ram_dir: Path) -> None:
    """The sweep of files nobody names unlinked blob_path(tier, name): once blob_path mapped names
    not shaped like a blob to objects/.invalid/, a stray file (`objects/2b/stray.txt`, an NFS
    `.nfs…`, a directory of its own) stayed after `rq cache clear`, counted as removed (dr3)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"f" * 9000)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        c.preload([str(src) + "/"], tier="disk")
    strays = [tmp_path / "c" / "objects" / rel for rel in ("2b/stray.txt", "2b/.nfs0001", "zz/x")]
    for stray in strays:
        stray.parent.mkdir(parents=True, exist_ok=True)
        stray.write_bytes(b"stray")
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        c.clear()
    assert [p for p in strays if p.exists()] == []
