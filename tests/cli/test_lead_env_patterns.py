"""RQ_PRELOAD_INCLUDE / RQ_PRELOAD_EXCLUDE hold one pattern per line. Click split such a variable at
any white space: RQ_PRELOAD_EXCLUDE='f g.tar' excluded `f` and `g.tar`, and the file named in it was
preloaded, exit 0. And a dry run's failure line counted the objects it would fetch as none ("1 of 1
objects failed" beside two it would fetch)."""

from __future__ import annotations

import json
from pathlib import Path

from rqtest import run_rq


def planned(tmp_path: Path, source: Path, **env: str) -> tuple[int, list[str]]:
    r = run_rq(
        "preload", str(source), "--dry-run", "--json", "--cache-dir", str(tmp_path / "c"),
        env={"RQ_CONFIG": "/dev/null", **env},
    )  # fmt: skip
    lines = [json.loads(line) for line in r.stdout.decode().splitlines()]
    return r.returncode, sorted(Path(e["url"]).name for e in lines if e.get("event") == "plan")


def tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sp ace").mkdir(parents=True)
    for name in ("f g.tar", "f", "g.tar", "sp ace/h.tar"):
        (src / name).write_bytes(b"x")
    return src


def test_an_exclude_from_the_environment_may_hold_a_space(tmp_path: Path) -> None:
    rc, names = planned(tmp_path, tree(tmp_path), RQ_PRELOAD_EXCLUDE="f g.tar")
    # old: ['f g.tar', 'h.tar'] (`f` and `g.tar` excluded, 'f g.tar' not)
    assert rc == 0 and names == ["f", "g.tar", "h.tar"], names


def test_an_include_from_the_environment_takes_one_pattern_per_line(tmp_path: Path) -> None:
    rc, names = planned(tmp_path, tree(tmp_path), RQ_PRELOAD_INCLUDE="f g.tar\nsp ace/*\n")
    # old: ['f', 'g.tar'] (split at the spaces into f, g.tar, sp, ace/*)
    assert rc == 0 and names == ["f g.tar", "h.tar"], names


def test_a_dry_runs_failure_line_counts_what_it_would_fetch(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.tar").write_bytes(b"x")
    (src / "ok2.tar").write_bytes(b"y")
    with open(bytes(src) + b"/\xff.tar", "wb") as f:
        f.write(b"z")
    r = run_rq(
        "preload", str(src), "--dry-run", "--cache-dir", str(tmp_path / "c"), env={"RQ_CONFIG": "/dev/null"}
    )
    # old: "1 of 1 objects failed"
    assert r.returncode == 1 and b"rq: error: 1 of 3 objects failed" in r.stderr, r.stderr


def test_filters_that_leave_nothing_say_an_exclude_wins(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(b"x")
    r = run_rq(
        "preload", str(src), "--dry-run", "--exclude", "*", "--include", "*.tar",
        "--cache-dir", str(tmp_path / "c"), env={"RQ_CONFIG": "/dev/null"},
    )  # fmt: skip
    # old hint: "check the bucket, prefix or path" (the listing had found the object)
    assert r.returncode == 3, r.stderr
    assert b"an --exclude wins over every --include" in r.stderr and b"check the bucket" not in r.stderr
