"""Per-object work of small objects that the preload's speed target (issue 3) pays for 2,000 times.

* A whole object the origin writes itself (the CRT's recv_filepath) lands through an unnamed
  O_TMPFILE file: nothing is ever named in tmp/, so there is no temp name to unlink after the link
  (an open, a close and an unlink fewer per object, and no wait on tmp/'s lock).
* With batch syncs, a whole object is finished (read back, hashed, verified) on the thread that
  reported it done, not handed to a finisher thread (a queue message, a wake-up and a GIL hand-off
  fewer per object).
The guarantees stay: publish never clobbers a twin, only a damaged one is replaced, an aborted
landing leaves nothing."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import xxhash
from cachekit import local_source

from cache import Cache
from cache.landing import Landing, ObjectInfo
from cache.layout import Layout, blob_name

BODY = os.urandom(100_000)


def landing(tmp_path: Path, tier: str = "disk") -> Landing:
    layout = Layout(tmp_path / "c", tmp_path / "ram")
    layout.create()
    url = "s3://b/k/obj.bin"
    info = ObjectInfo(url, "obj.bin", len(BODY), "etag:x;size:1")
    return Landing(layout, tier, info, blob_name(url, info.version), 0, defer_publish=True)


def written_by_origin(land: Landing, body: bytes = BODY) -> None:
    """What the CRT does with recv_filepath: opens the path it was given, truncating, and writes."""
    path = land.external_file()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.write(fd, body)
    finally:
        os.close(fd)


def tmp_names(land: Landing) -> list[str]:
    return os.listdir(land.layout.tier_root(land.tier) / "tmp")


def test_a_whole_object_written_by_the_origin_never_has_a_temp_name(tmp_path: Path) -> None:
    land = landing(tmp_path)
    written_by_origin(land)
    assert tmp_names(land) == []  # (a named .part until now)
    entry = land.finish()
    assert entry.xxh3 == xxhash.xxh3_128(BODY).hexdigest()
    land.publish(entry.xxh3)
    assert land.final.read_bytes() == BODY and os.stat(land.final).st_nlink == 1
    assert tmp_names(land) == []
    land.release_kept()


def test_a_ram_landing_keeps_its_named_temp_file(tmp_path: Path) -> None:
    """Store.room counts what RAM landings in flight (other processes' too) have written by their
    temp files' names: an unnamed one would be counted as not written yet, twice."""
    land = landing(tmp_path, "ram")
    written_by_origin(land)
    assert [name[:32] for name in tmp_names(land)] == [land.tmp.name[:32]]
    entry = land.finish()
    land.publish(entry.xxh3)
    assert land.final.read_bytes() == BODY and tmp_names(land) == []
    land.release_kept()


def test_an_aborted_landing_leaves_nothing(tmp_path: Path) -> None:
    land = landing(tmp_path)
    written_by_origin(land)
    land.abort()
    assert tmp_names(land) == [] and not land.final.exists()


@pytest.mark.parametrize("damaged", [False, True])
def test_a_twin_is_never_clobbered_and_only_a_damaged_one_replaced(tmp_path: Path, damaged: bool) -> None:
    land = landing(tmp_path)
    land.final.parent.mkdir(parents=True, exist_ok=True)
    twin = b"x" * len(BODY) if damaged else BODY
    land.final.write_bytes(twin)
    before = os.stat(land.final).st_ino
    written_by_origin(land)
    entry = land.finish()
    land.publish(entry.xxh3)
    assert land.final.read_bytes() == BODY
    assert (os.stat(land.final).st_ino == before) is not damaged  # identical twin kept in place
    assert land.placed is damaged
    assert tmp_names(land) == []
    land.release_kept()


def test_whole_objects_finish_on_the_thread_that_reports_them_done(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: set[str] = set()
    finish = Landing.finish

    def spy(self: Landing) -> Any:
        threads.add(threading.current_thread().name)
        return finish(self)

    monkeypatch.setattr(Landing, "finish", spy)
    src = local_source(tmp_path / "src", 20, 1000)
    with Cache(tmp_path / "cache", ram_dir=ram_dir) as c:
        result = c.preload([str(src)], tier="disk")
    assert result.objects == 20
    assert threads and not any(name.startswith("rq-finish") for name in threads), threads


def test_objects_dirs_a_landing_makes_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """objects/xx/ is made by the first landing that needs it (no mkdir per object): 0700, as
    every other directory of the cache, and not 0777 under umask 000."""
    old = os.umask(0)
    try:
        land = landing(tmp_path)
        written_by_origin(land)
        land.publish(land.finish().xxh3)
        land.release_kept()
    finally:
        os.umask(old)
    assert oct(os.stat(land.final.parent).st_mode & 0o777) == oct(0o700)
