"""A clock stepped back (NTP, a VM resumed with its clock ahead) left entries checked in the
future: their age came out negative, so they were never stale and a changed S3 object was served
in its old version, even with max_age=0 ("checks every open")."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from s3fake import FakeS3, object_reply

from cache import Cache
from cache.layout import INDEX_NAME


def _read(store: FakeS3, tmp_path: Path) -> bytes:
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", endpoint_url=store.endpoint, max_age=0) as c:
        return _open_read(c)


def _open_read(c: Cache) -> bytes:
    with c.open("s3://b/p/a") as f:
        return f.read()


def test_an_entry_checked_in_the_future_is_revalidated(store: FakeS3, tmp_path: Path) -> None:
    store.objects = {"p/a": object_reply(b"version-1")}
    assert _read(store, tmp_path) == b"version-1"
    # what a one-hour step back of the clock looks like to the index: the last check is ahead of now
    with sqlite3.connect(tmp_path / "c" / INDEX_NAME) as db:
        db.execute("UPDATE entries SET checked_at = ?", (time.time() + 3600,))
    store.objects = {"p/a": object_reply(b"version-2")}
    assert _read(store, tmp_path) == b"version-2"
