"""Symlinks to files under a directory SOURCE. Links to files inside SOURCE are sent as those files.
A link out of SOURCE is followed when every link met on the way is yours (or root's): a Hugging
Face snapshot is nothing but links to ../../blobs/…, and skipping every link out of SOURCE sent it
as nothing, verified, exit 0. One made by someone else is not followed (the rule of the kernel's
fs.protected_symlinks): a link to a private key planted by a co-tenant in a shared checkpoint
directory sent the key. --follow-symlinks follows those too. A link re-pointed after the scan is
never read through (the file opened must be the one scanned)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from xfer_kit import REPO, free_port, rq_cmd, rq_env, wait_for

from transfer import source
from transfer.errors import SourceChangedError
from transfer.source import Reader, Skipped, scan

NOBODY = 65534


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


def _snapshot(tmp_path: Path) -> Path:
    """The Hugging Face cache layout: snapshots/<rev>/<file> -> ../../blobs/<digest>."""
    blobs = tmp_path / "hub" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "aaa").write_bytes(os.urandom(50_000))
    (blobs / "bbb").write_bytes(b"{}")
    snap = tmp_path / "hub" / "snapshots" / "rev1"
    (snap / "sub").mkdir(parents=True)
    (snap / "model.safetensors").symlink_to("../../blobs/aaa")
    (snap / "sub" / "config.json").symlink_to("../../../blobs/bbb")
    return snap


def test_links_out_of_source_made_by_someone_else_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _tree(tmp_path)
    monkeypatch.setattr(source, "_trusted_uids", lambda: {os.geteuid() + 1})  # nobody's links are yours
    skipped: list[Skipped] = []
    manifest, files = scan([src], 1 << 20, skipped)
    names = sorted(f.name for f in manifest.files)
    assert names == ["ckpt/alias", "ckpt/sub/up", "ckpt/w.bin"], names
    assert all(sf.path.resolve() != tmp_path / "secret.key" for sf in files)
    why = {s.path.name: s.reason for s in skipped}
    assert set(why) == {"key", "rel"}, why
    assert why["key"].startswith("symlink to ") and "outside SOURCE" in why["key"], why
    assert "not you: not followed (--follow-symlinks sends it)" in why["key"], why
    # --follow-symlinks: followed whoever made them
    manifest, _ = scan([src], 1 << 20, [], follow_symlinks=True)
    assert sorted(f.name for f in manifest.files) == [
        "ckpt/alias",
        "ckpt/rel",
        "ckpt/sub/key",
        "ckpt/sub/up",
        "ckpt/w.bin",
    ]


def test_your_own_links_out_of_source_are_followed_a_hugging_face_snapshot(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path)
    skipped: list[Skipped] = []
    manifest, _ = scan([snap], 1 << 20, skipped)
    assert skipped == []
    assert sorted(f.name for f in manifest.files) == ["rev1/model.safetensors", "rev1/sub/config.json"]
    sizes = {f.name: f.size for f in manifest.files}
    assert sizes["rev1/model.safetensors"] == 50_000


@pytest.mark.skipif(os.geteuid() != 0, reason="making a link owned by another user needs root")
def test_a_foreign_link_further_along_the_chain_stops_it(tmp_path: Path) -> None:
    """Your link to shared/x, where x is someone else's link to your key: not followed."""
    (tmp_path / "secret.key").write_bytes(b"PRIVATE")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "x").symlink_to(tmp_path / "secret.key")
    os.lchown(shared / "x", NOBODY, NOBODY)
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "w.bin").write_bytes(b"w")
    (src / "mine").symlink_to(shared / "x")
    skipped: list[Skipped] = []
    manifest, _ = scan([src], 1 << 20, skipped)
    assert [f.name for f in manifest.files] == ["ckpt/w.bin"]
    assert len(skipped) == 1, skipped
    assert ", through " in skipped[0].reason and "shared/x, made by user nobody" in skipped[0].reason, skipped


def test_a_link_flipped_during_the_scan_is_not_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A co-tenant flips link L between your key and a file inside SOURCE: the scan's stat saw the
    key, the inside/outside check then saw the inside file, and the Reader later opened L pointing
    at the key again, whose inode was the one scanned: the key was sent (dv, 18% of scans)."""
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "w.bin").write_bytes(b"w" * 100)
    secret = tmp_path / "secret.key"
    secret.write_bytes(b"PRIVATE")
    link = src / "L"
    link.symlink_to(secret)
    real = source._regular

    def flipping(path: Path) -> tuple[os.stat_result | None, str | None]:
        out = real(path)
        if path.name == "L":  # stat'ed through the link to the key: now point it inside
            os.unlink(link)
            link.symlink_to("w.bin")
        return out

    monkeypatch.setattr(source, "_regular", flipping)
    skipped: list[Skipped] = []
    manifest, _ = scan([src], 1 << 20, skipped)
    os.unlink(link)
    link.symlink_to(secret)  # and back before it is read
    assert [f.name for f in manifest.files] == ["ckpt/w.bin"]
    assert [s.reason for s in skipped] == [
        "symlink re-pointed while it was being scanned (its target is not sent)"
    ]


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


def _send(tmp_path: Path, src: Path, *extra: str) -> tuple[subprocess.CompletedProcess[bytes], Path]:
    dest = tmp_path / "dst"
    port = free_port()
    args = rq_cmd("recv", str(dest), "--listen", f"127.0.0.1:{port}", "--transport", "tcp", "--once")
    recv = subprocess.Popen(
        [*args, "--cert-dir", str(tmp_path / "cert")], env=rq_env(), cwd=REPO, stderr=subprocess.PIPE
    )
    try:
        assert wait_for(lambda: (dest / ".rq-partial").exists() or recv.poll() is not None, 30)
        sent = subprocess.run(
            rq_cmd("send", str(src), f"rq://127.0.0.1:{port}", "--transport", "tcp", *extra),
            env=rq_env(),
            capture_output=True,
            timeout=60,
            cwd=REPO,
            check=False,
        )
    finally:
        recv.kill()
        recv.wait()
    return sent, dest


def test_rq_send_of_a_hugging_face_snapshot_sends_its_files(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path)
    sent, dest = _send(tmp_path, snap)
    assert sent.returncode == 0, sent.stderr
    blobs = tmp_path / "hub" / "blobs"
    assert (dest / "rev1" / "model.safetensors").read_bytes() == (blobs / "aaa").read_bytes()
    assert (dest / "rev1" / "sub" / "config.json").read_bytes() == b"{}"
    assert not (dest / "rev1" / "model.safetensors").is_symlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a link owned by another user needs root")
@pytest.mark.parametrize("follow", [False, True])
def test_rq_send_skips_a_link_planted_by_another_user_unless_told(tmp_path: Path, follow: bool) -> None:
    src = _tree(tmp_path)
    for link in (src / "sub" / "key", src / "rel"):
        os.lchown(link, NOBODY, NOBODY)
    sent, dest = _send(tmp_path, src, *(["--follow-symlinks"] if follow else []))
    assert sent.returncode == 0, sent.stderr
    err = sent.stderr.decode()
    assert (dest / "ckpt" / "alias").read_bytes() == b"w" * 100
    if follow:
        assert (dest / "ckpt" / "rel").read_bytes() == b"PRIVATE"
        assert (dest / "ckpt" / "sub" / "key").read_bytes() == b"PRIVATE"
        return
    assert "made by user nobody (uid 65534), not you: not followed (--follow-symlinks sends it)" in err, err
    assert not (dest / "ckpt" / "rel").exists() and not (dest / "ckpt" / "sub" / "key").exists()
