"""A destination out of inodes (not bytes) said "…; the chunks verified so far are kept" also when no
chunk had arrived, and rq send's hint promised a resume of nothing. The line now says what the
transfer keeps (counted from the store: none, or N chunks and their bytes), the hint drops "to
resume" when nothing is kept, and a commit that runs out of inodes while placing is said as inodes:
its cleanup freed some before statvfs was asked, and the line said "disk is full"."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tmpfs_kit import own_tmpfs
from xfer_kit import Recv, receive_chunks, send, wait_for

from transfer.errors import NoSpaceError
from transfer.manifest import MIN_CHUNK, FileEntry, Manifest, file_key, make_manifest
from transfer.store import Store


@pytest.fixture
def few_inodes(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with plenty of space and 24 inodes."""
    with own_tmpfs(tmp_path / "few", "size=64m,nr_inodes=24") as mnt:
        yield mnt


def _fill_inodes(where: Path, leave: int = 0) -> None:
    """Takes every free inode of `where`'s file system, then gives `leave` of them back."""
    made = []
    with pytest.raises(OSError):
        for n in range(10_000):
            (where / f"filler{n}").touch()
            made.append(where / f"filler{n}")
    for path in made[:leave]:
        path.unlink()


def _manifest(names: list[str], size: int) -> tuple[Manifest, list[bytes]]:
    datas = [os.urandom(size) for _ in names]
    entries = [
        FileEntry(name=n, size=size, mode=0o644, key=file_key(n, size, 5, i, MIN_CHUNK))
        for i, n in enumerate(names)
    ]
    m = make_manifest(MIN_CHUNK, entries)
    order = [names.index(e.name) for e in m.files]
    return m, [datas[i] for i in order]


def test_out_of_inodes_before_any_chunk_says_none_is_kept(tmp_path: Path, few_inodes: Path) -> None:
    src = tmp_path / "many"
    src.mkdir()
    for n in range(40):
        (src / f"f{n:02}.txt").write_bytes(b"x" * 100)
    dest = few_inodes / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    try:
        proc = send([src], recv, "--retry-for", "5")
        err = proc.stderr.decode()
        assert proc.returncode == 7, err
        assert "out of inodes" in err and "df -i" in err, err
        assert "no chunk of this transfer had been verified, so none is kept" in err, err
        assert "verified so far are kept" not in err, err
        assert "to resume" not in err and err.rstrip().endswith("re-run the same command"), err
        # what stays: the accepted manifest and the empty .part/journal pairs it got to make,
        # which the re-run takes up (docs/transfer.md)
        state = os.listdir(dest / ".rq-partial")
        assert any(n.endswith(".manifest.json") for n in state), state
        assert not any(os.path.getsize(dest / ".rq-partial" / n) for n in state if n.endswith(".part"))
        # more inodes, the same command: it arrives
        subprocess.run(["mount", "-o", "remount,nr_inodes=400", str(few_inodes)], check=True)
        again = send([src], recv, "--retry-for", "5")
        assert again.returncode == 0, again.stderr.decode()
    finally:
        recv.stop()
    assert (dest / "many" / "f39.txt").read_bytes() == b"x" * 100


def test_a_plan_out_of_inodes_counts_the_chunks_an_earlier_run_kept(few_inodes: Path) -> None:
    m, datas = _manifest(["a.bin"], 3 * MIN_CHUNK)
    store = Store(few_inodes / "dst")
    try:
        receive_chunks(store, m, datas, MIN_CHUNK, first_chunk_of_file0_only=True)
        _fill_inodes(few_inodes)
        with pytest.raises(NoSpaceError) as full:
            store.plan(m)  # the sender's re-run: its manifest's state file needs an inode
        msg = str(full.value)
        assert "out of inodes" in msg, msg
        assert f"the 1 chunk(s) ({MIN_CHUNK} bytes) verified so far are kept" in msg, msg
    finally:
        store.close()


