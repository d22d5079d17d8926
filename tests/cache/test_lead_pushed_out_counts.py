"""ct/ce2: objects a `--tier ram` preload put straight into the disk tier because the RAM file
system was full (fetched.demoted, warned about on their own line) were subtracted from those found
in the disk tier before the eviction count, so they were counted as evicted: "26 ... did not stay
in the ram tier (15 evicted, 11 moved to disk)" with all 26 in the disk tier. A pure check of the
count over stand-ins for the index (what it counts is exercised by test_fix2_not_resident)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cache.fetcher import FetchResult
from cache.preload import _pushed_out


def _state(ram: int, disk: int, cap: int) -> Any:
    index = SimpleNamespace(
        usage=lambda: {"ram": {"bytes": cap, "held": 0}},
        created_since=lambda since, prefixes: {"ram": ram, "disk": disk},
    )
    return SimpleNamespace(index=index, store=SimpleNamespace(cap=lambda tier: cap))


def test_objects_put_on_disk_for_a_full_ram_file_system_are_neither_evicted_nor_demoted() -> None:
    fetched = FetchResult(objects=26, largest=4 << 20, demoted=15)
    state = _state(ram=0, disk=26, cap=16 << 20)
    assert _pushed_out(state, "ram", ["/data/"], 0.0, fetched) == (0, 11)  # (old: (15, 11))


def test_evicted_and_demoted_without_a_full_file_system() -> None:
    fetched = FetchResult(objects=30, largest=4 << 20)
    state = _state(ram=4, disk=20, cap=16 << 20)
    assert _pushed_out(state, "ram", ["/data/"], 0.0, fetched) == (6, 20)
