"""The RAM root's tmp/ removed while a preload into the RAM tier runs (a tmp cleaner sweeping
/dev/shm): a landing that finds it gone makes it again, private, and lands. Only the start of a
run checked (Cache._ensure_ram_root), so once tmp/ went every later object failed on the missing
directory (49,493 of 60,000 in the reviewer's run, exit 1)."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from cache import Cache
from cache.api import Cache as ApiCache


def test_landings_make_a_removed_tmp_again(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"f{i:02d}").write_bytes(b"x" * 100)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        # removed after the run's own check at its start: the landings are the first to meet it
        monkeypatch.setattr(ApiCache, "_ensure_ram_root", lambda self: False)
        shutil.rmtree(ram_dir / "tmp")
        result = c.preload([str(src)], tier="ram")
        assert result.objects == 20, [f.message for f in result.failed]
        assert {e.tier for e in c.entries()} == {"ram"}
        assert stat.S_IMODE((ram_dir / "tmp").stat().st_mode) == 0o700
