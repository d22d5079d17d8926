"""A thread that cannot start ("can't start new thread": ulimit -v leaves no room for its stack, or
ulimit -u / a pids cgroup is reached) is handled as running out of descriptors is: the run goes on
with the threads it has, or stops with one line (exit 1). Before: Workers listed a thread before it
started, so a task queued for it waited forever (Cache.open with a prefetch hung); the publisher's
ThreadPoolExecutor raised out of the run ("rq: error: unexpected RuntimeError"); a local copy's pool
that could not grow failed every object with a warning each, and the copy it had queued anyway
reported a second time, so the run's count of requests in flight went below 0 and it never ended.

Threads are refused by name inside the process (Thread.start patched), so the failure is
deterministic without prlimit."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from rqtest import popen_rq_with, random_files, wait_or_fail

from cache.fetcher import Workers


def refusing(*prefixes: str, allow: int = 0) -> str:
    """Setup code: Thread.start raises as CPython does at the limit for threads whose name starts
    with one of `prefixes`, after the first `allow` of them started."""
    return (
        "import threading, itertools\n"
        "_start = threading.Thread.start\n"
        "_n = itertools.count()\n"
        "def start(self):\n"
        f"    if self.name.startswith({prefixes!r}) and next(_n) >= {allow}:\n"
        '        raise RuntimeError("can\'t start new thread")\n'
        "    _start(self)\n"
        "threading.Thread.start = start\n"
    )


@pytest.fixture
def refuse(monkeypatch: pytest.MonkeyPatch) -> object:
    real = threading.Thread.start
    allowed = {"n": 0}

    def start(self: threading.Thread) -> None:
        if self.name.startswith("th-test"):
            allowed["n"] += 1
            if allowed["n"] > allowed.get("allow", 0):
                raise RuntimeError("can't start new thread")
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return allowed


@pytest.mark.parametrize("allow", [0, 1])
def test_workers_run_every_task_when_threads_cannot_start(refuse: dict[str, int], allow: int) -> None:
    refuse["allow"] = allow
    workers = Workers(4, "th-test")
    done = threading.Event()
    ran: list[int] = []
    for i in range(20):
        workers.submit(ran.append, i)
    workers.submit(done.set)
    assert done.wait(30), "a task queued for a thread that never started did not run"
    workers.shutdown()  # (joined a thread never started: RuntimeError)
    assert sorted(ran) == list(range(20))


def _open_script(src: Path, cache: Path, ram_dir: Path) -> str:
    return (
        "import os\n"
        "from cache import Cache\n"
        f"c = Cache({str(cache)!r}, ram_dir={str(ram_dir)!r}, durable=True)\n"
        f"urls = sorted(os.path.join({str(src)!r}, n) for n in os.listdir({str(src)!r}))\n"
        "c.prefetch(urls, ahead=8)\n"
        "total = 0\n"
        "for u in urls:\n"
        "    with c.open(u) as f:\n"
        "        total += len(f.read())\n"
        "c.close()\n"
        "print('read', total)\n"
    )


def test_cache_open_with_a_prefetch_does_not_hang_when_fetch_threads_cannot_start(
    tmp_path: Path, ram_dir: Path
) -> None:
    import subprocess

    src = random_files(tmp_path / "src", 30, 4096)
    code = refusing("rq-finish", "rq-publish") + _open_script(src, tmp_path / "c", ram_dir)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_or_fail(proc, 60, "Cache.open still waiting for a thread that never started")
    out, err = proc.communicate()
    assert proc.returncode == 0, err.decode()[-800:]
    assert out.decode().split() == ["read", str(30 * 4096)]


def test_preload_publishes_on_its_own_thread_when_the_publisher_cannot_start(tmp_path: Path) -> None:
    src = random_files(tmp_path / "src", 40, 4096)
    proc = popen_rq_with(
        refusing("rq-publish", "rq-finish"), "preload", str(src), "--cache-dir", str(tmp_path / "c")
    )
    wait_or_fail(proc, 60, "rq preload still running")
    out, err = proc.communicate()
    text = err.decode()
    assert proc.returncode == 0, text[-800:]
    assert "RuntimeError" not in text and "warning" not in text, text[-800:]
    assert "40 objects" in out.decode() + text


@pytest.mark.parametrize("allow", [0, 2])
def test_preload_stops_with_one_line_when_copy_threads_cannot_start(tmp_path: Path, allow: int) -> None:
    src = random_files(tmp_path / "src", 60, 4096)
    proc = popen_rq_with(
        refusing("rq-local", allow=allow), "preload", str(src), "--cache-dir", str(tmp_path / "c")
    )
    wait_or_fail(proc, 60, "rq preload still running after its copy threads could not start")
    _, err = proc.communicate()
    text = err.decode()
    assert proc.returncode == 1, text[-800:]
    assert "rq: error: cannot start a thread (memory or thread limit: ulimit -u / -v)" in text, text[-800:]
    assert "RuntimeError" not in text and "Traceback" not in text, text[-800:]
    assert "warning" not in text, text[-800:]  # (not one per object)


def test_preload_stops_with_one_line_when_its_listing_thread_cannot_start(tmp_path: Path) -> None:
    src = random_files(tmp_path / "src", 5, 4096)
    proc = popen_rq_with(refusing("rq-list"), "preload", str(src), "--cache-dir", str(tmp_path / "c"))
    wait_or_fail(proc, 60, "rq preload still running")
    _, err = proc.communicate()
    text = err.decode()
    assert proc.returncode == 1, text[-800:]
    assert "cannot start a thread (memory or thread limit: ulimit -u / -v): rq-list" in text, text[-800:]
    assert "unexpected" not in text and "Traceback" not in text, text[-800:]


def test_emfile_while_reserving_space_is_a_cache_error(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reserve() reads the RAM file system's room (a listdir): EMFILE there reached Cache.open's
    caller as a bare OSError, against 'every error the library raises is a CacheError'."""
    import errno

    from cache import Cache, CacheError
    from cache.store import Store

    src = random_files(tmp_path / "src", 1, 4096)

    def reserve(*_args: object, **_kw: object) -> list[int]:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(Store, "reserve", reserve)
    with (
        Cache(tmp_path / "c", ram_dir=ram_dir) as c,
        pytest.raises(CacheError, match="Too many open files") as caught,
    ):
        c.open(src / "0")
    assert isinstance(caught.value.__cause__, OSError)


def test_emfile_while_landing_is_a_cache_error(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The landing's fsync of objects/xx/ meeting EMFILE (Cache.open under ulimit -n 24 with a
    prefetch running) was raised as a bare OSError."""
    import errno

    import cache.fetcher
    from cache import Cache, CacheError

    src = random_files(tmp_path / "src", 1, 4096)

    def fsync_dir(path: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files", str(path))

    monkeypatch.setattr(cache.fetcher, "fsync_dir", fsync_dir)
    with (
        Cache(tmp_path / "c", ram_dir=ram_dir, durable=True) as c,
        pytest.raises(CacheError, match="Too many open files") as caught,
    ):
        c.open(src / "0")
    assert isinstance(caught.value.__cause__, OSError)
