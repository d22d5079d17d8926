"""The library's side of two things `rq` does: a RAM limit lowered through `Cache(ram_limit=…)`
takes effect at the Cache's first use, as `rq preload --ram-limit` does (docs/cache.md "Caps that
are never exceeded"), and the error for a cache with no free RAM tier name offers what exists."""

from __future__ import annotations

from pathlib import Path

import pytest

import cache.api
from cache import Cache
from cache.errors import UnsafeDirError

MiB = 1 << 20


def test_lowered_ram_limit_demotes_down_at_first_use(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        (src / f"f{i}").write_bytes(bytes([65 + i]) * MiB)
    cd, ram = tmp_path / "c", tmp_path / "ram"
    c = Cache(cd, ram_dir=ram, ram_limit="10M")
    c.preload([str(src)], tier="ram")
    assert c.usage()["ram"]["bytes"] == 8 * MiB
    c.close()

    c = Cache(cd, ram_dir=ram, ram_limit="3M")
    try:
        usage = c.usage()
        assert usage["ram"]["limit"] == 3 * MiB
        assert 0 < usage["ram"]["bytes"] <= 3 * MiB, usage
        assert usage["ram"]["bytes"] + usage["disk"]["bytes"] == 8 * MiB, usage  # demoted, not lost
        assert c.read_bytes(str(src / "f0")) == b"A" * MiB
    finally:
        c.close()


def test_no_free_ram_name_offers_no_missing_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache.api, "_squatted", lambda _root: True)
    with pytest.raises(UnsafeDirError) as caught:
        Cache(tmp_path / "c")
    message = str(caught.value)
    assert "--ram-dir" not in message
    assert "ram_dir=" in message
