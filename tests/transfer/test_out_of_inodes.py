"""A destination that runs out of inodes (tmpfs nr_inodes, an ext4 made for big files) was said to
be "disk full" with the hint to free space or raise --max-bytes, neither of which helps. The
receiver now says it is out of inodes (statvfs f_favail == 0) and what to do."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tmpfs_kit import own_tmpfs
from xfer_kit import Recv, send

from transfer.errors import NoSpaceError
from transfer.receiver import Receiver


@pytest.fixture
def few_inodes(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with plenty of space and 24 inodes."""
    with own_tmpfs(tmp_path / "few", "size=64m,nr_inodes=24") as mnt:
        yield mnt


def test_a_transfer_into_a_file_system_out_of_inodes_says_so(tmp_path: Path, few_inodes: Path) -> None:
    src = tmp_path / "many"
    src.mkdir()
    for n in range(40):
        (src / f"f{n:02}.txt").write_bytes(b"x" * 100)
    recv = Recv(few_inodes / "dst", tmp_path / "cert", "tcp").start()
    try:
        proc = send([src], recv, "--retry-for", "5")
    finally:
        _, _, recv_err = recv.stop()
    err = proc.stderr.decode()
    assert proc.returncode == 7, err
    assert "out of inodes" in err and "disk is full" not in err, err
    assert "--max-bytes" not in err and "df -i" in err, err  # the hint too: bytes are not the problem
    assert "out of inodes" in recv_err, recv_err
    left = os.statvfs(few_inodes)
    assert left.f_bavail * left.f_frsize > 32 << 20  # the space was there all along


def test_a_disk_error_on_a_file_system_out_of_inodes_names_them(few_inodes: Path) -> None:
    """The errors the receiver meets outside the store's own checks (a commit marker, a placed
    record): Receiver._disk_error."""
    rc = Receiver(few_inodes / "dst", b"t")
    try:
        with pytest.raises(OSError) as full:
            for n in range(64):
                (few_inodes / f"filler{n}").touch()
        assert full.value.errno == errno.ENOSPC
        err = rc._disk_error(OSError(errno.ENOSPC, "No space left on device", "x.bin"), None)
        assert isinstance(err, NoSpaceError) and "out of inodes writing 'x.bin'" in str(err)
        assert "nr_inodes" in str(err)
    finally:
        rc.close()
