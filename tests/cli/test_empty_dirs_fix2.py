"""An empty directory or address (`--cache-dir "$DIR"` with DIR unset) is refused (review round fix2).

To the OS '' is the current directory: `--cache-dir ""` made a cache in the working directory (the
summary said "cache_dir": "."), `--topics-dir ""` a topic, `--cert-dir ""` the receiver's
certificate; `--listen ""` listened on 127.0.0.1:7420. Every other empty argument was already
refused as "(an unset variable?)"."""

from __future__ import annotations

from pathlib import Path

import pytest
from rqtest import run_rq

from rqcli.exitcodes import ExitCode


@pytest.mark.parametrize(
    "args",
    [
        ["preload", "SRC", "--cache-dir", ""],
        ["cache", "du", "--cache-dir", ""],
        ["doctor", "--cache-dir", ""],
        ["produce", "t", "--topics-dir", ""],
        ["tail", "t", "--topics-dir", ""],
        ["recv", "DEST", "--listen", "127.0.0.1:0", "--cert-dir", ""],
        ["recv", "DEST", "--listen", ""],
        ["send", "SRC", "rq://127.0.0.1:1", "--token-file", ""],
    ],
    ids=lambda a: f"{a[0]}{a[-2]}",
)
def test_an_empty_directory_or_address_is_refused(tmp_path: Path, args: list[str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"a")
    args = [
        str(tmp_path / "src") if a == "SRC" else str(tmp_path / "dest") if a == "DEST" else a for a in args
    ]
    env = {"RQ_CACHE_DIR": str(tmp_path / "cache"), "RQ_TOPICS_DIR": str(tmp_path / "topics")}
    res = run_rq(*args, input=b"1\n", env=env, cwd=work, timeout=60)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert b"an empty string (an unset variable?)" in res.stderr and res.stderr.count(b"\n") == 1
    assert list(work.iterdir()) == []  # nothing made in the working directory


def test_an_empty_cache_dir_in_the_config_file_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[preload]\ncache-dir = ""\n')
    res = run_rq("--config", str(cfg), "preload", str(tmp_path), "--dry-run", cwd=tmp_path)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert f"config file {cfg}: [preload] cache-dir: an empty string".encode() in res.stderr
