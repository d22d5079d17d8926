"""RAM tiers left in /dev/shm by deleted caches: found, removed, and never taken from a live cache.

These use the real /dev/shm and rq's default RAM roots (named after each test's cache dir), and
only ever remove the root the test made.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import random_files, run_rq

from cache import Cache, orphans
from cache.layout import default_ram_root

pytestmark = pytest.mark.skipif(not orphans.SHM.is_dir(), reason="no /dev/shm")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return random_files(tmp_path / "src", 3, 10_000, suffix=".bin")


@pytest.fixture
def cache_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "cache"
    yield d
    shutil.rmtree(default_ram_root(d), ignore_errors=True)


def fill_ram_tier(cache_dir: Path, src: Path) -> Path:
    c = Cache(cache_dir)
    c.preload([str(src)], tier="ram")
    root = c.layout.ram_root
    c.close()
    del c
    return root


def listed(root: Path, min_age: float = 0) -> orphans.RamRoot | None:
    return next((r for r in orphans.find(min_age=min_age) if r.path == root), None)


def age(root: Path, seconds: float) -> None:
    past = time.time() - seconds
    for dirpath, _dirs, files in os.walk(root):
        for name in [*files, "."]:
            os.utime(os.path.join(dirpath, name), (past, past), follow_symlinks=False)


def test_a_deleted_caches_ram_tier_is_listed_and_removed(cache_dir: Path, src: Path) -> None:
    root = fill_ram_tier(cache_dir, src)
    assert orphans.read_owner(root) == cache_dir.resolve()
    assert listed(root) is None  # its cache is still there
    shutil.rmtree(cache_dir)
    found = listed(root)
    assert found is not None and found.state == "orphan" and found.owner == cache_dir.resolve()
    assert found.size == 30_000
    assert orphans.remove(found, min_age=0)
    assert not root.exists()
    assert not any(p.name.startswith(f".{root.name}.") for p in orphans.SHM.iterdir())


def test_a_ram_tier_in_use_is_never_an_orphan_even_without_its_cache_dir(cache_dir: Path, src: Path) -> None:
    root = fill_ram_tier(cache_dir, src)
    reader = Cache(cache_dir)  # a live process still using the cache when someone rm -rf's it
    shutil.rmtree(cache_dir)
    assert listed(root) is None
    stale = orphans.RamRoot(root, cache_dir.resolve(), 30_000, "orphan")
    assert not orphans.remove(stale, min_age=0)
    assert len(list((root / "objects").rglob("*.bin"))) == 3
    del reader
    assert listed(root) is not None


def test_a_forked_worker_keeps_the_ram_tier_held_after_its_parent_lets_go(cache_dir: Path, src: Path) -> None:
    root = fill_ram_tier(cache_dir, src)
    c = Cache(cache_dir)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: holds the inherited descriptor until the test says go
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    try:
        c.close()  # the parent lets go; the worker's copy of the descriptor still holds the lock
        assert (os.getpid(), root) not in orphans._holds
        shutil.rmtree(cache_dir)
        assert listed(root) is None
    finally:
        os.write(write, b"x")
        os.close(write)
        os.waitpid(pid, 0)
    assert listed(root) is not None


def test_a_recently_changed_ram_tier_is_left_alone(cache_dir: Path, src: Path) -> None:
    root = fill_ram_tier(cache_dir, src)
    shutil.rmtree(cache_dir)
    assert listed(root, min_age=60) is None
    age(root, 120)
    assert listed(root, min_age=60) is not None


def move_filled_cache(cache_dir: Path, src: Path) -> tuple[Path, Path]:
    """(its RAM root, where it went): a cache with a filled RAM tier, moved with `mv`."""
    root = fill_ram_tier(cache_dir, src)
    moved = cache_dir.with_name("moved")
    os.rename(cache_dir, moved)
    return root, moved


def test_a_moved_cache_claims_its_ram_tier_on_its_next_open(cache_dir: Path, src: Path) -> None:
    root, moved = move_filled_cache(cache_dir, src)
    assert listed(root) is not None  # until the cache is opened at its new place
    Cache(moved).close()
    assert orphans.read_owner(root) == moved.resolve()
    assert listed(root) is None
    with Cache(moved) as c:
        assert c.stat(str(src / "0.bin")).tier == "ram"


def test_a_ram_tier_without_an_owner_is_listed_but_never_removed(cache_dir: Path, src: Path) -> None:
    root = fill_ram_tier(cache_dir, src)
    os.unlink(root / orphans.OWNER_NAME)  # as an older rq left it
    found = listed(root)
    assert found is not None and found.state == "unclaimed" and found.owner is None
    assert not orphans.remove(found, min_age=0)
    assert len(list((root / "objects").rglob("*.bin"))) == 3


def test_an_empty_ram_tier_without_an_owner_is_removed(tmp_path: Path) -> None:
    root = default_ram_root(tmp_path / "never-a-cache")
    (root / "objects").mkdir(parents=True, mode=0o700)
    try:
        found = listed(root)
        assert found is not None and found.state == "empty"
        assert orphans.remove(found, min_age=0)
        assert not root.exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_cache_opening_while_its_ram_tier_is_removed_makes_a_fresh_one(cache_dir: Path, src: Path) -> None:
    """The remover holds the exclusive lock and renames the root away; a Cache opening meanwhile
    waits on the lock, then finds the path replaced and makes a new root rather than use the old."""
    root = fill_ram_tier(cache_dir, src)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as orphans.remove holds it
    opened: list[Cache] = []
    opener = threading.Thread(target=lambda: opened.append(Cache(cache_dir)))
    opener.start()
    time.sleep(0.3)
    assert not opened  # waiting for the lock
    trash = root.with_name(f".{root.name}.test-trash")
    os.rename(root, trash)
    os.close(fd)
    opener.join(60)
    try:
        assert opened, "Cache() did not come back"
        c = opened[0]
        assert root.is_dir() and (root / "objects").is_dir()
        fd = orphans._holds[(os.getpid(), root)][0]
        assert os.fstat(fd).st_ino == os.lstat(root).st_ino
        # its old entries' files went with the old root: reading one fetches it again
        with c.open(str(src / "1.bin")) as f:
            assert f.read() == (src / "1.bin").read_bytes()
        c.close()
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def test_rq_cache_orphans_lists_and_removes_and_doctor_warns(cache_dir: Path, src: Path) -> None:
    root = fill_ram_tier(cache_dir, src)
    shutil.rmtree(cache_dir)
    age(root, 7200)  # older than --min-age 3600; other roots on this machine are left to their owners

    out = run_rq("cache", "orphans", "--min-age", "3600", "--json")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    ours = [e for e in lines if e.get("path") == str(root)]
    assert ours == [
        {
            "event": "ram_tier",
            "path": str(root),
            "cache_dir": str(cache_dir.resolve()),
            "bytes": 30_000,
            "state": "orphan",
            "removed": False,
        }
    ]
    assert root.exists()

    doctor = run_rq("doctor", "--json")
    finding = next(
        e for e in map(json.loads, doctor.stdout.splitlines()) if e.get("check") == "cache-ram-orphans"
    )
    assert finding["status"] == "warn" and "rq cache orphans --remove" in json.dumps(finding)

    out = run_rq("cache", "orphans", "--min-age", "3600", "--remove")
    assert out.returncode == 0, out.stderr
    assert f"removed  {root}" in out.stdout.decode()
    assert not root.exists()


def test_a_cache_dir_whose_name_ends_in_spaces_or_a_newline_is_not_taken_for_gone(
    tmp_path: Path, src: Path
) -> None:
    for name in ("c1 ", "c2\n", "c3\t \n"):
        d = tmp_path / name
        root = fill_ram_tier(d, src)
        try:
            assert orphans.read_owner(root) == d.resolve()
            assert listed(root) is None
        finally:
            shutil.rmtree(root, ignore_errors=True)


def test_an_interrupted_removal_is_found_and_finished(cache_dir: Path, src: Path) -> None:
    root = fill_ram_tier(cache_dir, src)
    shutil.rmtree(cache_dir)
    trash = root.with_name(f".{root.name}.removing.{os.urandom(8).hex()}")
    os.rename(root, trash)  # where a remover killed during its rmtree stops
    try:
        found = next((r for r in orphans.find(min_age=0) if r.path == trash), None)
        assert found is not None and found.state == "removing" and found.size == 30_000
        assert orphans.remove(found)
        assert not trash.exists()
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def test_an_owner_that_cannot_be_looked_at_counts_as_claimed(
    cache_dir: Path, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fill_ram_tier(cache_dir, src)
    real_stat = os.stat
    inside = str(cache_dir.resolve())

    def denied(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(path).startswith(inside):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", denied)
    assert listed(root) is None


def test_many_cache_objects_share_one_descriptor(cache_dir: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    caches = [Cache(cache_dir) for _ in range(100)]
    assert len(os.listdir("/proc/self/fd")) - before <= 2
    for c in caches:
        c.close()
    assert (os.getpid(), caches[0].layout.ram_root) not in orphans._holds


def test_a_new_cache_at_a_moved_caches_old_path_gets_its_own_root(cache_dir: Path, src: Path) -> None:
    root, moved = move_filled_cache(cache_dir, src)
    with Cache(moved) as old:
        with Cache(cache_dir) as new:
            assert new.layout.ram_root != root
            new.preload([str(src)], tier="ram")
            new_root = new.layout.ram_root
        try:
            assert len(list((root / "objects").rglob("*.bin"))) == 3
            assert old.verify() == (3, [])
        finally:
            shutil.rmtree(new_root, ignore_errors=True)


def test_min_age_must_be_a_number_of_seconds() -> None:
    out = run_rq("cache", "orphans", "--min-age", "nan")
    assert out.returncode == 2 and b"nan" in out.stderr


def test_json_names_an_owner_path_that_is_not_utf8(tmp_path: Path, src: Path) -> None:
    d = Path(os.fsdecode(os.fsencode(tmp_path) + b"/c\xff"))
    root = fill_ram_tier(d, src)
    try:
        shutil.rmtree(d)
        age(root, 7200)
        out = run_rq("cache", "orphans", "--min-age", "3600", "--json")
        assert out.returncode == 0, out.stderr
        ours = [e for e in map(json.loads, out.stdout.splitlines()) if e.get("path") == str(root)]
        assert ours and ours[0]["cache_dir"] == f"{tmp_path}/c\\xff"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_ram_root_others_can_write_is_listed_as_unclaimed_and_kept(tmp_path: Path) -> None:
    root = default_ram_root(tmp_path / "older-rq")
    (root / "objects").mkdir(parents=True)
    os.chmod(root, 0o775)  # as an older rq made it under umask 002
    (root / "objects" / "blob").write_bytes(b"x" * 1000)
    (root / orphans.OWNER_NAME).write_bytes(b"/nonexistent/planted-by-a-group-member\n")
    try:
        found = listed(root)
        assert found is not None and found.state == "unclaimed" and found.owner is None
        assert not orphans.remove(found, min_age=0)
        assert (root / "objects" / "blob").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


OPEN_AT_GO = """
import os, sys, time
from cache import Cache
while not os.path.exists(sys.argv[2]):
    time.sleep(0.001)
