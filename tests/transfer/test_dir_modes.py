"""Directory permission bits over `rq send DIR` / `rq recv`: a checkpoint directory with a 0700
subdirectory arrived 0755 (mkdir 0755 less the receiver's umask) whatever the source said. Now the
manifest's optional `dir_modes` carries them, outside the transfer id, and the receiver applies them
(less group/other write, never setuid/setgid/sticky, as for files) deepest first once everything is
placed. Real `rq recv` and `rq send` over TCP on loopback, plus a sender speaking the protocol by hand."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson
import pytest
from xfer_kit import (
    AS_NOBODY,
    NOBODY,
    Recv,
    interrupt_after,
    manifest_reply,
    nobody_home,
    rq_env,
    summary,
    tree_digest,
)
from xfer_kit import send as rq_send

from transfer.errors import ProtocolError, UnsafeNameError
from transfer.manifest import FileEntry, Limits, file_key, make_manifest, parse_manifest

pytestmark = pytest.mark.integration

# source mode -> the mode it arrives with (group/other write and setuid/setgid/sticky dropped)
DIRS = {
    "ckpt": (0o750, 0o750),
    "ckpt/private": (0o700, 0o700),
    "ckpt/private/inner": (0o700, 0o700),
    "ckpt/team": (0o750, 0o750),
    "ckpt/team/empty": (0o750, 0o750),  # no file under it: a directory entry of the manifest
    "ckpt/shared": (0o2777, 0o755),
    "ckpt/readonly": (0o555, 0o555),
}


def _tree(root: Path) -> Path:
    for name in DIRS:
        (root / name).mkdir(parents=True, exist_ok=True)
    for name in ["private/inner/opt.bin", "private/a.bin", "team/w.bin", "shared/s.bin", "readonly/r.bin"]:
        (root / "ckpt" / name).write_bytes(os.urandom(200_000))
    (root / "ckpt" / "index.json").write_text("{}")
    for name, (mode, _) in sorted(DIRS.items(), key=lambda d: -d[0].count("/")):
        os.chmod(root / name, mode)  # deepest first: as root nothing stops us, but keep it honest
    return root / "ckpt"


def _modes(dest: Path) -> dict[str, int]:
    return {name: stat.S_IMODE((dest / name).stat().st_mode) for name in DIRS}


def _umask_022() -> None:
    os.umask(0o022)


def test_directories_arrive_with_their_modes(tmp_path: Path) -> None:
    """Was: every directory arrived 0755 (mkdir 0755 under a umask 022 receiver), a 0700
    subdirectory of a checkpoint readable by everyone. Now each has the source's bits less
    group/other write (setgid dropped), the SOURCE directory and an empty directory included. A
    re-run after a file under a 0700 directory was deleted sends that file alone and keeps them.
    A re-run that finds it already complete gives them the sender's modes again (as an rsync -a
    re-run fixes permissions): it used to keep the 0755 of a transfer an older receiver (no
    dir_modes) completed."""
    ckpt = _tree(tmp_path / "src")
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp", preexec=_umask_022).start()
    try:
        proc = rq_send([ckpt], recv)
        assert proc.returncode == 0, proc.stderr.decode()
        assert _modes(dest) == {name: want for name, (_, want) in DIRS.items()}
        assert tree_digest(dest / "ckpt") == tree_digest(ckpt)
        (dest / "ckpt" / "private" / "inner" / "opt.bin").unlink()
        proc = rq_send([ckpt], recv)
        assert proc.returncode == 0, proc.stderr.decode()
        assert summary(proc)["bytes_raw"] == 200_000, summary(proc)
        for name in DIRS:
            os.chmod(dest / name, 0o755)  # what an older receiver left
        proc = rq_send([ckpt], recv)
        assert proc.returncode == 0, proc.stderr.decode()
        assert summary(proc)["bytes_raw"] == 0 and summary(proc)["complete"], summary(proc)
    finally:
        recv.stop()
    assert _modes(dest) == {name: want for name, (_, want) in DIRS.items()}
    assert tree_digest(dest / "ckpt") == tree_digest(ckpt)


def test_a_resumed_send_still_applies_the_modes(tmp_path: Path) -> None:
    """A send killed after a few chunks leaves the receiver's directories as mkdir made them; the
    re-run of the same command (same transfer id: `dir_modes` is outside it) resumes and gives
    them the source's modes at its commit."""
    src = tmp_path / "src"
    (src / "ckpt" / "private").mkdir(parents=True)
    (src / "ckpt" / "private" / "big.bin").write_bytes(os.urandom(1 << 20))
    (src / "ckpt" / "private").chmod(0o700)
    (src / "ckpt").chmod(0o750)
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp", preexec=_umask_022).start()
    try:
        interrupt_after(src / "ckpt", recv, 3, 64 << 10)
        proc = rq_send([src / "ckpt"], recv, "--chunk-size", "64KiB")
        assert proc.returncode == 0, proc.stderr.decode()
        assert summary(proc)["bytes_raw"] < 1 << 20, summary(proc)  # it did resume
    finally:
        recv.stop()
    assert stat.S_IMODE((dest / "ckpt").stat().st_mode) == 0o750
    assert stat.S_IMODE((dest / "ckpt" / "private").stat().st_mode) == 0o700
    assert (dest / "ckpt" / "private" / "big.bin").read_bytes() == (
        src / "ckpt" / "private" / "big.bin"
    ).read_bytes()


