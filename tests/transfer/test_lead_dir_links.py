"""Symlinks to directories under a directory SOURCE. Skipped by default with a warning that names
the flag (cp -r copies the link, not the tree); `--follow-symlinks` sends the tree under the link's
name, as cp -rL and rsync -L do, and skips a link back to a directory above it (a loop). Before,
they were skipped even with --follow-symlinks: `rq send --follow-symlinks ckpt/` whose shards/ is a
link to another disk sent everything but the shards."""

from __future__ import annotations

import os
from pathlib import Path

from xfer_kit import Recv, send, summary

from transfer.source import Skipped, scan


def _ckpt(tmp_path: Path) -> Path:
    shards = tmp_path / "nvme" / "shards"
    (shards / "deep").mkdir(parents=True)
    (shards / "s0.bin").write_bytes(os.urandom(70_000))
    (shards / "deep" / "s1.bin").write_bytes(b"one")
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "meta.json").write_bytes(b"{}")
    (src / "shards").symlink_to(shards)  # a directory on another disk
    (src / "sub" / "loop").symlink_to("..")  # back to ckpt itself
    (shards / "back").symlink_to(src)  # from the followed tree back to SOURCE: a loop too
    return src


def _scan(src: Path, follow: bool) -> tuple[list[str], dict[str, str]]:
    skipped: list[Skipped] = []
    manifest, _ = scan([src], 1 << 20, skipped, follow_symlinks=follow)
    return sorted(f.name for f in manifest.files), {s.path.name: s.reason for s in skipped}


def test_directory_links_are_skipped_with_a_hint_by_default(tmp_path: Path) -> None:
    names, skipped = _scan(_ckpt(tmp_path), follow=False)
    assert names == ["ckpt/meta.json"], names
    assert skipped["shards"] == "symlink to a directory (--follow-symlinks sends its tree)", skipped


def test_follow_symlinks_sends_the_tree_and_skips_loops(tmp_path: Path) -> None:
    names, skipped = _scan(_ckpt(tmp_path), follow=True)
    assert names == ["ckpt/meta.json", "ckpt/shards/deep/s1.bin", "ckpt/shards/s0.bin"], names
    loop = "symlink to a directory that contains it (a loop): not followed"
    assert skipped == {"loop": loop, "back": loop}, skipped


def test_rq_send_follow_symlinks_sends_a_linked_directory(tmp_path: Path) -> None:
    src = _ckpt(tmp_path)
    recv = Recv(tmp_path / "dst", tmp_path / "cert", "tcp", "--once").start()
    try:
        sent = send([src], recv, "--follow-symlinks")
    finally:
        recv.stop()
    assert sent.returncode == 0, sent.stderr
    dest = tmp_path / "dst" / "ckpt"
    assert (dest / "shards" / "s0.bin").read_bytes() == (tmp_path / "nvme" / "shards" / "s0.bin").read_bytes()
    assert (dest / "shards" / "deep" / "s1.bin").read_bytes() == b"one"
    assert not (dest / "shards").is_symlink()
    assert summary(sent)["files"] == 3, summary(sent)
