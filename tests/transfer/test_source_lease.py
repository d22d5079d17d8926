"""The sender's mapped source path (transfer.source.Reader with mapped=True): a cached chunk of a file
rq holds a read lease on is hashed and sent from a mapping of the file, never copied. A mapped page a
truncation takes away would kill rq with SIGBUS, so the lease must hold every writer off until rq lets
go: these tests truncate, rewrite and open the source for writing while it is being sent."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rqtest import popen_rq_with, wait_or_fail
from xfer_kit import Recv, rq_env, wait_for

from transfer import codec, source
from transfer.errors import SourceChangedError
from transfer.source import Reader, SourceFile

CS = 1 << 20  # the smallest chunk the mapped path takes (source.MAP_MIN)

pytestmark = pytest.mark.skipif(
    not getattr(source, "leases_usable", lambda: True)(),
    reason="no file leases here (lease-break-time, fcntl)",
)


def _source(tmp_path: Path, chunks: int = 3) -> tuple[Path, bytes, SourceFile]:
    data = os.urandom(chunks * CS)
    path = tmp_path / "src.bin"
    path.write_bytes(data)
    st = path.stat()
    return path, data, SourceFile(path, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_dev)


def _writer(path: Path, action: str) -> subprocess.Popen[bytes]:
    """Another process that opens `path` for writing (blocking, as programs do) and then truncates
    it, rewrites its first bytes in place, or only closes it again."""
    code = {
        "truncate": "os.truncate(p, 0)",
        "rewrite": "fd = os.open(p, os.O_WRONLY); os.pwrite(fd, b'X' * 4096, 0); os.close(fd)",
        "open": "os.close(os.open(p, os.O_WRONLY))",
    }[action]
    return subprocess.Popen([sys.executable, "-c", f"import os, sys; p = sys.argv[1]; {code}", str(path)])


def _break_pending(reader: Reader, f: int = 0) -> bool:
    fd = reader._fds[f][0]
    return bool(fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK)


def test_a_cached_chunk_is_mapped_under_a_lease_that_holds_writers_off(tmp_path: Path) -> None:
    """The chunk comes from the mapping, and while rq holds it nobody can open the file for writing
    (a non-blocking open says EWOULDBLOCK); once a writer waits, the next chunk gives the lease back,
    the writer goes on, and the file is read with pread from then on, bytes unchanged. The break's
    signal (sent as the writer starts waiting) must not kill this process: SIGIO, the kernel's
    default, would."""
    path, data, sf = _source(tmp_path)
    reader = Reader([sf], CS, mapped=True)
    try:
        assert bytes(reader.read(0, 0, CS)) == data[:CS]
        assert reader.mapped and reader.leased == {0}
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import os, sys; os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)",
                str(path),
            ],
            capture_output=True,
        )
        assert probe.returncode != 0 and b"BlockingIOError" in probe.stderr  # held off by the lease
        opener = _writer(path, "open")
        assert wait_for(lambda: _break_pending(reader), 30)
        assert opener.poll() is None  # it waits for rq
        assert bytes(reader.read(0, 1, CS)) == data[CS : 2 * CS]
        assert not reader.mapped and reader.leased == set()
        assert opener.wait(30) == 0  # let go at the chunk boundary, not after lease-break-time (45 s)
        assert bytes(reader.read(0, 2, CS)) == data[2 * CS :]
    finally:
        reader.close()


def test_a_truncation_while_a_chunk_is_mapped_is_a_changed_source_not_sigbus(tmp_path: Path) -> None:
    """Guard (the old Reader never mapped): truncated while chunk 0 is mapped and half sent, the rest
    of that chunk is copied before the lease is given back, and the next chunk is 'shrank'."""
    path, data, sf = _source(tmp_path)
    reader = Reader([sf], CS, mapped=True)
    try:
        view = reader.read(0, 0, CS)
        assert reader.mapped
        truncator = _writer(path, "truncate")
        assert wait_for(lambda: _break_pending(reader), 30)
        assert codec.digest(view) == codec.digest(data[:CS])  # the writer still waits: safe to touch
        rest = reader.steady(view)  # what the TCP channel asks before each 1 MiB piece
        assert bytes(rest) == data[:CS] and not reader.mapped
        assert truncator.wait(30) == 0
        with pytest.raises(SourceChangedError, match="shrank"):
            reader.read(0, 1, CS)
    finally:
        reader.close()


def test_the_lease_is_refused_while_a_writer_has_the_file_open(tmp_path: Path) -> None:
    """Guard: a file open for writing elsewhere gets no lease and is read with pread, as before."""
    path, data, sf = _source(tmp_path)
    holder = open(path, "r+b")  # noqa: SIM115 - held open across the reads
    reader = Reader([sf], CS, mapped=True)
    try:
        assert bytes(reader.read(0, 1, CS)) == data[CS : 2 * CS]
        assert not reader.mapped and reader.leased == set()
    finally:
        reader.close()
        holder.close()


# rq send with a hook around Reader.read: before chunk 1 another process starts to write the source
# (it waits on the lease); the hook goes on when the writer is done or waits on rq, then reads.
_HOOK = """
import os, subprocess, sys, time, fcntl
from transfer import source
ACTION, PATH = {action!r}, {path!r}
CODE = {code!r}
_read = source.Reader.read
def read(self, f, k, length):
    if k == 1 and not getattr(source, "_started", None):
        sys.stderr.write(f"MAPPED-0 {{getattr(self, 'mapped', False)}}\\n")
        w = source._started = subprocess.Popen([sys.executable, "-c", CODE, PATH])
        fd = self._fds[f][0]
        end = time.monotonic() + 30
        while w.poll() is None and time.monotonic() < end:
            if fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK and f in getattr(self, "leased", ()):
                break  # it waits on our lease: the read below lets it go
            time.sleep(0.01)
        t0 = time.monotonic()
        try:  # (the writer may truncate between the lease given back and this read: 'shrank')
            return _read(self, f, k, length)
        finally:
            w.wait(40)
            sys.stderr.write(f"WRITER {{w.returncode}} waited {{time.monotonic() - t0:.2f}}\\n")
    return _read(self, f, k, length)
