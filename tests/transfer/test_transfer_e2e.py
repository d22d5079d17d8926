"""rq send / rq recv end to end: real processes, real TCP and QUIC on loopback."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from xfer_kit import Recv, make_tree, rq_cmd, rq_env, send, summary, tree_digest

pytestmark = pytest.mark.integration

MODES = [
    pytest.param("tcp", (), (), id="tcp"),
    pytest.param("tcp", ("--tls",), (), id="tcp-tls"),
    pytest.param("quic", ("--quic-backend", "aioquic"), ("--quic-backend", "aioquic"), id="quic-aioquic"),
    pytest.param(
        "quic",
        ("--quic-backend", "qh3", "--workers", "2"),
        ("--quic-backend", "qh3", "--connections", "2"),
        id="quic-qh3-2proc-each-side",
    ),
]


@pytest.mark.parametrize("transport,recv_extra,send_extra", MODES)
def test_checkpoint_arrives_identical(
    tmp_path: Path, transport: str, recv_extra: tuple[str, ...], send_extra: tuple[str, ...]
) -> None:
    ckpt = make_tree(tmp_path / "src")
    recv = Recv(tmp_path / "dst", tmp_path / "cert", transport, "--once", *recv_extra).start()
    try:
        proc = send([ckpt], recv, "--chunk-size", "1MiB", *send_extra)
        assert proc.returncode == 0, proc.stderr.decode()
        s = summary(proc)
        rc, out, err = recv.wait()
    finally:
        recv.stop()
    assert rc == 0, err
    assert tree_digest(tmp_path / "dst" / "ckpt") == tree_digest(ckpt)
    assert s["verified"] is True and s["files"] == 4 and s["chunks_resent"] == 0
    assert s["bytes_raw"] == s["bytes_total"] == sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    assert 0 < s["ratio"] < 1  # the bf16 shard compressed, the random one went raw
    leftovers = [
        p.name
        for p in (tmp_path / "dst" / ".rq-partial").iterdir()
        if not p.name.endswith((".done.json", ".journal", ".placed"))
    ]
    # no partial data once complete; what stays is small: the "done" marker, and per file its
    # journal (chunk digests) and placed record, so that a re-run sends only what went missing
    assert leftovers == []
    assert len(list((tmp_path / "dst" / ".rq-partial").glob("*.placed"))) == 4
    done = [json.loads(x) for x in out.splitlines() if '"event":"done"' in x]
    assert done and done[0]["seconds"] == round(done[0]["seconds"], 3)  # like the sender's summary


def test_bf16_weights_compress_on_the_wire(tmp_path: Path) -> None:
    from xfer_kit import bf16

    src = tmp_path / "w.bf16"
    src.write_bytes(bf16(4_000_000, seed=3))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    try:
        s = summary(send([src], recv, "--compress", "auto"))
    finally:
        recv.stop()
    assert s["ratio"] <= 0.70
    assert (tmp_path / "dst" / "w.bf16").read_bytes() == src.read_bytes()


def test_wrong_token_refused_and_receiver_stays_up(tmp_path: Path) -> None:
    ckpt = make_tree(tmp_path / "src", 100_000, 10_000)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "quic", "--quic-backend", "aioquic").start()
    try:
        bad = send([ckpt], recv, "--retry-for", "2", env=rq_env(token="not-the-token"))
        assert bad.returncode == 4, bad.stderr.decode()
        assert "token" in bad.stderr.decode()
        assert not (tmp_path / "dst" / "ckpt").exists()
        good = send([ckpt], recv)
        assert good.returncode == 0, good.stderr.decode()
    finally:
        recv.stop()
    assert tree_digest(tmp_path / "dst" / "ckpt") == tree_digest(ckpt)


@pytest.mark.parametrize(
    "transport,extra",
    [("quic", ("--quic-backend", "aioquic")), ("quic", ("--quic-backend", "qh3")), ("tcp", ("--tls",))],
)
def test_wrong_certificate_pin_refused(tmp_path: Path, transport: str, extra: tuple[str, ...]) -> None:
    ckpt = make_tree(tmp_path / "src", 1000, 1000)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", transport, *extra).start()
    try:
        args = [a if a != recv.pin else "sha256:" + "ab" * 32 for a in recv.send_args()]
        proc = subprocess.run(
            rq_cmd("send", str(ckpt), recv.url, *args, *extra, "--retry-for", "2"),
            env=rq_env(),
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        recv.stop()
    assert proc.returncode == 4, proc.stderr.decode()
    assert "pin" in proc.stderr.decode() or "certificate" in proc.stderr.decode()
    assert not (tmp_path / "dst" / "ckpt").exists()


def test_existing_file_needs_overwrite(tmp_path: Path) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(200_000))
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "model.bin").write_bytes(b"keep me")
    recv = Recv(dst, tmp_path / "cert", "tcp").start()
    try:
        proc = send([src], recv)
        assert proc.returncode == 9, proc.stderr.decode()
        assert (dst / "model.bin").read_bytes() == b"keep me"
    finally:
        recv.stop()
    recv = Recv(dst, tmp_path / "cert", "tcp", "--overwrite", "--once").start()
    try:
        assert send([src], recv).returncode == 0
    finally:
        recv.stop()
    assert (dst / "model.bin").read_bytes() == src.read_bytes()


def test_same_source_twice_is_sent_once_and_limits_get_their_own_hint(tmp_path: Path) -> None:
    """`rq send f f` ended in exit 1 ("two sources would both be sent as"); it sends f once. A
    manifest over the receiver's --max-files said "free space on the receiver": it names the flags."""
    one, two = tmp_path / "one.bin", tmp_path / "two.bin"
    one.write_bytes(os.urandom(50_000))
    two.write_bytes(os.urandom(50_000))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--max-files", "1").start()
    try:
        proc = send([one, one], recv)
        assert proc.returncode == 0, proc.stderr.decode()
        assert "given more than once" in proc.stderr.decode()
        assert summary(proc)["files"] == 1
        proc = send([one, two], recv)
        err = proc.stderr.decode()
        assert proc.returncode == 7, err
        assert "--max-files" in err and "free space" not in err, err
    finally:
        recv.stop()
    assert (tmp_path / "dst" / "one.bin").read_bytes() == one.read_bytes()


