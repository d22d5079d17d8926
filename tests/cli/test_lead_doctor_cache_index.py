"""`rq doctor --cache-dir D` said `cache-disk ok` for a cache whose index a newer rq wrote, which
every `rq cache` command refuses (exit 10), and its `cache-ram` line named the default RAM root, not
the one the index records (found by a version-skew review). A real cache, then its index's
user_version raised as a newer rq would leave it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from cache import Cache
from rqcli.commands.doctor import _index_facts, check_index_version, check_ram_tier, run_checks


def _cache(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a" * 100)
    ram = tmp_path / "shm" / "private-ram"
    with Cache(tmp_path / "c", ram_dir=ram) as c:
        c.preload([str(src) + "/"], tier="disk")
    return tmp_path / "c", ram


def test_an_index_from_a_newer_rq_is_warned_of_and_an_ordinary_one_passes(tmp_path: Path) -> None:
    cache_dir, ram = _cache(tmp_path)
    version, root = _index_facts(cache_dir)
    assert version == 1 and root == ram
    assert check_index_version(cache_dir, version).status == "ok"
    db = sqlite3.connect(cache_dir / "index.sqlite3")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    version, _ = _index_facts(cache_dir)
    assert version == 2
    finding = check_index_version(cache_dir, version)
    assert (
        finding.status == "warn" and "newer than this rq's" in finding.detail and "exit 10" in finding.detail
    )


def test_the_ram_line_names_the_root_the_index_records(tmp_path: Path) -> None:
    cache_dir, ram = _cache(tmp_path)
    _, root = _index_facts(cache_dir)
    (finding, *_) = check_ram_tier(cache_dir, tmp_path / "shm", ram_root=root)
    assert str(ram) in finding.detail, finding.detail


def test_no_index_no_facts(tmp_path: Path) -> None:
    assert _index_facts(tmp_path / "none") == (None, None)


def test_an_index_that_cannot_be_read_is_warned_of(tmp_path: Path) -> None:
    """A damaged index got no finding at all and doctor exited 0, while every rq cache command
    refused the cache (a second diff review)."""
    cache_dir, _ = _cache(tmp_path)
    (cache_dir / "index.sqlite3").write_bytes(b"not a database" * 100)
    for name in ("index.sqlite3-wal", "index.sqlite3-shm"):
        (cache_dir / name).unlink(missing_ok=True)
    findings = [
        f for f in run_checks(None, None, "nats://127.0.0.1:9", cache_dir) if f.check == "cache-index"
    ]
    assert [f.status for f in findings] == ["warn"] and "cannot be read" in findings[0].detail
