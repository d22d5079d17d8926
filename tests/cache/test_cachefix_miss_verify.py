"""A read-through miss whose just-landed file was found damaged as Cache.open hashed it raised
VerifyError out of open(), where a hit drops the damaged copy and fetches it again. A miss now does
the same, once; damaged again, the VerifyError stands."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cache import Cache, VerifyError
from cache.index import Entry


def _damage_landings(monkeypatch: pytest.MonkeyPatch, times: int) -> list[Entry]:
    """Flips a byte of each of the next `times` landings of Cache._fetch_one, between landing
    (verified) and open (hashed again)."""
    damaged: list[Entry] = []
    real = Cache._fetch_one

    def fetch_then_damage(self: Cache, *args: Any, **kwargs: Any) -> tuple[Entry, int]:
        entry, fd = real(self, *args, **kwargs)
        if len(damaged) < times:
            blob = self.layout.blob_path(entry.tier, entry.blob)
            w = os.open(blob, os.O_RDWR)
            os.pwrite(w, bytes([os.pread(w, 1, 7)[0] ^ 1]), 7)
            os.close(w)
            damaged.append(entry)
        return entry, fd

    monkeypatch.setattr(Cache, "_fetch_one", fetch_then_damage)
    return damaged


@pytest.mark.parametrize("size", [100_000, 17 << 20])  # served from memory / as an open file
def test_a_miss_landed_damaged_is_fetched_again(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    good = os.urandom(size)
    src = tmp_path / "x.bin"
    src.write_bytes(good)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        damaged = _damage_landings(monkeypatch, 1)
        assert c.read_bytes(str(src)) == good  # (old code: VerifyError)
        assert len(damaged) == 1
        assert c.stat(str(src)).created != damaged[0].created
        assert c.verify() == (1, [])


def test_a_miss_damaged_twice_raises(tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "x.bin"
    src.write_bytes(os.urandom(100_000))
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        damaged = _damage_landings(monkeypatch, 10)
        with pytest.raises(VerifyError, match="do not match their recorded digest"):
            c.read_bytes(str(src))
        assert len(damaged) == 2  # one fetch more, not a loop
