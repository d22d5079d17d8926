"""Eviction for room picks no empty entries: a 0-byte file frees no bytes, so making room for a
cap by demoting (RAM) or evicting one is wasted work. A preload of 0- and 1-byte files under a
10-byte RAM cap demoted every older empty entry too (twice the demotions needed, at 60,000
objects 66 s against 17 s)."""

from __future__ import annotations

from pathlib import Path

from cache import Cache


def test_room_for_a_cap_leaves_empty_entries_be(tmp_path: Path, ram_dir: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"f{i:02d}").write_bytes(b"" if i % 2 else b"x")  # 20 empty, 20 of one byte
    with Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit="10") as c:
        result = c.preload([str(src)], tier="ram")
        assert result.objects == 40 and not result.failed
        assert result.demoted_own == 10  # 20 bytes into a 10-byte cap: 10 one-byte entries move
        tiers = {Path(e.url).name: e.tier for e in c.entries()}
        assert all(tiers[f"f{i:02d}"] == "ram" for i in range(1, 40, 2)), tiers  # the empty ones