def test_read_only_directories_as_a_receiver_that_is_not_root(tmp_path: Path) -> None:
    """A receiver that is not root: a 0500 directory made so before its files were linked would
    refuse them, so modes come last, deepest first. A later transfer adding a file under that
    0500 directory (here a shard added to the source, sent again) opens it for the commit (u+w,
    as rsync does) and gives it back its 0500."""
    src = tmp_path / "src"
    (src / "ckpt" / "frozen" / "deep").mkdir(parents=True)
    (src / "ckpt" / "frozen" / "deep" / "a.bin").write_bytes(os.urandom(100_000))
    (src / "ckpt" / "frozen" / "deep").chmod(0o500)
    (src / "ckpt" / "frozen").chmod(0o500)
    with nobody_home() as home:
        dest = home / "dst"
        recv = Recv(dest, home / "cert", "tcp", env=rq_env(HOME=str(home)), wrap=AS_NOBODY).start()
        try:
            proc = rq_send([src / "ckpt"], recv)
            assert proc.returncode == 0, proc.stderr.decode()
            assert stat.S_IMODE((dest / "ckpt" / "frozen").stat().st_mode) == 0o500
            assert stat.S_IMODE((dest / "ckpt" / "frozen" / "deep").stat().st_mode) == 0o500
            (src / "ckpt" / "frozen" / "deep" / "b.bin").write_bytes(os.urandom(50_000))  # root writes anyway
            proc = rq_send([src / "ckpt"], recv)
            assert proc.returncode == 0, proc.stderr.decode()
            assert summary(proc)["bytes_raw"] == 50_000, summary(proc)
        finally:
            recv.stop()
        deep = dest / "ckpt" / "frozen" / "deep"
        assert stat.S_IMODE(deep.stat().st_mode) == 0o500
        assert stat.S_IMODE((dest / "ckpt" / "frozen").stat().st_mode) == 0o500
        assert deep.stat().st_uid == NOBODY
        assert tree_digest(dest / "ckpt") == tree_digest(src / "ckpt")


@pytest.mark.parametrize("mode", [0o300, 0o000])
def test_directories_without_owner_read_or_search_as_a_receiver_that_is_not_root(
    tmp_path: Path, mode: int
) -> None:
    """A directory an earlier transfer left 0300 (no read) or 0000 (no search either) got in the
    way of a receiver that is not root: every re-run, even of the same command, was refused as
    "locked in the destination is not a plain directory" (its plan and "already complete" checks
    walk with O_RDONLY). They now open it (u+rwx) for the checks, as the commit does, and give it
    back its mode."""
    src = tmp_path / "src"
    (src / "ckpt" / "locked" / "deep").mkdir(parents=True)
    (src / "ckpt" / "locked" / "deep" / "a.bin").write_bytes(os.urandom(100_000))
    (src / "ckpt" / "locked" / "top.bin").write_bytes(os.urandom(1_000))
    (src / "ckpt" / "locked").chmod(mode)  # root reads it anyway
    with nobody_home() as home:
        dest = home / "dst"
        locked = dest / "ckpt" / "locked"
        recv = Recv(dest, home / "cert", "tcp", env=rq_env(HOME=str(home)), wrap=AS_NOBODY).start()
        try:
            proc = rq_send([src / "ckpt"], recv)
            assert proc.returncode == 0, proc.stderr.decode()
            assert stat.S_IMODE(locked.stat().st_mode) == mode
            proc = rq_send([src / "ckpt"], recv)  # the same command again: nothing to send
            assert proc.returncode == 0, proc.stderr.decode()
            assert summary(proc)["bytes_raw"] == 0, summary(proc)
            assert stat.S_IMODE(locked.stat().st_mode) == mode
            (src / "ckpt" / "locked" / "deep" / "b.bin").write_bytes(os.urandom(50_000))
            proc = rq_send([src / "ckpt"], recv)  # a shard added under it
            assert proc.returncode == 0, proc.stderr.decode()
            assert summary(proc)["bytes_raw"] == 50_000, summary(proc)
        finally:
            recv.stop()
        assert stat.S_IMODE(locked.stat().st_mode) == mode
        locked.chmod(0o755)  # as root: to compare
        assert tree_digest(dest / "ckpt") == tree_digest(src / "ckpt")


