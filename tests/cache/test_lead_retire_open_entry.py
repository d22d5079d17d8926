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
    return [Path(b) / f for b, _, fs in os.walk(root / "disk" / "objects") for f in fs]


def test_an_entry_gone_from_its_origin_leaves_the_index_while_a_reader_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cache.api.SMALL_READ", 4 * KIB)  # read from the file, its lock kept
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a" * 64 * KIB)
    url = str(src / "a")
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", disk_limit=1024 * KIB) as c:
        c.preload([str(src) + "/"], tier="disk")
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
