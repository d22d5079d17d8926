"""Cache.open found its cached copy damaged (VerifyError) while another process landed the same URL
again: dropping "the entry" then dropped that fresh, good landing (file names are fixed per URL and
version, so the new landing names the same blob). Only the damaged landing may go."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cache import Cache, VerifyError
from cache.index import Entry


def test_a_damaged_copy_dropped_by_open_is_never_a_landing_made_since(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = b"good bytes " * 1000
    url = str(tmp_path / "a.bin")  # a directory origin: re-stated on every open, no store needed
    Path(url).write_bytes(good)
    root = tmp_path / "c"
    reader = Cache(root, ram_dir=ram_dir)
    other = Cache(root, ram_dir=ram_dir)  # another process's view of the same cache
    reader.read_bytes(url)
    damaged = reader.stat(url)
    blob = reader.path(url)
    os.chmod(blob, 0o600)
    with open(blob, "r+b") as fh:
        fh.write(b"BAD")
    relanded: list[Entry] = []
    real_open_entry = Cache._open_entry

    def open_entry(self: Cache, entry: Entry, *args: Any) -> Any:
        try:
            return real_open_entry(self, entry, *args)
        except VerifyError:
            if self is reader and not relanded:
                # the other process, meanwhile: drops the damaged copy and lands the URL again
                # (under the same file name), before this reader gets to drop what it found
                assert other.evict(url) == (1, 0)
                assert other.read_bytes(url) == good
                relanded.append(other.stat(url))
            raise

    monkeypatch.setattr(Cache, "_open_entry", open_entry)
    assert reader.read_bytes(url) == good
    assert relanded and relanded[0].created != damaged.created
    now = reader.stat(url)
    # the other process's landing stands; the reader did not drop it and fetch its own
    assert (now.blob, now.created) == (relanded[0].blob, relanded[0].created)
    other.close()
    reader.close()
