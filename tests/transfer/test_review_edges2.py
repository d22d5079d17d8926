"""Edges of `rq send` / `rq recv` an earlier review found (2026-11-23), each test failing before its
fix: a source rewritten in place between an interrupted run and its resume, two receivers on one
DEST, a file where a directory goes, a read-only DEST, a missing SOURCE under --json, file modes."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from xfer_kit import REPO, TOKEN, Recv, interrupt_after, journal_records, rq_cmd, rq_env, summary, wait_for
from xfer_kit import send as rq_send

from transfer.events import ChunkMoved, Event
from transfer.sender import SendOptions, send
from transfer.transport import ConnectOptions, get_transport

pytestmark = pytest.mark.integration


# -- 1. a source rewritten in place, its mtime put back ---------------------------------------------


def test_a_source_rewritten_in_place_with_its_mtime_restored_is_sent_again_whole(tmp_path: Path) -> None:
    """Was: same size, same inode, same mtime (`touch -r`, os.utime): the resume kept the chunks of
    the old contents and the receiver ended with a mix of both versions, reported verified. The
    file's identity now includes its ctime (which no utime can set back): it is sent again whole."""
    src = tmp_path / "model.bin"
    size = 4 << 20
    src.write_bytes(os.urandom(size))
    st = src.stat()
    dest = tmp_path / "dst"
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    try:
        interrupt_after(src, recv, 6, 256 << 10)
        assert wait_for(lambda: journal_records(dest) >= 4, 10)
        new = os.urandom(size)
        with open(src, "r+b") as fh:  # in place: same inode, same size
            fh.write(new)
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (src.stat().st_ino, src.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
        proc = rq_send([src], recv, "--chunk-size", "256KiB", "--compress", "none")
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        recv.stop()
    assert (dest / "model.bin").read_bytes() == new, "the receiver holds a mix of both versions"
    assert summary(proc)["bytes_raw"] == size


# -- 2. two receivers on one DEST, the same transfer --------------------------------------------------


@pytest.mark.timeout(90)
def test_a_second_receiver_of_the_same_transfer_into_one_dest_is_refused_in_one_line(tmp_path: Path) -> None:
    """Was: two `rq recv` on one DEST took the same transfer at once; the one that finished first
    placed the file, and the other failed with 'receiver cannot write 'model.bin': No such file or
    directory'. Now the second is refused in one line (exit 9) and the first completes."""
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(8 << 20))
    dest = tmp_path / "dst"
    first = Recv(dest, tmp_path / "cert", "tcp").start()
    second = Recv(dest, tmp_path / "cert", "tcp").start()
    seen: list[subprocess.CompletedProcess[bytes]] = []
    try:
        copts = ConnectOptions("127.0.0.1", first.port, None, tls=False)

        def on_event(ev: Event) -> None:
            if isinstance(ev, ChunkMoved) and not seen:  # the first is mid-flight: the second now
                seen.append(rq_send([src], second, "--chunk-size", "256KiB", "--retry-for", "0"))

        opts = SendOptions(chunk_size=256 << 10, window=1, streams=1, compress="none")
        result = send([src], get_transport("tcp"), copts, TOKEN.encode(), opts, on_event)
    finally:
        first.stop()
        second.stop()
    proc = seen[0]
    err = proc.stderr.decode()
    assert proc.returncode == 9, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert "another rq recv" in lines[0] and "into the same destination" in lines[0], err
    assert str(tmp_path) not in err  # the receiver's own paths stay on the receiver
    assert result["verified"]
    assert (dest / "model.bin").read_bytes() == src.read_bytes()


# -- 3, 4. a file where the transfer has a directory ------------------------------------------------


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_where_a_parent_directory_goes_is_an_exists_refusal(tmp_path: Path, overwrite: bool) -> None:
    """Was: exit 1 ('a/b.bin: a in the destination is not a plain directory'), with --overwrite too.
    Now exit 9 like every 'in the way' refusal, naming the file, and without the --overwrite hint:
    like cp (`cannot overwrite non-directory with directory`), rq never replaces a file by a
    directory, --overwrite or not."""
    src = tmp_path / "src" / "a"
    (src / "deep").mkdir(parents=True)
    (src / "deep" / "b.bin").write_bytes(b"payload")
    dest = tmp_path / "dst"
    (dest / "a").mkdir(parents=True)
    (dest / "a" / "deep").write_bytes(b"mine")
    extra = ("--overwrite",) if overwrite else ()
    recv = Recv(dest, tmp_path / "cert", "tcp", *extra).start()
    try:
        proc = rq_send([src], recv)
    finally:
        recv.stop()
    err = proc.stderr.decode()
    assert proc.returncode == 9, err
    assert "a/deep exists in the destination as a file where the transfer has a directory" in err, err
    assert "pass --overwrite" not in err, err
    assert (dest / "a" / "deep").read_bytes() == b"mine"


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_where_an_empty_directory_goes_gets_no_overwrite_hint(tmp_path: Path, overwrite: bool) -> None:
    """Was: exit 9 '… (rq does not replace files with directories; remove or rename it) — pass
    --overwrite to `rq recv` to replace existing files', even when --overwrite was given: a hint that
    could not help. Now the hint says what does."""
    src = tmp_path / "src" / "e"
    (src / "empty").mkdir(parents=True)
    (src / "f").write_bytes(b"x")
    dest = tmp_path / "dst"
    (dest / "e").mkdir(parents=True)
    (dest / "e" / "empty").write_bytes(b"mine")
    extra = ("--overwrite",) if overwrite else ()
    recv = Recv(dest, tmp_path / "cert", "tcp", *extra).start()
    try:
        proc = rq_send([src], recv)
    finally:
        recv.stop()
    err = proc.stderr.decode()
    assert proc.returncode == 9, err
    assert "e/empty exists in the destination as a file where the transfer has a directory" in err, err
    assert "pass --overwrite" not in err and "remove or rename it" in err, err
    assert (dest / "e" / "empty").read_bytes() == b"mine"


