"""`rq cache ls|evict|pin PATTERN` reads a PATTERN without wildcards or its trailing slash as
`rq preload` reads such a SOURCE: the entry of that name and what is under it. After
`rq preload /data/set`, `rq cache ls /data/set` said "no cached entry matches" (exit 3)."""

from __future__ import annotations

from pathlib import Path

from rqtest import run_rq


def test_a_pattern_without_its_slash_is_what_preload_took(tmp_path: Path) -> None:
    src = tmp_path / "set"
    (src / "x").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a")
    (src / "x" / "b.bin").write_bytes(b"b")
    (tmp_path / "settle.bin").write_bytes(b"c")  # a sibling whose name starts the same
    cache = ["--cache-dir", str(tmp_path / "c")]
    env = {"RQ_CONFIG": "/dev/null"}
    assert run_rq("preload", str(src), str(tmp_path / "settle.bin"), *cache, env=env).returncode == 0
    ls = run_rq("cache", "ls", str(src), *cache, env=env)
    # old: exit 3, "no cached entry matches …/set"
    assert ls.returncode == 0, ls.stderr
    assert sorted(line.split()[-1] for line in ls.stdout.decode().splitlines()) == [
        f"{src}/a.bin",
        f"{src}/x/b.bin",
    ]
    assert run_rq("cache", "evict", f"{src}/x", *cache, env=env).returncode == 0
    left = run_rq("cache", "ls", *cache, env=env).stdout.decode()
    assert f"{src}/a.bin" in left and "settle.bin" in left and "b.bin" not in left, left