def test_setuid_bits_from_sender_are_dropped(tmp_path: Path) -> None:
    src = tmp_path / "tool"
    src.write_bytes(b"#!/bin/sh\n")
    os.chmod(src, 0o4755)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    try:
        assert send([src], recv).returncode == 0
    finally:
        recv.stop()
    mode = (tmp_path / "dst" / "tool").stat().st_mode
    assert mode & 0o7000 == 0 and mode & 0o700 == 0o700


def test_rdma_without_device_is_unsupported(tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"x")
    proc = subprocess.run(
        rq_cmd("send", str(src), "rq://127.0.0.1:9", "--transport", "rdma"),
        env=rq_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 10, proc.stderr.decode()
    assert proc.stderr.decode().count("\n") == 1


def test_missing_token_and_source_errors(tmp_path: Path) -> None:
    env = {k: v for k, v in rq_env().items() if k != "RQ_TOKEN"}
    proc = subprocess.run(
        rq_cmd(
            "send",
            str(tmp_path),
            "rq://127.0.0.1:9",
            "--transport",
            "tcp",
            "--token-file",
            str(tmp_path / "nope"),
        ),
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 4 and "token" in proc.stderr.decode()
    proc = subprocess.run(
        rq_cmd("send", str(tmp_path / "missing"), "rq://127.0.0.1:9", "--transport", "tcp"),
        env=rq_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3
    proc = subprocess.run(
        rq_cmd("send", str(tmp_path), "rq://127.0.0.1:9", "--transport", "tcp", "--retry-for", "0"),
        env=rq_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 6, proc.stderr.decode()


@pytest.mark.parametrize("backend", ["aioquic", "qh3"])
def test_quic_to_a_closed_port_says_why(tmp_path: Path, backend: str) -> None:
    """The QUIC libraries fail a connect with a bare exception: the line once read "over QUIC: —"."""
    pin = "sha256:" + "a" * 64
    proc = subprocess.run(
        rq_cmd("send", "/etc/hostname", "rq://127.0.0.1:9", "--transport", "quic", "--quic-backend", backend,
               "--pin", pin, "--retry-for", "0"),
        env=rq_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 6, err
    assert "over QUIC: —" not in err and ("handshake" in err or "no answer" in err or "unreachable" in err), (
        err
    )


def test_token_file_created_private(tmp_path: Path) -> None:
    token_file = tmp_path / "tok"
    env = {k: v for k, v in rq_env().items() if k != "RQ_TOKEN"}
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--token-file", str(token_file), env=env).start()
    try:
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert len(token_file.read_text().strip()) >= 32
        assert str(token_file) in recv.info["send"]
        src = tmp_path / "f"
        src.write_bytes(b"hello")
        proc = subprocess.run(
            rq_cmd("send", str(src), recv.url, "--transport", "tcp", "--token-file", str(token_file)),
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        recv.stop()


def test_rerun_after_success_is_a_no_op_not_a_conflict(tmp_path: Path) -> None:
    """A sender killed after the receiver committed (before it read DONE) re-runs the same command:
    the receiver remembers the finished transfer and says so, instead of refusing existing files."""
    ckpt = make_tree(tmp_path / "src", 200_000, 10_000)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    try:
        assert send([ckpt], recv).returncode == 0
        again = send([ckpt], recv)
        assert again.returncode == 0, again.stderr.decode()
        assert summary(again)["bytes_raw"] == 0 and summary(again)["verified"] is True
        (tmp_path / "dst" / "ckpt" / "index.json").unlink()  # gone since: it must be sent again
    finally:
        recv.stop()
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--overwrite", "--once").start()
    try:
        proc = send([ckpt], recv)
        assert proc.returncode == 0, proc.stderr.decode()
        # only the file that went missing moves (test_resume_gaps.py)
        assert summary(proc)["bytes_raw"] == (ckpt / "index.json").stat().st_size
    finally:
        recv.stop()
    assert tree_digest(tmp_path / "dst" / "ckpt") == tree_digest(ckpt)


def _few_fds() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (96, 96))


def test_many_files_with_few_file_descriptors(tmp_path: Path) -> None:
    """Hundreds of shards must not need a descriptor each on either side (both run with a 96-fd limit)."""
    src = tmp_path / "shards"
    src.mkdir()
    for i in range(600):
        (src / f"shard-{i:05d}.bin").write_bytes(os.urandom(100 + i * 37))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once", preexec=_few_fds).start()
    try:
        proc = subprocess.run(
            rq_cmd("send", str(src), recv.url, *recv.send_args(), "--json", "--streams", "4"),
            env=rq_env(),
            capture_output=True,
            timeout=120,
            check=False,
            preexec_fn=_few_fds,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        rc, _, err = recv.wait()
        assert rc == 0, err
    finally:
        recv.stop()
    assert tree_digest(tmp_path / "dst" / "shards") == tree_digest(src)


def _twenty_fds() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20))


def test_a_receiver_out_of_descriptors_is_retried_not_a_refusal(tmp_path: Path) -> None:
    """Found by a review: EMFILE opening a .part was sent as an ERROR ("receiver cannot write"),
    and the sender gave up at once; running out of descriptors is a moment's trouble."""
    src = tmp_path / "shards"
    src.mkdir()
    for i in range(300):
        (src / f"s{i:04d}.bin").write_bytes(os.urandom(50 + i))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once", preexec=_twenty_fds).start()
    try:
        proc = subprocess.run(
            rq_cmd("send", str(src), recv.url, *recv.send_args(), "--streams", "8", "--retry-for", "60"),
            env=rq_env(),
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        assert recv.wait()[0] == 0
    finally:
        recv.stop()
    assert tree_digest(tmp_path / "dst" / "shards") == tree_digest(src)


@pytest.mark.slow
def test_recv_once_exits_only_after_done_reached_the_sender(tmp_path: Path) -> None:
    """`rq recv --once` used to exit right after sending DONE; over QUIC the DONE could die with it and
    the sender retried a gone receiver. Several back-to-back rounds on one port must all succeed."""
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(6 << 20))
    port = 0
    for i in range(4):
        recv = Recv(
            tmp_path / f"dst{i}", tmp_path / "cert", "quic", "--once", "--quic-backend", "qh3", port=port
        )
        recv.start()
        port = recv.port
        try:
            proc = send([src], recv, "--retry-for", "3", "--quic-backend", "qh3")
            assert proc.returncode == 0, proc.stderr.decode()
            rc, _, err = recv.wait(20)
            assert rc == 0, err
        finally:
            recv.stop()
        assert (tmp_path / f"dst{i}" / "model.bin").read_bytes() == src.read_bytes()


def _twenty_four_fds() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (24, 24))


def test_a_sender_out_of_descriptors_says_so_not_that_a_file_changed(tmp_path: Path) -> None:
    """EMFILE opening a source file was SourceChangedError: exit 5, "<file> cannot be read any
    more", though the file was fine and a re-run under the same limit failed the same way (pk).
    It is the open-files limit, said as such, exit 1."""
    src = tmp_path / "tree"
    for d in range(6):
        (src / str(d)).mkdir(parents=True)
        for i in range(50):
            (src / str(d) / f"f{i:02d}").write_bytes(os.urandom(500))
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp").start()
    try:
        proc = subprocess.run(
            rq_cmd("send", str(src), recv.url, *recv.send_args(), "--connections", "8"),
            env=rq_env(), capture_output=True, timeout=120, check=False, preexec_fn=_twenty_four_fds,
        )  # fmt: skip
    finally:
        recv.stop()
    err = proc.stderr.decode()
    assert proc.returncode == 1, err  # 5 before
    assert "Too many open files" in err and "ran out of open files (limit 24)" in err, err
