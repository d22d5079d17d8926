"""Two rq processes landing into one RAM file system at once (its cap set above what the file
system holds). Each looked at the file system's free space alone (statvfs), which counts only
bytes already written: a landing of the other process that had reserved its room but not written
it yet was invisible, so both took the same free room, and one met ENOSPC after its download and
fetched the object again. The room is now reserved in the index transaction that holds the
space, counting every live process's landings in flight (what they have still to write); a
process that died counts for nothing (docs/cache.md, "A full RAM file system")."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cachekit import assert_consistent, local_source, summary
from rqtest import small_tmpfs

pytestmark = pytest.mark.integration

SIZE = 300_000  # (+1: local_source) eight of one source fit the 4 MiB file system, sixteen do not

# run in each rq process: every copy from the origin is logged (a second copy of one object is a
# download thrown away); with GATE set, copies wait until that file exists (the landing has its
# room reserved and nothing written; 60 s at most); with MARK set, that file is made when a
# reservation starts. A reservation waits up to 60 s (10 s in rq) for landings in flight to land:
# on a loaded runner the first run's eight landings may take longer than 10 s once the gate opens
SETUP = """
import os, time
import cache.origins as O, cache.store as S
_copy, _reserve = O.LocalOrigin._copy, S.Store.reserve
def copy(self, info, landing, piece):
    gate = os.environ.get("GATE")
    t = time.monotonic()
    while gate and not os.path.exists(gate) and time.monotonic() - t < 60:
        time.sleep(0.01)
    with open(os.environ["LOG"], "a") as f:
        f.write(info.url + "\\n")
    return _copy(self, info, landing, piece)
def reserve(self, tier, specs, patience=60.0):
    if os.environ.get("MARK") and specs:
        open(os.environ["MARK"], "a").close()
    return _reserve(self, tier, specs, patience)
O.LocalOrigin._copy, S.Store.reserve = copy, reserve
"""


@pytest.fixture
def ram_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / f"shm-{uuid.uuid4().hex[:6]}", "4m") as mnt:
        yield mnt


def _rq(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    code = f"{SETUP}\nimport sys\nsys.argv[0] = 'rq'\nfrom rqcli.console import main\nmain()\n"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env={**os.environ, "CI": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wait(pred: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.01)


def test_two_preloads_into_one_ram_file_system_never_take_the_same_room(tmp_path: Path, ram_fs: Path) -> None:
    from cache import Cache

    cache_dir = tmp_path / "cache"
    Cache(cache_dir, ram_dir=ram_fs / "ram", ram_limit="1G", disk_limit="1G").close()
    a, b = local_source(tmp_path / "a", 8, SIZE), local_source(tmp_path / "b", 8, SIZE)
    gate, mark, log = tmp_path / "gate", tmp_path / "mark", tmp_path / "log"
    log.write_text("")
    env = {"RQ_CACHE_DIR": str(cache_dir), "LOG": str(log)}
    first = _rq({**env, "GATE": str(gate)}, "preload", str(a), "--tier", "ram", "--json")
    try:
        import sqlite3

        def held() -> int:
            with sqlite3.connect(cache_dir / "index.sqlite3") as db:
                return int(db.execute("SELECT COUNT(*) FROM holds WHERE kind = 'landing'").fetchone()[0])

        _wait(lambda: held() >= 8, 30, "the first run's eight reservations")  # nothing written yet
        second = _rq({**env, "MARK": str(mark)}, "preload", str(b), "--tier", "ram", "--json")
        _wait(mark.exists, 30, "the second run's reservation")
        time.sleep(0.3)  # the second's reservation: it used to take the first's room and land
        gate.touch()
        outs = [p.communicate(timeout=60) for p in (first, second)]
    finally:
        for p in (first,):
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip((first, second), outs, strict=True):
        assert p.returncode == 0, err.decode()
        s = summary(type("P", (), {"stdout": out})())
        # nothing said to be in the disk tier for "space taken by files that are not rq's"
        assert (s["objects"], s["failed"], s["demoted_full"]) == (8, 0, 0), (s, err.decode())
    copies = log.read_text().split()
    assert sorted(copies) == sorted(set(copies)) and len(copies) == 16  # each downloaded once
    with Cache(cache_dir) as c:
        usage = c.usage()
        assert usage["ram"]["objects"] + usage["disk"]["objects"] == 16
        assert usage["ram"]["held"] == 0
    assert_consistent({"RQ_CACHE_DIR": str(cache_dir)})


def test_a_dead_process_landing_takes_no_room(tmp_path: Path, ram_fs: Path) -> None:
    """A landing hold of a process killed with -9 (or a pid reused since) is no reservation: it
    must not keep the RAM file system's room from anyone, and a live one's must."""
    from cache import Cache, procs
    from cache.index import Index

    c = Cache(tmp_path / "cache", ram_dir=ram_fs / "ram", ram_limit="1G", disk_limit="1G")
    store = c._state().store
    room = store.room("ram")
    assert room is not None
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with store.index.write() as db:
        Index.add_hold(db, "ram", 2 << 20, "landing", "ab/" + "ab" * 16, "u1", (dead.pid, 1))
        Index.add_hold(db, "ram", 1 << 20, "landing", "cd/" + "cd" * 16, "u2", (1, 999))  # a reused pid
    after = store.room("ram")
    assert after is not None and abs(after.free - room.free) < 64 << 10
    with store.index.write() as db:
        Index.add_hold(db, "ram", 1 << 20, "landing", "ef/" + "ef" * 16, "u3", procs.me())
    live = store.room("ram")
    assert live is not None and room.free - live.free >= 1 << 20
    c.close()