source.Reader.read = read
"""


_HOLD = (
    "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); print('open', flush=True); time.sleep(60)"
)


def _send_with(tmp_path: Path, path: Path, setup: str) -> tuple[int, str]:
    """`rq send PATH` in 1 MiB chunks with `setup` run in its process, to an `rq recv --once`."""
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    try:
        proc = popen_rq_with(
            setup, "send", str(path), recv.url, *recv.send_args(), "--chunk-size", str(CS), env=rq_env()
        )
        rc = wait_or_fail(proc, 60, "rq send still running")
        return rc, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        recv.kill()


@pytest.mark.parametrize("action", ["truncate", "rewrite"])
def test_rq_send_of_a_source_changed_under_the_mapping_fails_as_changed(tmp_path: Path, action: str) -> None:
    """Guard for the SIGBUS case, and the map path used: a 3 MiB source truncated or rewritten in
    place by another process after its first chunk went out from the mapping: exit 5, 'changed'
    (or 'shrank'), never killed by SIGBUS, and the writer was not held for lease-break-time."""
    path, _, _ = _source(tmp_path)
    code = {
        "truncate": "import os, sys; os.truncate(sys.argv[1], 0)",
        "rewrite": "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY); os.pwrite(fd, b'X' * 4096, 0)",
    }[action]
    rc, err = _send_with(tmp_path, path, _HOOK.format(action=action, path=str(path), code=code))
    assert rc == 5, (rc, err)  # -7 would be SIGBUS
    assert "MAPPED-0 True" in err  # chunk 0 went out from the mapping
    assert "changed while it was being sent" in err or "shrank" in err, err
    assert "WRITER 0" in err
    waited = float(err.split("WRITER 0 waited ")[1].split()[0])
    # a writer held on the lease waits the kernel's lease-break-time (45 s by default): anything
    # well under it is "let go at once", whatever a slow runner adds to the writer's exit
    assert waited < 20


def test_rq_send_goes_on_with_pread_when_the_lease_is_refused(tmp_path: Path) -> None:
    """Guard: another process has the source open for writing (and writes nothing): no lease, no
    mapping, and the send completes verified."""
    path, data, _ = _source(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        setup = (
            "from transfer import source\n_r = source.Reader.read\n"
            "def read(self, f, k, n):\n"
            "    out = _r(self, f, k, n)\n"
            "    import sys; sys.stderr.write(f'MAPPED {getattr(self, \"mapped\", False)}\\n')\n"
            "    return out\n"
            "source.Reader.read = read\n"
        )
        rc, err = _send_with(tmp_path, path, setup)
    finally:
        holder.kill()
        holder.wait()
    assert rc == 0, err
    assert err.count("MAPPED False") == 3 and "MAPPED True" not in err
    assert (tmp_path / "dst" / "src.bin").read_bytes() == data


def _opens_at_once(path: Path) -> bool:
    """A writer's non-blocking open: EWOULDBLOCK while somebody holds a lease on the file."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except BlockingIOError:
        return False
    return True


def test_a_file_sent_is_let_go_before_the_send_ends(tmp_path: Path) -> None:
    """A writer of a file whose chunks all went out waited for the whole send to end (the lease was
    given back only by Reader.close, after every acknowledgement: 14 s behind a slow link, 22 s
    behind a stopped receiver, up to lease-break-time). Moving on to another file, or finishing one,
    lets it go."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, _, sa = _source(tmp_path / "a", chunks=2)
    b, _, sb = _source(tmp_path / "b", chunks=2)
    reader = Reader([sa, sb], CS, mapped=True)
    try:
        reader.read(0, 0, CS)
        assert 0 in reader.leased and reader.mapped and not _opens_at_once(a)
        reader.read(0, 1, CS)
        reader.read(1, 0, CS)  # moved on to b: a is let go
        assert 0 not in reader.leased and _opens_at_once(a)
        reader.read(1, 1, CS)
        reader.finished(1)  # b's last chunk went out (the sender says so)
        assert not reader.leased and _opens_at_once(b)
    finally:
        reader.close()


def test_no_lease_is_taken_on_overlayfs(tmp_path: Path) -> None:
    """On overlayfs a truncate of the layer below breaks no lease, and touching the mapping then
    killed rq with SIGBUS (a review: 4 runs in 12). Files there are read with pread."""
    lower, upper, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    for d in (lower, upper, work, merged):
        d.mkdir()
    mount = subprocess.run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={lower},upperdir={upper},workdir={work}",
            str(merged),
        ],
        capture_output=True,
        check=False,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount overlayfs here: {mount.stderr.decode().strip()}")
    try:
        (lower / "src.bin").write_bytes(os.urandom(2 * CS))
        st = (merged / "src.bin").stat()
        sf = SourceFile(merged / "src.bin", st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_dev)
        reader = Reader([sf], CS, mapped=True)
        try:
            data = bytes(reader.read(0, 0, CS))
            assert not reader.leased and not reader.mapped
            assert data == (lower / "src.bin").read_bytes()[:CS]
        finally:
            reader.close()
    finally:
        subprocess.run(["umount", str(merged)], check=False)
