"""Cache used in processes forked at a bad moment (DataLoader workers start whenever they start)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from cache import Cache, CacheError


def test_fork_during_another_threads_index_transaction_leaves_the_child_a_usable_cache(
    tmp_path: Path, ram_dir: Path
) -> None:
    """Found by an independent review: the child inherited SQLite's lock state of the parent's
    open transaction and its own connection failed with "database is locked" after 60 s."""
    origin = tmp_path / "origin"
    origin.mkdir()
    for name in ("x", "y"):
        (origin / name).write_bytes(name.encode() * 1000)
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    assert c.open(str(origin / "x")).read() == b"x" * 1000
    index = c._state().index
    inside = threading.Event()

    def hold_a_transaction() -> None:  # stands for the prefetch thread committing a landing
        with index.write():
            inside.set()
            time.sleep(0.5)

    holder = threading.Thread(target=hold_a_transaction)
    holder.start()
    inside.wait()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # pytest-timeout's handler would wait
            signal.alarm(20)  # the bug made this wait 60 s; never hang the suite
            with c.open(str(origin / "y")) as fh:
                code = 0 if fh.read() == b"y" * 1000 else 2
        except CacheError:
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    holder.join()
    assert os.waitstatus_to_exitcode(status) == 0
    c.close()


def test_a_damaged_index_is_one_clear_error(tmp_path: Path, ram_dir: Path) -> None:
    root = tmp_path / "c"
    Cache(root, ram_dir=ram_dir).close()
    (root / "index.sqlite3").write_bytes(os.urandom(8192))
    for name in ("index.sqlite3-wal", "index.sqlite3-shm"):
        (root / name).unlink(missing_ok=True)
    try:
        Cache(root, ram_dir=ram_dir)
    except CacheError as exc:
        assert "cannot be used" in str(exc) and f"remove {root}" in str(exc)
    else:
        raise AssertionError("a damaged index was accepted")