c = Cache(sys.argv[1])
print(c.layout.ram_root)
c.close()
"""


def open_together(cache_dir: Path, n: int) -> list[subprocess.CompletedProcess[str]]:
    """`n` processes that each open Cache(cache_dir) at the same moment and print its RAM root."""
    go = cache_dir.with_name("go")
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AT_GO, str(cache_dir), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    time.sleep(0.5)  # all started and waiting
    go.touch()
    done = []
    for w in workers:
        out, err = w.communicate(timeout=60)
        done.append(subprocess.CompletedProcess(w.args, w.returncode, out, err))
    go.unlink()
    return done


def test_processes_opening_a_new_cache_together_all_open_it(cache_dir: Path) -> None:
    """SQLite refuses the switch to WAL at once while another process makes the same new index."""
    done = open_together(cache_dir, 6)
    assert [d.stderr for d in done if d.returncode] == []
    assert {d.stdout.strip() for d in done} == {str(default_ram_root(cache_dir))}


def test_two_processes_making_a_new_cache_at_a_moved_caches_path_agree_on_its_root(
    cache_dir: Path, src: Path
) -> None:
    """Both compute the same next name, so neither lands files in a root the index does not name."""
    root, moved = move_filled_cache(cache_dir, src)
    Cache(moved).close()
    try:
        done = open_together(cache_dir, 2)
        assert [d.stderr for d in done if d.returncode] == []
        roots = {d.stdout.strip() for d in done}
        with Cache(cache_dir) as c:
            recorded = c.layout.ram_root
        assert roots == {str(recorded)} and recorded == default_ram_root(cache_dir, 1) != root
    finally:
        shutil.rmtree(default_ram_root(cache_dir, 1), ignore_errors=True)


def test_the_remove_hint_does_not_promise_unclaimed_roots(tmp_path: Path, src: Path) -> None:
    """`rq cache orphans` ended "remove them with: rq cache orphans --remove" with an unclaimed
    root among those listed, which --remove never takes (found by a version-skew review)."""
    gone, old = tmp_path / "gone", tmp_path / "old"
    roots = [fill_ram_tier(gone, src), fill_ram_tier(old, src)]
    try:
        shutil.rmtree(gone)  # an orphan: its cache is deleted
        os.unlink(roots[1] / orphans.OWNER_NAME)  # unclaimed: as an older rq left it
        for root in roots:
            age(root, 7200)
        out = run_rq("cache", "orphans", "--min-age", "3600")
        assert out.returncode == 0, out.stderr
        text = (out.stdout + out.stderr).decode()
        assert "remove them with" not in text, text
        assert "that are not unclaimed with: rq cache orphans --remove" in text, text
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
