"""A DataLoader worker's read of an item that the Prefetcher then promoted to RAM was lost: the
worker's LRU stamps reach the index in batches (about a second late), the promotion is a new
landing (a new `created`, stamped as read-nothing-since), and Index.touch moved a stamp only
forward, so the worker's older stamp was dropped. Prefetcher follows workers by those stamps: once
every item of its window had been read that way, the window never moved again for the rest of the
pass (test_a_prefetch_follows_reads_made_in_dataloader_style_workers failed under load)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rqtest import random_files

from cache import Cache


def _batch_until_close(worker: Cache) -> None:
    """The worker's stamps wait in its batch until close(), as a busy worker's wait for the next
    second's flush: no flush at the next read, no timer (what the old code lost depends on the
    stamps arriving after the promotion, which a real worker's second-late batch does at random)."""
    worker._last_flush = time.monotonic() + 3600
    worker._flush_pending_pid = os.getpid()


def test_a_prefetch_counts_reads_whose_stamps_arrive_after_it_promoted_the_item(
    tmp_path: Path, ram_dir: Path
) -> None:
    src = random_files(tmp_path / "src", 12, 1000)
    order = [str(src / str(i)) for i in range(12)]
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    pre = c.prefetch(order, ahead=4, tier="ram")
    assert pre.wait_warm(30)  # [0, 4) in RAM
    worker = Cache(tmp_path / "c")
    _batch_until_close(worker)
    for url in order:  # reads everything: 4-11 as misses, landed on disk by the worker
        worker.read_bytes(url)
    assert [c.stat(u).tier for u in order[4:]] == ["disk"] * 8
    pre.advance(order[3])  # the window [3, 7): 4-6 promoted from disk to RAM, new landings
    assert pre.wait_warm(30)
    promoted = [c.stat(u) for u in order[4:7]]
    assert [e.tier for e in promoted] == ["ram"] * 3
    worker.close()  # only now the worker's stamps, all older than those promotions, arrive
    deadline = time.monotonic() + 30  # (it looks every 0.5 s; a loaded runner may be slow to)
    while pre.position < 11 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pre.position == 11, pre.position  # (old: 3, for ever)
    # for LRU the promoted entries stay as fresh as their landing (not sent to the front of the
    # eviction order by the worker's older stamp), and are no longer read-nothing-since
    for before in promoted:
        after = c.stat(before.url)
        assert (after.tier, after.created) == ("ram", before.created)
        assert before.created < after.last_access < before.created + 0.001
    assert pre.errors == []
    c.close()


def test_an_older_stamp_marks_an_unread_landing_read_but_moves_nothing_else(
    tmp_path: Path, ram_dir: Path
) -> None:
    src = random_files(tmp_path / "src", 3, 100)
    urls = [str(src / str(i)) for i in range(3)]
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        c.preload([str(src)])
        index = c._state().index
        landed = {u: c.stat(u) for u in urls}
        assert all(e.last_access == e.created for e in landed.values())
        index.touch({urls[0]: landed[urls[0]].created - 5})  # read before it landed, stamped late
        marked = c.stat(urls[0]).last_access
        assert landed[urls[0]].created < marked < landed[urls[0]].created + 0.001
        index.touch({urls[0]: landed[urls[0]].created - 1})  # marked once: a later batch moves it no more
        assert c.stat(urls[0]).last_access == marked
        read = landed[urls[1]].created + 0.5  # (not ahead of the clock: that one would move back)
        index.touch({urls[1]: read})  # read since it landed: an older batch is kept out, as before
        index.touch({urls[1]: landed[urls[1]].created - 5})
        assert c.stat(urls[1]).last_access == read
        assert c.stat(urls[2]).last_access == landed[urls[2]].created  # untouched
