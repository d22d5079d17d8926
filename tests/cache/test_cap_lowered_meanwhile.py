"""Another rq lowers the cap while a preload runs (two `rq preload` on one cache with different
--disk-limit): the lower cap binds the running preload too, which then admits smaller batches.
Its batches were sized from the cap it read at the start, and a batch bigger than the new cap
stopped the whole run: "disk tier cap is 1.0 MiB; 1.5 MiB cannot fit even in an empty tier"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cachekit import local_source

from cache import Cache
from cache.store import Store


def lower_the_cap_after_planning(monkeypatch: pytest.MonkeyPatch, cache_dir: Path, limit: str) -> None:
    """The other rq starts just after this preload planned its page (which reads the cap): its
    limit replaces ours before the first batch is admitted."""
    cap = Store.cap
    lowered = False

    def cap_then_lower(self: Store, tier: str) -> int:
        nonlocal lowered
        value = cap(self, tier)
        if not lowered:
            lowered = True
            Cache(cache_dir, disk_limit=limit).close()
        return value

    monkeypatch.setattr(Store, "cap", cap_then_lower)


def test_a_cap_lowered_by_another_rq_shrinks_the_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = local_source(tmp_path / "src", 60, 100 << 10)  # 60 x 100 KiB: 6 MiB
    cache_dir = tmp_path / "c"
    lower_the_cap_after_planning(monkeypatch, cache_dir, "1M")
    with Cache(cache_dir, ram_dir=tmp_path / "ram", disk_limit="3M") as c:
        result = c.preload([str(source)])  # (raised CacheFullError on the old fetcher)
        assert result.failed == []
        assert result.objects == 60  # a set bigger than the cap: LRU evicts the run's own
        usage: Any = c.usage()
        assert usage["disk"]["bytes"] <= 1 << 20


def test_an_object_bigger_than_the_lowered_cap_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = local_source(tmp_path / "src", 4, 100 << 10)
    (source / "big").write_bytes(b"x" * (1536 << 10))  # 1.5 MiB: fits 3M, not 1M
    cache_dir = tmp_path / "c"
    lower_the_cap_after_planning(monkeypatch, cache_dir, "1M")
    with Cache(cache_dir, ram_dir=tmp_path / "ram", disk_limit="3M") as c:
        result = c.preload([str(source)])
        assert [(Path(f.url).name, f.kind) for f in result.failed] == [("big", "no_space")]
        assert result.objects == 4
