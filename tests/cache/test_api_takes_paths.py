"""Cache.open, read_bytes, stat, path and prefetch take a pathlib.Path (any os.PathLike) for a local
file, as Cache(cache_dir) does; they refused one ("a URL or path must be text (str), not PosixPath")
though the docs say "a URL or a local path" (API review). Its entry is the one the path's text
names."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache import BadSourceError, Cache


def test_a_path_object_names_the_same_entry_as_its_text(tmp_path: Path) -> None:
    sample = tmp_path / "data" / "s.bin"
    sample.parent.mkdir()
    sample.write_bytes(b"a sample")
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram") as c:
        with c.open(sample) as f:
            assert f.read() == b"a sample"
        assert c.read_bytes(sample) == b"a sample"
        assert c.stat(sample) == c.stat(str(sample))
        assert c.path(sample).read_bytes() == b"a sample"
        assert c.prefetch([sample]).wait_warm(30)
        assert [e.url for e in c.entries()] == [str(sample)]


def test_a_bytes_path_is_still_refused(tmp_path: Path) -> None:
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram") as c, pytest.raises(BadSourceError, match="text"):
        c.open(bytes(tmp_path / "x"))