def _entry(name: str) -> FileEntry:
    return FileEntry(name=name, size=1000, mode=0o644, key=file_key(name, 1000, 1, 1, 1 << 16))


def test_dir_modes_are_optional_and_outside_the_transfer_id() -> None:
    """An older sender sends no `dir_modes` (its directories are made 0755 as before) and keeps
    its transfer id; an older receiver reads the manifest with `raw.get` of the fields it knows,
    so it ignores this one (checked by hand against the code before it: docs/transfer.md)."""
    files = [_entry("ckpt/d/a.bin")]
    with_modes = make_manifest(1 << 16, files, dir_modes={"ckpt": 0o700, "ckpt/d": 0o750})
    without = make_manifest(1 << 16, files)
    assert with_modes.transfer_id == without.transfer_id
    assert orjson.loads(with_modes.to_json())["dir_modes"] == {"ckpt": 0o700, "ckpt/d": 0o750}
    assert parse_manifest(with_modes.to_json(), Limits()).dir_modes == (("ckpt", 0o700), ("ckpt/d", 0o750))
    assert parse_manifest(without.to_json(), Limits()).dir_modes == ()
    assert b"dir_modes" not in without.to_json()


HOSTILE_NAMES = [
    "../escape",
    "/abs/dir",
    "ckpt/../../escape",
    "elsewhere",
    "ckpt/a.bin",
    ".rq-partial",
    "ckpt/",
]


def _hostile_body(dir_modes: object) -> bytes:
    body = orjson.loads(make_manifest(1 << 16, [_entry("ckpt/a.bin")]).to_json())
    body["dir_modes"] = dir_modes
    return orjson.dumps(body)


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_dir_modes_name_is_refused_like_a_bad_file_name(name: str) -> None:
    with pytest.raises(UnsafeNameError):
        parse_manifest(_hostile_body({name: 0o700}), Limits())


@pytest.mark.parametrize("mode", [0o10000, -1, True, "0700", 1.5])
def test_a_bad_dir_mode_is_refused(mode: object) -> None:
    with pytest.raises(ProtocolError, match="bad mode"):
        parse_manifest(_hostile_body({"ckpt": mode}), Limits())


def test_a_hostile_sender_cannot_chmod_through_dir_modes(tmp_path: Path) -> None:
    """Was: `dir_modes` did not exist, so any names in it were accepted with the manifest. Now a
    name that escapes DEST ('..', absolute), is not a directory the transfer fills, or is a file
    of it, is refused before anything is written, with the code a bad file name gets
    (unsafe-name: exit 1 for `rq send`); a bad mode is a protocol error. The receiver stays up,
    nothing inside or outside DEST changed mode, and an honest sender still gets through."""
    dest, outside = tmp_path / "dst", tmp_path / "outside"
    (dest / "elsewhere").mkdir(parents=True)
    outside.mkdir()
    (dest / "link").symlink_to(outside)
    before = {p: stat.S_IMODE(p.stat().st_mode) for p in (dest, dest / "elsewhere", outside, tmp_path)}
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    try:
        bad_file = orjson.loads(_hostile_body({}))
        bad_file["files"][0]["name"] = "../escape"
        assert manifest_reply(recv.port, orjson.dumps(bad_file))["code"] == "unsafe-name"
        for name in [*HOSTILE_NAMES, f"{outside}", "link", "dst"]:
            reply = manifest_reply(recv.port, _hostile_body({name: 0o000}))
            assert reply["type"] == "ERROR" and reply["code"] == "unsafe-name", (name, reply)
        reply = manifest_reply(recv.port, _hostile_body({"ckpt": 0o70000}))
        assert reply["type"] == "ERROR" and reply["code"] == "protocol", reply
        src = tmp_path / "honest"
        src.mkdir()
        (src / "f.bin").write_bytes(os.urandom(10_000))
        src.chmod(0o700)
        proc = rq_send([src], recv)
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        recv.stop()
    assert {p: stat.S_IMODE(p.stat().st_mode) for p in before} == before
    assert stat.S_IMODE((dest / "honest").stat().st_mode) == 0o700
