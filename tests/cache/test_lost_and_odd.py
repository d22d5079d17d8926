"""What an independent review of preload and the read API found (2026-11-23), each case shown here
against the real file system, /dev/shm and the test S3: cached files that vanished, local sources
with odd members, objects bigger than the cap, filters that match nothing, prefixes that are not
keys, and an epoch order that repeats itself."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rqtest import random_files, run_rq, silent_server

from cache import Cache
from cache.errors import BadSourceError, CacheError, NotFoundError, UncacheableError
from cache.landing import ObjectInfo
from cache.origins import LocalOrigin, local_version

# root reads every file whatever its mode: drop the capabilities that allow it, as a user would run
AS_USER = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
           "--inh-caps", "-dac_override,-dac_read_search", "--"]  # fmt: skip


def events(out: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


def failed(out: bytes) -> dict[str, str]:
    return {e["url"]: e["kind"] for e in events(out) if e["event"] == "failed"}


# --- cached files that are gone ---------------------------------------------------------------


def test_an_emptied_ram_tier_is_fetched_again_not_reported_cached(tmp_path: Path, ram_dir: Path) -> None:
    """A reboot empties /dev/shm while the index on disk still lists the RAM entries: the next
    Cache drops them, so preload fetches them again and the tier's usage is true."""
    src = random_files(tmp_path / "src", 4, 10_000)
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    assert c.preload([str(src)], tier="ram").objects == 4
    c.close()
    shutil.rmtree(ram_dir)  # the reboot

    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    assert c.usage()["ram"]["objects"] == 0  # counted 4 against the cap before
    result = c.preload([str(src)], tier="ram")
    assert (result.objects, result.skipped, result.failed) == (4, 0, [])  # was 0 fetched, 4 skipped
    for f in src.iterdir():
        assert c.read_bytes(str(f)) == f.read_bytes()
        assert c.stat(str(f)).tier == "ram"
    c.close()


def test_a_cached_file_deleted_by_hand_is_fetched_again_by_preload(tmp_path: Path, ram_dir: Path) -> None:
    src = random_files(tmp_path / "src", 3, 10_000)
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    c.preload([str(src)])
    c.path(str(src / "1")).unlink()
    result = c.preload([str(src)])
    assert (result.objects, result.skipped) == (1, 2)  # was 0 fetched, 3 "already cached"
    assert c.path(str(src / "1")).read_bytes() == (src / "1").read_bytes()
    c.close()


# --- local sources with odd members ------------------------------------------------------------


def test_a_file_that_became_a_fifo_fails_alone_instead_of_blocking(tmp_path: Path) -> None:
    f = tmp_path / "data.bin"
    f.write_bytes(b"x" * 100)
    info = ObjectInfo(str(f), "data.bin", 100, local_version(f.stat()))
    f.unlink()
    os.mkfifo(f)  # replaced after it was listed; opening it for reading waited for a writer forever
    outcome: list[BaseException] = []

    def copy() -> None:
        try:
            LocalOrigin(tmp_path)._copy(info, None, None)  # type: ignore[arg-type]
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=copy, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "blocked opening a FIFO"
    assert isinstance(outcome[0], NotFoundError) and "regular file" in str(outcome[0])


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_unreadable_file_and_directory_fail_alone_and_the_rest_lands(tmp_path: Path) -> None:
    src = random_files(tmp_path / "src", 3, 1000)
    (src / "secret").write_bytes(b"s")
    (src / "locked").mkdir()
    (src / "locked" / "inside").write_bytes(b"i")
    os.chmod(src / "secret", 0)
    os.chmod(src / "locked", 0)
    os.chmod(tmp_path, 0o755)
    cache_dir = tmp_path / "c"
    try:
        env = {"RQ_CACHE_DIR": str(cache_dir)}
        cmd = [*AS_USER, sys.executable, "-m", "rqcli", "--json", "preload", str(src), "--tier", "disk"]
        out = subprocess.run(cmd, capture_output=True, env={**os.environ, "CI": "1", **env}, timeout=120)
        cat = [*AS_USER, sys.executable, "-m", "rqcli", "cache", "cat", str(src / "secret")]
        read = subprocess.run(cat, capture_output=True, env={**os.environ, "CI": "1", **env}, timeout=120)
    finally:
        os.chmod(src / "secret", 0o644)
        os.chmod(src / "locked", 0o755)
    # before: the whole run stopped with exit 6 "check --endpoint-url; re-run to continue"
    assert out.returncode == 4, out.stderr
    assert failed(out.stdout) == {str(src / "secret"): "denied", f"{src / 'locked'}/": "denied"}
    summary = events(out.stdout)[-1]
    assert (summary["objects"], summary["failed"], summary["aborted"]) == (3, 2, False)
    assert b"failed" in out.stderr
    assert read.returncode == 4 and b"Permission denied" in read.stderr, read.stderr  # was exit 1


