"""A symlink inside a directory SOURCE that points outside it is not followed: before, rq send sent
the target's contents (a link to a private key planted in a checkpoint directory sent the key).
It is skipped with a warning and counted in the summary, as rsync -a would never send the contents
either (it sends the link). Links to files inside SOURCE are still sent as those files. A link
re-pointed after the scan is never read through (the file opened must be the one scanned)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from transfer.errors import SourceChangedError
from transfer.source import Reader, Skipped, scan


def _tree(tmp_path: Path) -> Path:
    secret = tmp_path / "secret.key"
    secret.write_bytes(b"PRIVATE")
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "w.bin").write_bytes(b"w" * 100)
    (src / "sub" / "key").symlink_to(secret)  # absolute, outside
    (src / "rel").symlink_to("../secret.key")  # relative, outside
    (src / "sub" / "up").symlink_to("../../ckpt/w.bin")  # leaves and comes back: inside
    (src / "alias").symlink_to("w.bin")  # inside
    return src


def test_links_outside_source_are_skipped_not_followed(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    skipped: list[Skipped] = []
    manifest, files = scan([src], 1 << 20, skipped)
    names = sorted(f.name for f in manifest.files)
    assert names == ["ckpt/alias", "ckpt/sub/up", "ckpt/w.bin"], names
    assert all(sf.path.resolve() != tmp_path / "secret.key" for sf in files)
    why = {s.path.name: s.reason for s in skipped}
    assert set(why) == {"key", "rel"}, why
    assert why["key"].startswith("symlink to ") and "outside SOURCE" in why["key"], why


def test_a_link_repointed_after_the_scan_is_not_read(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    manifest, files = scan([src], 1 << 20, [])
    alias = next(i for i, f in enumerate(manifest.files) if f.name == "ckpt/alias")
    os.unlink(src / "alias")
    (src / "alias").symlink_to(tmp_path / "secret.key")
    reader = Reader(files, 1 << 20)
    try:
        with pytest.raises(SourceChangedError, match="changed while it was being sent"):
            reader.read(alias, 0, files[alias].size)
    finally:
        reader.close()
