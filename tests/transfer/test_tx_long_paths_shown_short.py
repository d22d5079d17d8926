"""A path in a one-line error is shortened: a directory deep in a SOURCE that cannot be listed
printed its whole path (thousands of bytes) in `cannot list …`. It is now at most ~200 characters,
its middle elided, keeping SOURCE at the start and the entry that failed at the end."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from transfer import source
from transfer.errors import SourceUnreadableError
from transfer.names import SHORT_PATH, short_path


def test_short_path_keeps_both_ends() -> None:
    assert short_path("/a/b") == "/a/b"
    long = "/data/SOURCE/" + "d" * 120 + "/" + "e" * 120 + "/the-failing-dir"
    shown = short_path(long)
    assert len(shown) == SHORT_PATH and "…" in shown
    assert shown.startswith("/data/SOURCE/") and shown.endswith("e/the-failing-dir")
    assert short_path("/x/\x1b[31mred") == "/x/\\x1b[31mred"  # still escaped


def test_an_unlistable_deep_directory_is_named_in_a_short_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    deep = src
    for i in range(20):
        deep = deep / (f"{i:02d}" + "x" * 150)
    deep = deep / "locked"
    os.makedirs(deep)
    listing = source._listing

    def _denied(root: str) -> list[tuple[str, bool]]:
        if root.endswith("/locked"):  # as a chmod 000 directory is for a non-root user
            raise PermissionError(errno.EACCES, "Permission denied", root)
        return listing(root)

    monkeypatch.setattr(source, "_listing", _denied)
    with pytest.raises(SourceUnreadableError) as got:
        source.scan([src], 1 << 20)
    line = str(got.value)
    assert "\n" not in line and len(line) < SHORT_PATH + 80, line
    assert line.startswith(f"cannot list {str(tmp_path)[:40]}"), line
    assert line.endswith("x/locked: Permission denied; nothing was sent"), line
