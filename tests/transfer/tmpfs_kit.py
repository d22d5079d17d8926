"""A tmpfs of the test's own, with the limits it needs (size, nr_inodes): root only."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def own_tmpfs(where: Path, options: str) -> Iterator[Path]:
    """Mounts a tmpfs with mount options `options` (e.g. "size=40m") at `where` (made here),
    unmounted after; skips the test where that is not possible (not root, no mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    where.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