def test_a_cache_dir_inside_its_source_is_not_cached_into_itself(tmp_path: Path, ram_dir: Path) -> None:
    src = random_files(tmp_path / "src", 2, 5000)
    c = Cache(src / "cache", ram_dir=ram_dir)
    for _ in range(2):  # each run used to add the cache's own index and blobs, then fail on its WAL
        result = c.preload([str(src)])
        assert result.failed == []
    assert sorted(Path(e.url).name for e in c.entries()) == ["0", "1"]
    c.close()


def test_one_object_bigger_than_the_cap_fails_alone(tmp_path: Path, ram_dir: Path) -> None:
    src = random_files(tmp_path / "src", 20, 100)
    (src / "huge").write_bytes(os.urandom(300_000))
    out = run_rq("--json", "preload", str(src), "--cache-dir", str(tmp_path / "c"), "--disk-limit", "200K")
    assert out.returncode == 7, out.stderr  # no_space: the one documented code for "does not fit"
    assert failed(out.stdout) == {str(src / "huge"): "no_space"}
    summary = events(out.stdout)[-1]
    assert (summary["objects"], summary["aborted"]) == (20, False)  # was 0 objects, aborted
    why = next(e["message"] for e in events(out.stdout) if e["event"] == "failed")
    assert "disk tier's cap of 200.0 KiB" in why and "--disk-limit" in why, why


def test_filters_that_match_nothing_and_empty_sources_are_errors(tmp_path: Path) -> None:
    src = random_files(tmp_path / "src", 2, 10, suffix=".bin")
    (src / "sub").mkdir()
    (src / "sub" / "x.bin").write_bytes(b"x")
    cache = ["--cache-dir", str(tmp_path / "c")]
    out = run_rq("preload", str(src), "--include", "*.tar", *cache)
    assert out.returncode == 3 and b"none of the 3 objects listed matches" in out.stderr, out.stderr
    (tmp_path / "empty").mkdir()
    out = run_rq("preload", str(tmp_path / "empty"), *cache)
    assert out.returncode == 3 and b"no files under" in out.stderr
    # rclone anchors a pattern at the source with a leading slash; keys are relative already
    out = run_rq("--json", "preload", str(src), "--include", "/sub/*", *cache)
    assert out.returncode == 0 and events(out.stdout)[-1]["objects"] == 1


