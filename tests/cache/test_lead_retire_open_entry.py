"""An entry known bad or stale (gone from its origin, corrupt, superseded) that another reader
had open stayed in the index: Store.remove cannot take the file's lock while a reader holds it,
so every later read was served the stale entry again (or found it corrupt again), and `rq cache
ls` listed it. Store.retire drops it from the index at once; the open reader keeps reading what
it opened, and its file is a garbage hold, counted until collect() finds it closed and removes it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cache import Cache
from cache.errors import NotFoundError

KIB = 1024


def _objects(root: Path) -> list[Path]:
    return [Path(b) / f for b, _, fs in os.walk(root / "objects") for f in fs]


def _origin_with_one_file(tmp_path: Path) -> tuple[Path, str]:
    """A directory origin holding one 64 KiB file `a`, and that file's URL."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a" * 64 * KIB)
    return src, str(src / "a")


def test_an_entry_gone_from_its_origin_leaves_the_index_while_a_reader_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cache.api.SMALL_READ", 4 * KIB)  # read from the file, its lock kept
    src, url = _origin_with_one_file(tmp_path)
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", disk_limit=1024 * KIB) as c:
        c.preload([str(src) + "/"], tier="disk")
        assert len(_objects(tmp_path / "c")) == 1
        with c.open(url) as reader:
            (src / "a").unlink()
            with pytest.raises(NotFoundError):
                c.open(url).close()  # the origin says it is gone
            assert [e.url for e in c.entries()] == []  # was: still listed, served to the next read
            assert reader.read() == b"a" * 64 * KIB  # the reader keeps what it opened
            assert c.usage()["disk"]["held"] == 64 * KIB  # its bytes still counted (a garbage hold)
        c.collect()
        assert _objects(tmp_path / "c") == []
        assert c.usage()["disk"]["held"] == c.usage()["disk"]["bytes"] == 0


def test_a_corrupt_entry_fetched_again_keeps_the_old_file_counted_while_it_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy fetched again after a verification failure has the very same name (same URL and
    version): a garbage hold on that name found the new file there, named by its entry, and let the
    old one go uncounted while its reader still had it (dr: 64 KiB over a 128 KiB cap). Retired
    files are renamed aside under their hold."""
    monkeypatch.setattr("cache.api.SMALL_READ", 4 * KIB)
    src, url = _origin_with_one_file(tmp_path)
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", disk_limit=128 * KIB) as c:
        c.preload([str(src) + "/"], tier="disk")
        [blob] = _objects(tmp_path / "c")
        with c.open(url) as reader:
            with open(blob, "r+b") as fh:  # the cached copy goes bad under reader A
                fh.seek(100)
                fh.write(b"X")
            with c.open(url) as again:  # VerifyError: retired, fetched again under the same name
                assert again.read() == b"a" * 64 * KIB
            use = c.usage()["disk"]
            assert use["bytes"] == use["held"] == 64 * KIB  # was: held 0, the old inode counted by nothing
            (src / "b").write_bytes(b"b" * 64 * KIB)
            c.preload([str(src / "b")], tier="disk")
            on_disk = sum(p.stat().st_size for p in _objects(tmp_path / "c"))
            assert on_disk <= 128 * KIB and len(reader.read()) == 64 * KIB
        c.collect()
        use = c.usage()["disk"]
        assert use["held"] == 0 and sum(p.stat().st_size for p in _objects(tmp_path / "c")) == use["bytes"]
