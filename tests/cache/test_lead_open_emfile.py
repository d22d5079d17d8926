"""Cache.open of a cached entry under a low `ulimit -n`: os.open of the blob failing with EMFILE
escaped as a bare OSError, though every error the library raises is a CacheError (th's report)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

import cache.api
from cache import Cache, CacheError


def test_a_hit_that_cannot_open_its_file_is_a_cache_error(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 100_000)  # (above SMALL_READ or not, os.open comes first)
    real_open = os.open

    def no_descriptors(path: Any, *args: Any, **kw: Any) -> int:
        if "objects" in str(path):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kw)

    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        c.preload([str(src)])
        monkeypatch.setattr(cache.api.os, "open", no_descriptors)
        # old: OSError [Errno 24] Too many open files, not a CacheError
        with pytest.raises(CacheError, match=r"cannot open the cached copy of .*Too many open files"):
            c.open(str(src / "a.bin"))
