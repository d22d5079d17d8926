"""A file under a tier's objects/ that neither an entry nor a hold covers is over the cap and counted
by nothing. A soak test (Cache.open readers, preloads killed with -9 or SIGTERM, a changing source)
saw the disk tier up to 6.5 MB over its cap for seconds, from one such file. Each way a published
file lost its hold before the index named it, injected at its exact point:

* a demotion (RAM → disk) failing or interrupted after its copy was linked under its final name;
* a landing the index would not take (Fetcher._take_back) while another process had the file open
  (a reader of an older entry of the same name): take_back left it, and the hold was released;
* an interrupt (Ctrl-C, SIGTERM) between publishing a batch and indexing it: the file stayed, its
  hold released (a big object's orphaned for resume, but with nothing left to resume);
* an orphaned landing hold (pid 0) given up for room: its partial went, its published file not.

Afterwards every file under objects/ is covered and the bytes there are within what the index
counts, which is within the cap; and a rerun lands what is missing."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Any

import pytest
from cachekit import local_source, tree_bytes

import cache.digests
import cache.store as store_module
from cache import Cache, CacheError
from cache.index import Index
from cache.layout import blob_name
from cache.store import Store

KIB = 1 << 10
MIB = 1 << 20


def assert_covered(c: Cache) -> None:
    """Every file under each tier's objects/ is named by an entry or a hold; the bytes there are
    at most what the index counts for the tier (entries and holds), which is at most its cap."""
    state = c._state()
    with state.index.read() as db:
        named = {(t, b) for t, b in db.execute("SELECT tier, blob FROM entries")}
        named |= {(h.tier, h.blob) for h in Index.holds(db)}
        used = {t: Index.used(db, t) for t in ("ram", "disk")}
    for tier in ("ram", "disk"):
        root = c.layout.tier_root(tier)
        uncovered = [rel for rel in Store._objects_under(root) if (tier, rel) not in named]
        assert uncovered == [], (tier, uncovered)
        assert tree_bytes(root / "objects") <= used[tier] <= c.caps[tier], tier


def test_a_demotion_failing_after_its_link_leaves_no_uncounted_copy(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = local_source(tmp_path / "src", 2, 40 * KIB)
    with Cache(tmp_path / "c", ram_dir=ram_dir, ram_limit=60 * KIB, disk_limit=MIB) as c:
        c.preload([str(src / "f0")], tier="ram")
        real = store_module.fsync_dir

        def failing(path: Path) -> None:  # the demotion's fsync of objects/xx/, after the link
            if Path(path).is_relative_to(c.layout.tier_root("disk") / "objects"):
                raise OSError(errno.EIO, "test: I/O error")
            real(path)

        monkeypatch.setattr(store_module, "fsync_dir", failing)
        c.preload([str(src / "f1")], tier="ram")  # f0 is evicted; its demotion fails (suppressed)
        monkeypatch.undo()
        # old: f0's copy stayed in the disk tier's objects/, named by nothing (its hold dropped)
        assert_covered(c)
        assert {e.url: e.tier for e in c.entries()} == {str(src / "f1"): "ram"}


def _reader_has_it_open(c: Cache, fds: list[int]) -> Any:
    """Store.land, once: before the index write, another open file description takes a shared
    lock on each published file (a reader of an older entry of the same name), then the index
    write fails (a full disk, say)."""
    real = Store.land

    def land(self: Store, items: list[Any]) -> None:
        if fds:
            return real(self, items)
        for _, entry in items:
            fd = os.open(c.layout.blob_path(entry.tier, entry.blob), os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_SH)
            fds.append(fd)
        raise CacheError("test: the index cannot be written")

    return land


def test_a_landing_taken_back_while_a_reader_has_it_stays_counted(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = local_source(tmp_path / "src", 2, 40 * KIB)
    with Cache(tmp_path / "c", ram_dir=ram_dir, disk_limit=MIB) as c:
        fds: list[int] = []
        monkeypatch.setattr(Store, "land", _reader_has_it_open(c, fds))
        with pytest.raises(CacheError):
            c.preload([str(src)])
        monkeypatch.undo()
        assert fds
        # old: the files stayed (open) and their holds were released: counted by nothing
        assert_covered(c)
        assert c.entries() == []
        for fd in fds:
            os.close(fd)
        c.usage()  # (its collect() takes the garbage no reader holds any more)
        assert Store._objects_under(c.layout.tier_root("disk")) == []
        assert c._state().index.usage()["disk"]["held"] == 0
        result = c.preload([str(src)])
        assert (result.objects, result.failed) == (2, [])
        assert_covered(c)


@pytest.mark.parametrize("big", [False, True], ids=["small", "big"])
def test_an_interrupt_between_publishing_and_indexing_leaves_no_uncounted_file(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch, big: bool
) -> None:
    if big:
        monkeypatch.setattr(cache.digests, "BIG_OBJECT", 64 * KIB)  # (kept for resume when stopped)
    src = local_source(tmp_path / "src", 3, 100 * KIB)
    with Cache(tmp_path / "c", ram_dir=ram_dir, disk_limit=MIB) as c:
        published: list[Path] = []
        real = Store.land

        def land(self: Store, items: list[Any]) -> None:
            published.extend(c.layout.blob_path(e.tier, e.blob) for _, e in items)
            raise KeyboardInterrupt  # (SIGTERM, in rq: an exception of its own) before the commit

        monkeypatch.setattr(Store, "land", land)
        with pytest.raises(KeyboardInterrupt):
            c.preload([str(src)])
        monkeypatch.setattr(Store, "land", real)
        assert published and all(p.parent.is_dir() for p in published)
        # old: the published files stayed, their holds released (small) or orphaned (big; and the
        # next eviction dropped that hold and kept the file): over the cap, counted by nothing
        assert_covered(c)
        assert c.entries() == []
        # nothing is left to resume (old, big: orphaned holds, which the next eviction dropped
        # with the files kept)
        assert c._state().index.usage()["disk"]["held"] == 0
        result = c.preload([str(src)])  # the rerun lands them all
        assert (result.objects, result.failed) == (3, [])
        assert_covered(c)


def test_an_orphaned_landing_given_up_for_room_takes_its_published_file(
    tmp_path: Path, ram_dir: Path
) -> None:
    src = local_source(tmp_path / "src", 2, 300 * KIB)
    with Cache(tmp_path / "c", ram_dir=ram_dir, disk_limit=MIB) as c:
        # what a run killed between its rename and its index commit leaves once collect() found
        # its journal (a resumable partial): an orphaned hold (pid 0), its file already published
        blob = blob_name("s3://b/gone", "v1")
        path = c.layout.blob_path("disk", blob)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 600 * KIB)
        with c._state().index.write() as db:
            Index.add_hold(db, "disk", 600 * KIB, "landing", blob, "s3://b/gone", (0, 0))
        assert_covered(c)
        result = c.preload([str(src)])  # needs that hold's room: it is given up
        assert (result.objects, result.failed) == (2, [])
        # old: the hold went, the 600 KiB file stayed: 1.2 MiB under objects/ for a 1 MiB cap
        assert not path.exists()
        assert_covered(c)
