"""Rows an older rq left for half-evicted RAM entries: its evict unlinked the RAM file first and,
the index's file system being full, could not delete the row, which stayed naming a missing file
(tests/cache/test_cl_evict_kept_whole.py: current code keeps both). `rq cache verify` called every
such row corrupt ("missing file", exit 5) though no byte was wrong: the entry was simply gone, as
a RAM entry whose root went with a reboot is (dropped when the cache is opened). verify now drops
such a RAM row as evicted (reported apart, exit 0) and reads fetch the object again; a disk file
that is missing stays a problem (tests/cache/test_cache_review_edges2.py)."""

from __future__ import annotations

import json
from pathlib import Path

from rqtest import popen_rq

from cache import Cache


def _old_style_half_evicted(tmp_path: Path, ram_dir: Path) -> tuple[Path, str]:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}").write_bytes(bytes([i]) * 3000)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        c.preload([str(src)], tier="ram")
        url = str(src / "f1")
        c.path(url).unlink()  # what the old evict left: the RAM file gone, its row still there
    return src, url


def test_verify_drops_a_half_evicted_ram_row_as_evicted(tmp_path: Path, ram_dir: Path) -> None:
    src, url = _old_style_half_evicted(tmp_path, ram_dir)
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        dropped: list[str] = []
        assert c.verify(on_dropped=dropped.append) == (3, [])
        assert dropped == [url]
        assert sorted(e.url for e in c.entries()) == [str(src / "f0"), str(src / "f2")]
        assert c.usage()["ram"]["objects"] == 2
        assert c.read_bytes(url) == bytes([1]) * 3000  # fetched again
        assert c.verify() == (3, [])


def test_rq_cache_verify_exits_0_and_says_dropped(tmp_path: Path, ram_dir: Path) -> None:
    _, url = _old_style_half_evicted(tmp_path, ram_dir)
    proc = popen_rq("cache", "verify", "--json", "--cache-dir", str(tmp_path / "c"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.decode().splitlines()]
    assert {"event": "dropped", "url": url, "reason": "RAM file gone (evicted)"} in events, events
    assert events[-1]["corrupt"] == 0 and events[-1]["dropped"] == 1, events