def test_an_s3_url_without_slash_is_a_path_not_a_key_prefix(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path
) -> None:
    for key in ("mp/f1", "mp/f10.ckpt", "mp/f1/part", "mp/g"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    c = Cache(tmp_path / "c", endpoint_url=aws_env["AWS_ENDPOINT_URL"])
    result = c.preload([f"s3://{bucket}/mp/f1"], dry_run=True, keep_planned=True)
    planned = {i.url.rsplit("/mp/", 1)[1]: i.key for i in result.planned}
    assert planned == {"f1": "f1", "f1/part": "part"}  # f10.ckpt was fetched too
    result = c.preload([f"s3://{bucket}/mp/f1"], include=["f1"], dry_run=True)
    assert result.planned_objects == 1  # the object's key is its base name, as a local file's is
    c.close()


# --- the read API ------------------------------------------------------------------------------


def test_read_api_refuses_what_is_not_an_object_clearly(tmp_path: Path, ram_dir: Path) -> None:
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    for url in ("http://host/x", "s3://bucket/prefix/"):
        with pytest.raises(BadSourceError):
            c.open(url)  # were a local path named "http:" and "got 7923 bytes, expected 0"
    with pytest.raises(BadSourceError, match="UTF-8"):
        c.open(os.fsdecode(b"/tmp/\xff.bin"))  # was a bare UnicodeEncodeError
    with pytest.raises(ValueError, match="tier"):
        c.open(str(tmp_path / "x"), tier="RAM")  # was KeyError
    c.close()


def test_cache_patterns_take_relative_paths_like_stat_does(tmp_path: Path) -> None:
    src = random_files(tmp_path / "src", 2, 10)
    (src / "sub").mkdir()
    (src / "sub" / "x").write_bytes(b"x")
    cache = ["--cache-dir", str(tmp_path / "c")]
    assert run_rq("preload", "src", *cache, cwd=tmp_path).returncode == 0
    out = run_rq("cache", "ls", "src/", *cache, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.count(b"\n") == 3, out.stderr  # was "no entry matches"
    out = run_rq("cache", "pin", "src/sub/", *cache, cwd=tmp_path)
    assert out.returncode == 0 and b"pinned 1" in out.stdout, out.stderr
    out = run_rq("cache", "evict", "src/0", *cache, cwd=tmp_path)
    assert out.returncode == 0 and b"evicted 1" in out.stdout, out.stderr


def test_prefetch_follows_an_order_that_repeats_urls(tmp_path: Path, ram_dir: Path) -> None:
    """Two shuffled epochs in one list: reading epoch 1 must warm epoch 1's next items, not jump
    to where each URL comes again in epoch 2."""
    src = random_files(tmp_path / "src", 40, 1000)
    epoch1 = [str(src / str(i)) for i in range(40)]
    epoch2 = random.Random(7).sample(epoch1, len(epoch1))
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    pre = c.prefetch(epoch1 + epoch2, ahead=6, tier="ram")
    assert pre.wait_warm(30)
    warm = 0
    for url in epoch1:
        warm += any(e.url == url and e.tier == "ram" for e in c.entries(url))
        with c.open(url) as fh:
            fh.read()
        pre.wait_warm(10)
    c.close()
    assert warm == len(epoch1), f"{warm}/{len(epoch1)} warm"  # 22/60 in the review's run
    assert pre.errors == []


# --- second review round (2026-11-23, later session) -------------------------------------------


def test_a_pseudo_file_that_says_zero_bytes_is_refused_not_cached_empty(tmp_path: Path) -> None:
    """/proc files say 0 bytes and read back text: caching them empty (the old result, exit 0) is a
    wrong copy. They fail alone as `uncacheable` (exit 10), at once, and a real empty file lands."""
    (tmp_path / "empty").write_bytes(b"")
    cache = ["--cache-dir", str(tmp_path / "c")]
    out = run_rq("preload", "/proc/self/status", *cache, "--json")
    assert out.returncode == 10, out.stderr
    assert failed(out.stdout) == {"/proc/self/status": "uncacheable"}
    assert "/proc or /sys" in events(out.stdout)[0]["message"]
    out = run_rq("preload", "/proc/self/status", *cache)
    assert out.returncode == 10 and out.stderr.count(b"/proc/self/status") == 1, out.stderr
    out = run_rq("preload", str(tmp_path / "empty"), *cache)
    assert out.returncode == 0, out.stderr
    c = Cache(tmp_path / "c")
    with pytest.raises(UncacheableError):
        c.open("/proc/self/status")
    assert c.read_bytes(str(tmp_path / "empty")) == b""
    c.close()


def test_a_size_that_is_no_whole_number_of_bytes_is_a_clear_error(tmp_path: Path) -> None:
    for bad in (1.5, True, [1 << 30]):
        with pytest.raises(BadSourceError, match=r"size|bytes"):
            Cache(tmp_path / "c", ram_limit=bad)  # type: ignore[arg-type]  # was TypeError from re
    c = Cache(tmp_path / "c", ram_limit=2e9)  # a float holding a whole number is bytes
    assert c.caps["ram"] == 2_000_000_000
    c.close()


def test_cache_path_revalidates_like_cat_unless_told_not_to(tmp_path: Path) -> None:
    src = random_files(tmp_path / "src", 1, 1000)
    f = next(src.iterdir())
    cache = ["--cache-dir", str(tmp_path / "c")]
    assert run_rq("preload", str(src), *cache).returncode == 0
    first = Path(run_rq("cache", "path", str(f), *cache).stdout.decode().strip())
    f.write_bytes(b"new contents")
    os.utime(f, ns=(1, 1))  # a new version whatever the clock's resolution
    out = run_rq("cache", "path", str(f), *cache, "--no-check")
    assert Path(out.stdout.decode().strip()) == first and first.read_bytes() != b"new contents"
    out = run_rq("cache", "path", str(f), *cache)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.decode().strip()).read_bytes() == b"new contents"  # was the old copy
    Path(out.stdout.decode().strip()).unlink()  # a cleaner removed the cached file
    out = run_rq("cache", "path", str(f), *cache)
    assert out.returncode == 0 and Path(out.stdout.decode().strip()).read_bytes() == b"new contents"
    assert run_rq("cache", "path", str(tmp_path / "never"), *cache).returncode == 3


@pytest.fixture
def silent_store() -> Any:
    """A 'store' that accepts connections and never says a word (a half-dead proxy or port-forward)."""
    with silent_server() as port:
        yield f"http://127.0.0.1:{port}"


def test_a_store_that_accepts_and_never_answers_is_unreachable_not_a_hang(
    tmp_path: Path, silent_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cache.watchdog
    from cache.errors import UnreachableError

    monkeypatch.setattr(cache.watchdog, "SILENCE_S", 1.0)  # 30 s in real life
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    c = Cache(tmp_path / "c", endpoint_url=silent_store, max_age=0)
    # (a hang, as before, is ended by pytest-timeout; no clock is read: the message says the
    # lowered 1 s silence ended it, and the two take ~2.5 s even on a loaded runner)
    with pytest.raises(UnreachableError, match="sent nothing for 1 s"):
        c.open("s3://bucket/key")  # waited for ever before
    with pytest.raises(UnreachableError, match="sent nothing"):
        c.preload(["s3://bucket/prefix/"])  # the listing, the same
    c.close()


def _read_in_order(c: Cache, urls: list[str]) -> int:
    for url in urls:
        c.read_bytes(url)
    c.close()  # flushes this worker's LRU stamps
    return len(urls)


def test_a_prefetch_follows_reads_made_in_dataloader_style_workers(tmp_path: Path, ram_dir: Path) -> None:
    """The training process prefetches the epoch order; forked workers do the reading (each its
    share, in order). The window used to stay at 0 for ever: a child's reads never reached it."""
    import multiprocessing as mp
    import time

    src = random_files(tmp_path / "src", 40, 1000)
    order = [str(src / str(i)) for i in range(40)]
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    pre = c.prefetch(order, ahead=4, tier="ram")
    assert pre.wait_warm(30)
    with mp.get_context("fork").Pool(2) as pool:
        assert sum(pool.starmap(_read_in_order, [(c, order[:20]), (c, order[20:])])) == 40
    deadline = time.monotonic() + 15
    while pre.position < 36 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pre.position >= 36, pre.position  # 0 before
    assert pre.errors == []
    c.close()


def _prefetching_two_epochs(tmp_path: Path, ram_dir: Path) -> tuple[Cache, Any, list[str]]:
    """A cache prefetching two epochs of 100 local files (ahead 4, RAM tier), its first window warm."""
    src = random_files(tmp_path / "src", 100, 1000)
    epoch = [str(src / str(i)) for i in range(100)]
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    pre = c.prefetch(epoch * 2, ahead=4, tier="ram")
    assert pre.wait_warm(30)
    return c, pre, epoch


def _wait_for_position(pre: Any, position: int, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while pre.position < position and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_prefetch_catches_up_with_workers_that_got_ahead_of_its_window(
    tmp_path: Path, ram_dir: Path
) -> None:
    """Workers that read past the window (their reads of its items swallowed by its promotions,
    or made while it was being warmed) read nothing in it any more: it looked only there and stood
    still for the rest of the run (pt: a real DataLoader, 4 workers, 448 of 4,000). It looks past
    the window now, and a read counts at the URL's first place from the window on: two epochs in
    one order, the first epoch's reads must not pull it into the second."""
    import multiprocessing as mp

    c, pre, epoch = _prefetching_two_epochs(tmp_path, ram_dir)
    with mp.get_context("fork").Pool(1) as pool:
        assert pool.apply(_read_in_order, (c, epoch[30:60])) == 30  # none of the window's items
    _wait_for_position(pre, 59)
    assert pre.position == 59, pre.position  # 0 before: the window never moved again
    assert pre.errors == []
    c.close()


def test_a_late_read_of_an_item_just_passed_does_not_pull_the_window_into_the_next_epoch(
    tmp_path: Path, ram_dir: Path
) -> None:
    """DataLoader workers finish out of order: a read of an item the window has just passed, seen
    past the window, was counted at that item's next epoch's place (dr3: 59 -> 150), and from
    there the window ran on into the second epoch, the rest of the first left cold."""
    import multiprocessing as mp
    import time

    c, pre, epoch = _prefetching_two_epochs(tmp_path, ram_dir)
    with mp.get_context("fork").Pool(1) as pool:
        assert pool.apply(_read_in_order, (c, epoch[0:60])) == 60
        _wait_for_position(pre, 59)
        assert pre.position == 59, pre.position
        time.sleep(1.5)
        assert pool.apply(_read_in_order, (c, epoch[50:51])) == 1  # a straggler of the first epoch
    time.sleep(3.0)  # its stamp arrives, and the prefetcher looks a few times
    assert pre.position == 59, pre.position  # 150 before
    c.close()


def test_bad_arguments_are_clear_errors_that_leave_nothing_behind(tmp_path: Path, ram_dir: Path) -> None:
    for kwargs in ({"ram_limit": "abc"}, {"disk_limit": -1}, {"max_age": "60"}, {"max_age": -1}):
        with pytest.raises(BadSourceError):
            Cache(tmp_path / "new", ram_dir=ram_dir, **kwargs)  # type: ignore[arg-type]
        assert not (tmp_path / "new").exists()  # made the cache dir and a RAM root before failing
    with pytest.raises(BadSourceError):
        Cache(5)  # type: ignore[arg-type]
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    for bad in (None, 3, b"s3://b/k"):
        with pytest.raises(BadSourceError):
            c.open(bad)  # type: ignore[arg-type]  # AttributeError / TypeError from inside before
    with pytest.raises(BadSourceError, match="bucket, not an object"):
        c.open("s3://bucket")  # fetched the bucket listing as a 0-byte object before
    with pytest.raises(BadSourceError, match="not one URL"):
        c.prefetch(str(tmp_path / "x"))  # prefetched each character as a path before
    c.close()


def test_the_watchdog_spares_queued_requests_while_the_store_is_busy() -> None:
    """On a slow link a request may wait in the CRT's queue behind a long body: the store is not
    silent then, and cancelling the queued one would turn a healthy run into exit 6."""
    import time

    from cache.watchdog import Watchdog

    dog = Watchdog(silence=1.0)
    body, queued = dog.watch(), dog.watch()
    body.request = queued.request = object()
    now = time.monotonic()
    body.alive(body_bytes=10 << 20)  # answered: a 10 MiB body may take 1 s + 40 s
    assert dog._late(now + 5) == []  # the queued one waited 5 s: spared, the store is busy
    body.last -= 100  # that body then outlasted its allowance: the store went silent
    assert set(dog._late(now + 5)) == {body, queued}


def test_a_relative_cache_dir_stays_put_when_the_process_changes_directory(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launcher that changes directory after making the Cache (Hydra's run dirs): blobs were
    written under the new directory's rc/ (outside the cache) while the index stayed behind."""
    (tmp_path / "src").mkdir()
    for name in ("a", "b"):
        (tmp_path / "src" / name).write_bytes(name.encode() * 10)
    monkeypatch.chdir(tmp_path)
    c = Cache("rc", ram_dir=ram_dir)
    assert c.read_bytes(str(tmp_path / "src" / "a")) == b"a" * 10
    (tmp_path / "elsewhere" / "rc" / "tmp").mkdir(parents=True)
    (tmp_path / "elsewhere" / "rc" / "objects").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert c.read_bytes(str(tmp_path / "src" / "b")) == b"b" * 10
    c.close()
    assert not any(p.is_file() for p in (tmp_path / "elsewhere").rglob("*"))
    monkeypatch.chdir(tmp_path)
    res = run_rq("cache", "verify", "--cache-dir", str(tmp_path / "rc"))
    assert res.returncode == 0, res.stderr


def test_preloading_the_cache_into_itself_is_refused(tmp_path: Path, ram_dir: Path) -> None:
    """The cache dir as a source cached its own index and blobs, and each run the copies again."""
    src = tmp_path / "src"
    random_files(src, 3, 1000)
    cache_dir = tmp_path / "c"
    Cache(cache_dir, ram_dir=ram_dir).close()  # fixes the RAM root for this cache dir
    assert run_rq("preload", str(src), "--cache-dir", str(cache_dir)).returncode == 0
    for inside in (cache_dir, cache_dir / "objects", ram_dir):
        res = run_rq("preload", f"{inside}/", "--cache-dir", str(cache_dir))
        assert res.returncode == 2, res.stderr
        assert b"own directory" in res.stderr and len(res.stderr.splitlines()) == 1, res.stderr
    listed = run_rq("cache", "ls", "--cache-dir", str(cache_dir)).stdout.decode()
    assert str(cache_dir) not in listed.replace(f"{cache_dir}/objects", ""), listed
    assert len(listed.splitlines()) == 3, listed


def test_odd_sources_and_ram_dirs_are_refused_cleanly(tmp_path: Path, ram_dir: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    res = run_rq("preload", str(fifo), "--cache-dir", str(tmp_path / "c"))
    assert res.returncode == 3 and b"not a regular file or directory" in res.stderr, (
        res.stderr
    )  # "cannot list"
    c = Cache(tmp_path / "c2", ram_dir=ram_dir)
    with pytest.raises(BadSourceError, match="empty"):
        c.open("")  # read the current directory before
    c.close()
    with pytest.raises(CacheError, match="apart from the cache dir"):
        Cache(tmp_path / "c3", ram_dir=tmp_path / "c3")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_bytes(b"x")
    with pytest.raises(CacheError, match="not empty"):
        Cache(tmp_path / "c4", ram_dir=tmp_path / "full")
    assert not (tmp_path / "c3").exists() and not (tmp_path / "c4").exists()  # an index was left before


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_preload_stopped_by_a_signal_still_ends_with_its_summary(
    tmp_path: Path, ram_dir: Path, sig: signal.Signals
) -> None:
    """Ctrl-C printed no summary (rq send does), and SIGTERM killed it outright (exit 143)."""
    src = tmp_path / "src"
    random_files(src, 3000, 100)
    Cache(tmp_path / "c", ram_dir=ram_dir).close()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rqcli",
            "--json",
            "preload",
            str(src),
            "--cache-dir",
            str(tmp_path / "c"),
            "--workers",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    objects = tmp_path / "c" / "objects"
    deadline = time.monotonic() + 30
    while sum(1 for _ in objects.rglob("*")) < 100 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # until the run is landing objects
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the preload finished before the signal")  # (3,000 files on a fast machine)
    assert proc.returncode == 130, err
    last = json.loads(out.splitlines()[-1])
    assert last["event"] == "summary" and last["aborted"] is True, last
    assert last["error"] == ("interrupted" if sig == signal.SIGINT else "stopped by SIGTERM"), last
    assert err.decode().strip().splitlines()[-1].startswith("rq: "), err
