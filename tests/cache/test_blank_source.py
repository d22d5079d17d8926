"""An empty SOURCE (`rq preload "$UNSET"`) is refused, exit 2, before anything is read or made: it
used to be the current directory, whose files were preloaded into a cache (exit 0). A SOURCE of
only spaces is refused the same way unless a file of that name exists. The library refuses too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cachekit import local_source
from rqtest import run_rq

from cache import BadSourceError, Cache
from cache.layout import default_ram_root


@pytest.mark.parametrize("source", ["", "  "])
@pytest.mark.parametrize("cache_exists", [False, True], ids=["new-cache", "existing-cache"])
def test_a_blank_source_is_refused_and_caches_nothing(
    source: str, cache_exists: bool, tmp_path: Path, ram_dir: Path
) -> None:
    cwd = local_source(tmp_path / "cwd", 3, 100)  # what an empty SOURCE used to preload
    cache_dir = tmp_path / "cache"
    ram_root = ram_dir if cache_exists else default_ram_root(cache_dir.absolute())
    if cache_exists:
        Cache(cache_dir, ram_dir=ram_dir).close()
    proc = run_rq("preload", source, "--cache-dir", str(cache_dir), "--json", cwd=cwd)
    assert proc.returncode == 2, proc.stderr.decode()
    err = proc.stderr.decode().strip().splitlines()
    assert len(err) == 1 and "(an unset variable?)" in err[0], err
    summary = json.loads(proc.stdout.decode().splitlines()[-1])
    assert summary["aborted"] is True and summary["objects"] == 0
    if cache_exists:
        with Cache(cache_dir) as c:
            assert c.entries() == []
    else:
        assert not cache_dir.exists()
        assert not ram_root.exists()


@pytest.mark.parametrize("source", ["", " ", "\t"])
def test_the_library_refuses_a_blank_source(
    source: str, tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(local_source(tmp_path / "cwd", 3, 100))
    with Cache(tmp_path / "cache", ram_dir=ram_dir) as c:
        with pytest.raises(BadSourceError, match="unset variable"):
            c.preload([source])
        with pytest.raises(BadSourceError, match="unset variable"):
            c.preload([str(tmp_path / "cwd"), source])  # a good source first changes nothing
        assert c.entries() == []


def test_a_file_named_by_spaces_that_exists_is_a_source(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / " ").write_bytes(b"spaces")
    with Cache(tmp_path / "cache", ram_dir=ram_dir) as c:
        assert c.preload([" "]).objects == 1
        with c.open(" ") as f:
            assert f.read() == b"spaces"