def test_a_commit_out_of_inodes_while_placing_says_inodes(few_inodes: Path) -> None:
    names = [f"sub/f{n}.bin" for n in range(4)]
    m, datas = _manifest(names, 100)
    store = Store(few_inodes / "dst")
    try:
        roots = receive_chunks(store, m, datas, MIN_CHUNK)
        plan = store.plan(m)
        # room for the commit marker and the 4 placed records (written before the links), none
        # for the directory `sub` the links need
        _fill_inodes(few_inodes, leave=1 + len(names))
        with pytest.raises(NoSpaceError) as full:
            plan.finalize(roots, overwrite=False)
        msg = str(full.value)
        assert "out of inodes placing the verified files" in msg and "disk is full" not in msg, msg
        assert "every chunk of this transfer is verified and kept" in msg, msg
        # the records of the files not placed went, which gave inodes back: the line was told first
        assert os.statvfs(few_inodes).f_favail >= len(names)
        plan.close()
    finally:
        store.close()
    assert not (few_inodes / "dst" / "sub").exists()


def test_a_write_that_fills_the_disk_counts_the_verified_chunks_not_yet_flushed(tmp_path: Path) -> None:
    """A chunk written (verified) but not yet journaled when the next write fills the disk is made
    durable as the receiver stops: the line counts it (it said "none is kept" and the journal then
    held it)."""
    with own_tmpfs(tmp_path / "small", "size=1m") as mnt:
        m, datas = _manifest(["a.bin"], 4 * MIN_CHUNK)
        store = Store(mnt / "dst")
        plan = store.plan(m)
        try:
            plan.write(0, 0, datas[0][:MIN_CHUNK])
            with open(mnt / "filler", "wb") as fh, pytest.raises(OSError):
                while True:
                    fh.write(b"\0" * MIN_CHUNK)
                    fh.flush()
            with pytest.raises(NoSpaceError) as full:
                plan.write(0, 1, datas[0][MIN_CHUNK : 2 * MIN_CHUNK])
            msg = str(full.value)
            assert "disk is full" in msg, msg
            assert f"up to 1 chunk(s) ({MIN_CHUNK} bytes) verified so far are kept (0 recorded, " in msg, msg
        finally:
            plan.close()
            store.close()


def test_the_count_a_full_disk_line_gives_is_what_the_journal_keeps(tmp_path: Path) -> None:
    with own_tmpfs(tmp_path / "small", "size=10m") as mnt:
        src = tmp_path / "big"
        src.mkdir()
        (src / "w.bin").write_bytes(os.urandom(20_000_000))
        recv = Recv(mnt / "dst", tmp_path / "cert", "tcp").start()
        try:
            proc = send([src], recv, "--retry-for", "5")
            err = proc.stderr.decode()
            assert proc.returncode == 7, err
            said = re.search(
                r"(the|up to) (\d+) chunk\(s\) \((\d+) bytes\) verified so far are kept"
                r"(?: \((\d+) recorded, the others if the full disk still takes their records\))?",
                err,
            )
            if said is None:
                assert "so none is kept" in err, err
            claimed = int(said.group(2)) if said else 0
            # "up to N (J recorded …)": J are journaled, the others wait for the receiver's last
            # flush, which this full disk may refuse; "the N": all N are journaled
            least = int(said.group(4)) if said and said.group(4) else claimed
            if said:
                assert int(said.group(3)) == claimed * (4 << 20), err
                assert (said.group(1) == "up to") == (said.group(4) is not None), err
            # the receiver journals them as it lets the transfer go, after the line was sent
            assert wait_for(lambda: _records(mnt / "dst") >= least, 20), (err, _records(mnt / "dst"))
        finally:
            recv.stop()
        assert least <= _records(mnt / "dst") <= claimed, err


def _records(dest: Path) -> int:
    """The chunk records of the (one) journal under dest/.rq-partial."""
    journals = [p for p in (dest / ".rq-partial").iterdir() if p.name.endswith(".journal")]
    return sum(max(0, p.stat().st_size - 32) // 24 for p in journals)
