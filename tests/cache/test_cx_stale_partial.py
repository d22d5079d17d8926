"""A big file's partial download, kept for a later run to resume, belongs to one version of its
source (its name is the hash of URL and version). Once the source changed (another size, mtime,
inode or ctime) it can never be resumed: the run that lands the new version must remove it. It
stayed in tmp/ with its hold, at the full size it was allocated, until space was needed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import cache.digests
from cache import Cache
from cache.errors import UnreachableError
from cache.origins import LocalOrigin

MIB = 1 << 20


def interrupted_preload(c: Cache, src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A preload of `src` that stops (the source "went away") while its big file is half done:
    the partial and its hold are kept for a later run, as after a lost NFS server or a Ctrl-C."""
    copy = LocalOrigin._copy

    def failing(self: LocalOrigin, info: Any, landing: Any, piece: tuple[int, int] | None) -> None:
        if piece is not None and piece[0] > 0:
            raise UnreachableError("test: the source went away")
        copy(self, info, landing, piece)

    with monkeypatch.context() as m:
        m.setattr(LocalOrigin, "_copy", failing)
        with pytest.raises(UnreachableError):
            c.preload([str(src)])


@pytest.fixture
def big_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with one "big" file: two ranged pieces (32 MiB and 1 MiB), sparse at the source."""
    monkeypatch.setattr(cache.digests, "BIG_OBJECT", MIB)
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "big", "wb") as fh:
        fh.write(b"a" * 100)
        fh.truncate(33 * MIB)
    return src


def tmp_files(cache_dir: Path) -> list[str]:
    return sorted(os.listdir(cache_dir / "tmp"))


def test_a_partial_of_a_changed_source_is_removed_when_the_new_version_lands(
    tmp_path: Path, ram_dir: Path, big_source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        interrupted_preload(c, big_source, monkeypatch)
        assert [n for n in tmp_files(tmp_path / "c") if n.endswith(".part")]  # kept to resume
        with open(big_source / "big", "r+b") as fh:
            fh.write(b"b" * 100)  # the source changes: that partial can never be resumed
        result = c.preload([str(big_source)])
        assert (result.objects, result.failed) == (1, [])
        assert c.path(str(big_source / "big")).read_bytes()[:101] == b"b" * 100 + b"\0"
        # old: the 33 MiB partial of the first version stayed (['<hash>.part'])
        assert tmp_files(tmp_path / "c") == []


def test_a_partial_of_an_unchanged_source_is_still_resumed(
    tmp_path: Path, ram_dir: Path, big_source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        interrupted_preload(c, big_source, monkeypatch)
        partials = [n for n in tmp_files(tmp_path / "c") if n.endswith(".part")]
        assert len(partials) == 1
        result = c.preload([str(big_source)])
        assert (result.objects, result.failed) == (1, [])
        assert tmp_files(tmp_path / "c") == []