# -- 5. a read-only DEST ----------------------------------------------------------------------------


@pytest.fixture
def ro_mount(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only file system needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot mount tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def _remount(mnt: Path, how: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{how}", str(mnt)], check=True, capture_output=True)


def test_a_read_only_dest_is_named_not_rq_s_internal_files(tmp_path: Path, ro_mount: Path) -> None:
    """Was: 'cannot use .rq-partial: Read-only file system' when rq recv started, and 'receiver
    cannot write '<hex>.manifest.json.tmp…'' when DEST became read-only under a running receiver:
    names of rq's own state files. Now rq recv names DEST, the sender hears 'its destination' (the
    receiver's paths stay on the receiver), and both say it is not writable (exit 1)."""
    dest = ro_mount / "dst"
    dest.mkdir()
    _remount(ro_mount, "ro")
    started = subprocess.run(
        rq_cmd("recv", str(dest), "--listen", "127.0.0.1:0", "--transport", "tcp", "--once"),
        env=rq_env(),
        capture_output=True,
        timeout=60,
        cwd=REPO,
    )
    err = started.stderr.decode()
    assert started.returncode == 1, err
    assert f"cannot use {dest}: not writable (Read-only file system)" in err, err
    _remount(ro_mount, "rw")
    src = tmp_path / "f.bin"
    src.write_bytes(b"payload")
    recv = Recv(dest, tmp_path / "cert", "tcp").start()
    try:
        _remount(ro_mount, "ro")
        proc = rq_send([src], recv, "--retry-for", "1")
    finally:
        recv.stop()
        _remount(ro_mount, "rw")
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert "cannot write into its destination: not writable (Read-only file system)" in err, err
    assert ".rq-partial" not in err and ".tmp" not in err and ".owner" not in err, err
    assert str(tmp_path) not in err  # the receiver's own paths stay on the receiver


# -- 6. a missing SOURCE under --json ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "fifo"])
def test_a_send_that_cannot_start_still_ends_json_with_a_summary(tmp_path: Path, kind: str) -> None:
    """Was: `rq send --json missing rq://…` printed nothing on stdout (exit 3), where every other
    failure ends with a summary line (docs/cli.md: `tail -n1` is the result). Now it does too."""
    src = tmp_path / "nope"
    if kind == "fifo":
        os.mkfifo(src)
    proc = subprocess.run(
        rq_cmd("send", str(src), "rq://127.0.0.1:9", "--transport", "tcp", "--json"),
        env=rq_env(),
        capture_output=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 3, proc.stderr.decode()
    last = json.loads(proc.stdout.decode().splitlines()[-1])
    assert last["event"] == "summary" and last["complete"] is False and last["resumable"] is False, last
    assert str(src) in last["error"], last


def test_a_file_seen_through_another_device_number_keeps_its_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An NFS share gets a new device number each time it is mounted: a resume after the sender
    # rebooted must find the same keys, not start every file over (and a finished send re-run must
    # still be "complete", not "exists").
    import transfer.source as source_module

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "w.bin").write_bytes(os.urandom(4096))
    before, _ = source_module.scan([tmp_path / "ckpt"], 1 << 20)
    real_stat = os.stat

    def stat_on_another_mount(path: object, *args: object, **kwargs: object) -> os.stat_result:
        st = real_stat(path, *args, **kwargs)  # type: ignore[arg-type]
        fields = list(st)
        fields[2] = st.st_dev + 7  # st_dev
        return os.stat_result(fields, {"st_mtime_ns": st.st_mtime_ns, "st_ctime_ns": st.st_ctime_ns})

    monkeypatch.setattr(source_module.os, "stat", stat_on_another_mount)
    after, files = source_module.scan([tmp_path / "ckpt"], 1 << 20)
    assert files[0].dev == real_stat(tmp_path / "ckpt" / "w.bin").st_dev + 7  # the stub took effect
    assert [f.key for f in after.files] == [f.key for f in before.files]
    assert [f.ident for f in after.files] == [f.ident for f in before.files]


def test_a_retry_for_given_also_waits_for_a_receiver_not_up_yet(tmp_path: Path) -> None:
    # CI starts the sender before the receiver's pod is up: `--retry-for 40` said "keep
    # reconnecting for 40 s" and gave up after ~10 s ("gave up after 11s ... Connection refused")
    from xfer_kit import free_port

    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "a.bin").write_bytes(os.urandom(100_000))
    port = free_port()
    sender = subprocess.Popen(
        rq_cmd("send", str(tmp_path / "ck"), f"rq://127.0.0.1:{port}", "--transport", "tcp"),
        env=rq_env(RQ_SEND_RETRY_FOR="40"),  # as a CI job's environment gives it
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    recv = Recv(tmp_path / "dest", tmp_path / "certs", "tcp", "--once", port=port)
    try:
        try:
            sender.wait(timeout=12)  # past the 10 s a sender gives a receiver that never answered
        except subprocess.TimeoutExpired:
            pass
        assert sender.poll() is None, sender.communicate()[1].decode()
        recv.start()
        _, err = sender.communicate(timeout=60)
        assert sender.returncode == 0, err.decode()
        assert (tmp_path / "dest" / "ck" / "a.bin").read_bytes() == (tmp_path / "ck" / "a.bin").read_bytes()
    finally:
        sender.kill()
        sender.wait()
        recv.stop()
