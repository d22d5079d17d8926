"""File metadata `rq recv` keeps, the way `rsync -a` / `scp -p` users expect: the source's mtimes
(files and directories) and its permission bits less group/other write. A later `rsync -a` of the
same checkpoint compares size and mtime; with the arrival time as mtime it re-copied every file rq
moved. Real `rq recv` and `rq send` over TCP on loopback, plus the manifest's wire form."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from xfer_kit import (
    AS_NOBODY,
    NOBODY,
    REPO,
    Recv,
    Relay,
    make_tree,
    rq_cmd,
    rq_env,
    summary,
    tree_digest,
    wait_for,
)
from xfer_kit import nobody_home as nobody_dir
from xfer_kit import send as rq_send

from transfer.errors import ProtocolError
from transfer.manifest import FileEntry, Limits, make_manifest, parse_manifest

pytestmark = pytest.mark.integration

# distinct, old, with nanoseconds: nothing a receiver could get by chance
T0 = 1_600_000_000_123_456_789


def _times(root: Path) -> dict[str, tuple[int, int]]:
    """(size or -1 for a directory, mtime_ns) of everything under `root`, by relative name."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[p.relative_to(root).as_posix()] = (-1 if p.is_dir() else st.st_size, st.st_mtime_ns)
    return out


def _tree_with_times(root: Path) -> Path:
    ckpt = make_tree(root, 700_000, 200_000)
    (ckpt / "logs" / "empty").mkdir(parents=True)
    (ckpt / "logs" / "run.txt").write_text("step 1\n")
    files = sorted(p for p in ckpt.rglob("*") if p.is_file())
    for i, p in enumerate(files):
        os.utime(p, ns=(T0, T0 + i * 1_000_000_007))
    # directories last (deepest first), as their contents moved them
    dirs = sorted((p for p in ckpt.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for i, p in enumerate([*dirs, ckpt]):
        os.utime(p, ns=(T0, T0 - (i + 1) * 3_000_000_011))
    return ckpt


def test_files_and_directories_arrive_with_the_source_mtimes(tmp_path: Path) -> None:
    """Was: every received file (and directory) had the time it arrived, so `rsync -a` of the same
    checkpoint afterwards found every size+mtime different and copied it all again. Now each file
    has its source's mtime (to the ns) before it is linked into place, and each directory its own
    once its contents are placed. The receiver's placed record still tells an untouched file: a
    re-run after one file was deleted sends that file only, and puts the directory's time back."""
    ckpt = _tree_with_times(tmp_path / "src")
    want = _times(ckpt)
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    try:
        proc = rq_send([ckpt], recv, "--chunk-size", "256KiB")
        assert proc.returncode == 0, proc.stderr.decode()
        assert _times(dest / "ckpt") == want
        assert (dest / "ckpt").stat().st_mtime_ns == ckpt.stat().st_mtime_ns
        gone = dest / "ckpt" / "shards" / "rand.bin"
        gone.unlink()
        proc = rq_send([ckpt], recv, "--chunk-size", "256KiB")
        assert proc.returncode == 0, proc.stderr.decode()
        assert summary(proc)["bytes_raw"] == 700_000, summary(proc)  # the others judged untouched
        assert _times(dest / "ckpt") == want
        again = rq_send([ckpt], recv, "--chunk-size", "256KiB")
        assert again.returncode == 0 and summary(again)["bytes_raw"] == 0, again.stderr.decode()
    finally:
        recv.stop()
    assert tree_digest(dest / "ckpt") == tree_digest(ckpt)


def _send_once(srcs: list[Path], recv: Recv) -> None:
    """Sends to a started `rq recv --once`, which must exit 0 with the sender."""
    try:
        proc = rq_send(srcs, recv)
        assert proc.returncode == 0, proc.stderr.decode()
        assert recv.wait()[0] == 0
    finally:
        recv.stop()


def test_a_file_source_keeps_its_mtime_with_several_files_placed_at_once(tmp_path: Path) -> None:
    """File SOURCEs (no directory entry) over a batch placement (syncfs path), and --overwrite's
    rename: the placed file has the source's time either way."""
    srcs = []
    for i in range(3):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(os.urandom(10_000 + i))
        os.utime(p, ns=(T0, T0 + i))
        srcs.append(p)
    dest = tmp_path / "dst"
    dest.mkdir()
    (dest / "f1.bin").write_bytes(b"old")
    recv = Recv(dest, tmp_path / "cert", "tcp", "--overwrite", "--once").start()
    _send_once(srcs, recv)
    for i, p in enumerate(srcs):
        st = (dest / p.name).stat()
        assert (st.st_size, st.st_mtime_ns) == (p.stat().st_size, T0 + i)


def test_mtimes_are_optional_and_outside_the_transfer_id() -> None:
    """An older sender sends no `mtime_ns` / `dir_mtimes` (the file keeps its arrival time), and an
    older receiver ignores them: the transfer id is the same either way, so both still agree."""
    key = "0" * 31 + "1"
    entry = FileEntry(name="d/a.bin", size=5, mode=0o644, key=key, mtime_ns=T0)
    with_times = make_manifest(1 << 20, [entry], dir_mtimes={"d": T0 - 1})
    without = make_manifest(1 << 20, [FileEntry(name="d/a.bin", size=5, mode=0o644, key=key)])
    assert with_times.transfer_id == without.transfer_id
    body = orjson.loads(with_times.to_json())
    assert body["files"][0]["mtime_ns"] == T0 and body["dir_mtimes"] == {"d": T0 - 1}
    parsed = parse_manifest(with_times.to_json(), Limits())
    assert parsed.files[0].mtime_ns == T0 and parsed.dir_mtimes == (("d", T0 - 1),)
    old = parse_manifest(without.to_json(), Limits())
    assert old.files[0].mtime_ns is None and old.dir_mtimes == ()
    assert b"mtime" not in without.to_json()


@pytest.mark.parametrize(
    "change,says",
    [
        (lambda b: b["files"][0].update(mtime_ns="1"), "bad mtime"),
        (lambda b: b["files"][0].update(mtime_ns=True), "bad mtime"),
        (lambda b: b["files"][0].update(mtime_ns=(1 << 63) - 1), "bad mtime"),
        (lambda b: b.update(dir_mtimes={"d": 1.5}), "bad mtime"),
        (lambda b: b.update(dir_mtimes={"elsewhere": 1}), "not a directory of the transfer"),
        (lambda b: b.update(dir_mtimes={"d/a.bin": 1}), "not a directory of the transfer"),
        (lambda b: b.update(dir_mtimes=["d", 1]), "must be an object"),
    ],
)
def test_bad_times_from_the_network_are_refused(change: object, says: str) -> None:
    entry = FileEntry(name="d/a.bin", size=5, mode=0o644, key="0" * 31 + "1", mtime_ns=T0)
    body = orjson.loads(make_manifest(1 << 20, [entry]).to_json())
    change(body)  # type: ignore[operator]
    with pytest.raises(ProtocolError, match=says):
        parse_manifest(orjson.dumps(body), Limits())


# -- permission bits ------------------------------------------------------------------------------


@pytest.fixture
def nobody_home() -> Iterator[Path]:
    with nobody_dir() as home:
        yield home


def _recv_as_nobody(home: Path, *extra: str) -> Recv:
    return Recv(home / "dst", home / "cert", "tcp", *extra, env=rq_env(HOME=str(home)), wrap=AS_NOBODY)


MODES = {"ro.bin": 0o400, "exec.sh": 0o755, "shared.txt": 0o664, "setuid": 0o4755, "none": 0o000, "rw": 0o640}


def _files_with_modes(root: Path) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i, (name, mode) in enumerate(sorted(MODES.items())):
        p = root / name
        p.write_bytes(os.urandom(5_000 * (i + 1)))
        p.chmod(mode)
        out.append(p)
    return out


def test_files_keep_their_mode_bits_less_group_and_other_write(tmp_path: Path, nobody_home: Path) -> None:
    """Was: every file arrived at least 0600 (`| 0o600`), so a 0400 file became writable and 0640
    became 0640 only by luck. Now the source's bits arrive less group/other write and never
    setuid/setgid/sticky, like `cp -p` by a user; shown with a receiver that is not root, where
    its own 0400 and 0000 files cannot be opened for writing."""
    srcs = _files_with_modes(tmp_path / "src")
    recv = _recv_as_nobody(nobody_home, "--once").start()
    _send_once(srcs, recv)
    dest = nobody_home / "dst"
    got = {p.name: stat.S_IMODE((dest / p.name).stat().st_mode) for p in srcs}
    assert got == {
        "ro.bin": 0o400,
        "exec.sh": 0o755,
        "shared.txt": 0o644,
        "setuid": 0o755,
        "none": 0o000,
        "rw": 0o640,
    }
    assert all((dest / p.name).read_bytes() == p.read_bytes() for p in srcs)
    assert all((dest / p.name).stat().st_uid == NOBODY for p in srcs)


class Gate(Relay):
    """Holds the sender's bytes after the first `after` of a connection until `opened` is set."""

    def __init__(self, target_port: int, after: int):
        super().__init__(target_port)
        self.after = after
        self.opened = threading.Event()

    def carry(self, data: bytes, seen: int) -> bytes:
        if seen + len(data) > self.after:
            self.opened.wait(30)
        return data


@pytest.mark.parametrize("redo", ["commit redone", "z.bin sent alone"])
def test_a_commit_cut_short_finishes_as_a_receiver_that_is_not_root(
    tmp_path: Path, nobody_home: Path, redo: str
) -> None:
    """A commit seals every .part (mode last) before it links them; one that stops half-way (here
    a file put in the way of `z.bin` while the transfer ran: exit 9) leaves `z.bin`'s .part sealed
    0400. The re-run, once the obstacle is gone, finishes the commit (or a transfer of `z.bin`
    alone plans that file again over its .part): both reopen the sealed .part, which a
    receiver that is not root could not open read-write. They make it 0600 again, without following
    a link, and the file lands with its own mode."""
    a = tmp_path / "src" / "a.bin"
    z = tmp_path / "src" / "z.bin"
    a.parent.mkdir()
    a.write_bytes(os.urandom(300_000))
    z.write_bytes(os.urandom(300_000))
    z.chmod(0o400)
    os.utime(z, ns=(T0, T0))
    recv = _recv_as_nobody(nobody_home).start()
    dest = nobody_home / "dst"
    state = dest / ".rq-partial"
    gate = Gate(recv.port, 4096)
    try:
        url = f"rq://127.0.0.1:{gate.port}"
        cmd = rq_cmd("send", str(a), str(z), url, "--transport", "tcp", "--json", "--chunk-size", "64KiB")
        sender = subprocess.Popen(cmd, env=rq_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert wait_for(lambda: any(state.glob("*.manifest.json")), 20)
        (dest / "z.bin").write_bytes(b"in the way")
        gate.opened.set()
        _out, err = sender.communicate(timeout=60)
        assert sender.returncode == 9 and "z.bin already exists" in err.decode(), err.decode()
        parts = list(state.glob("*.part"))
        assert len(parts) == 1 and stat.S_IMODE(parts[0].stat().st_mode) == 0o400  # sealed, not placed
        (dest / "z.bin").unlink()
        # the same command finishes the commit; `z.bin` alone is another transfer, which plans
        # the same file version (same key) over the sealed .part and has nothing left to send
        proc = rq_send([a, z] if redo == "commit redone" else [z], recv, "--chunk-size", "64KiB")
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        gate.close()
        recv.stop()
    st = (dest / "z.bin").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o400, T0)
    assert (dest / "z.bin").read_bytes() == z.read_bytes()
    assert (dest / "a.bin").read_bytes() == a.read_bytes()
    assert not list(state.glob("*.part"))
