"""A KeyboardInterrupt landing right after a landing's os.close() returned, before its "= -1",
left the number in place: the abort that followed (fetcher._abandon -> landing.abort) closed it a
second time (the leak reviewer saw EBADF from release_kept). Worse than EBADF: by then another
thread may have been given the same number for a file of its own, and that one was closed. Each
descriptor now goes to -1 before it is closed, so a second abort closes nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import cache.landing as landing_module
from cache.landing import Landing, ObjectInfo
from cache.layout import Layout, blob_name


class _InterruptAfterClose:
    """landing's `os`, whose close() raises KeyboardInterrupt once, right after closing."""

    def __init__(self) -> None:
        self.armed = True

    def close(self, fd: int) -> None:
        os.close(fd)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


@pytest.mark.parametrize("attr", ["kept_fd", "fd", "_dfd"])
def test_an_abort_after_an_interrupted_close_closes_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attr: str
) -> None:
    layout = Layout(tmp_path / "c", tmp_path / "ram")
    layout.create()
    info = ObjectInfo("s3://b/k/o.bin", "o.bin", 10, "etag:x;size:1")
    land = Landing(layout, "disk", info, blob_name(info.url, info.version), 0)
    (tmp_path / "ours").write_bytes(b"ours")
    setattr(land, attr, os.open(tmp_path / "ours", os.O_RDONLY))
    monkeypatch.setattr(landing_module, "os", _InterruptAfterClose())
    with pytest.raises(KeyboardInterrupt):
        land.abort()
    (tmp_path / "theirs").write_bytes(b"theirs")
    theirs = os.open(tmp_path / "theirs", os.O_RDONLY)  # (most often the number just freed)
    try:
        land.abort()  # what the fetcher's clean-up does next
        assert os.pread(theirs, 6, 0) == b"theirs"  # still open: not closed by the landing
    finally:
        os.close(theirs)
