"""Faults the cache must survive: kill -9, the server going away, SlowDown and resets, bit rot,
caps under concurrent readers, a full disk, two preloaders at once."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from cachekit import assert_consistent, entry_count, payload, seed_objects, summary, tree_bytes, tree_files
from rqtest import rq_command, run_rq, small_tmpfs

pytestmark = pytest.mark.integration


def popen_rq(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*rq_command(), *args],
        env={**os.environ, "CI": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_kill9_midway_then_rerun_fetches_only_missing(
    s3_client: Any, bucket: str, cache_env: dict[str, str], proxy_factory: Any
) -> None:
    n = 160
    seed_objects(s3_client, bucket, "k/", n, 64 * 1024)
    slow = proxy_factory(rate_bytes_per_s=256 * 1024)  # ~4 objects/s per request in flight
    cache_dir = Path(cache_env["RQ_CACHE_DIR"])
    proc = popen_rq(
        "preload", f"s3://{bucket}/k/", "--workers", "4", "--endpoint-url", slow.endpoint, env=cache_env
    )
    try:
        wait_for(lambda: len(tree_files(cache_dir / "objects")) >= 12, 60, "a dozen objects to land")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    landed = entry_count(cache_dir)
    assert 0 < landed < n
    rerun = run_rq("preload", f"s3://{bucket}/k/", "--json", env=cache_env)
    assert rerun.returncode == 0, rerun.stderr
    s = summary(rerun)
    assert s["skipped"] == landed and s["objects"] == n - landed
    assert_consistent(cache_env)


@pytest.mark.slow
def test_kill9_during_big_object_resumes_from_its_pieces(
    s3_client: Any, bucket: str, cache_env: dict[str, str], proxy_factory: Any
) -> None:
    from cache.digests import PIECE_SIZE

    body = (payload(3, 1 << 20) * 100)[: 3 * PIECE_SIZE - 12345]
    s3_client.upload_fileobj(io.BytesIO(body), bucket, "big/one.bin")
    slow = proxy_factory(rate_bytes_per_s=6 * 1024 * 1024)
    cache_dir = Path(cache_env["RQ_CACHE_DIR"])
    # one request at a time: the first piece is journalled ~5 s in and the object needs ~10 s more
    # to land. (With the pieces fetched side by side all three ended within milliseconds of each
    # other, and a runner that paused this loop for a moment saw the object land before the kill.)
    proc = popen_rq(
        "preload", f"s3://{bucket}/big/", "--workers", "1", "--endpoint-url", slow.endpoint, env=cache_env
    )

    def journalled() -> bool:
        return any(p.endswith(".journal") and os.path.getsize(p) > 0 for p in tree_files(cache_dir / "tmp"))

    try:
        wait_for(journalled, 60, "a piece to be journalled")
    except AssertionError:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(
            f"no journal; tmp={tree_files(cache_dir / 'tmp')} rc={proc.returncode} err={err[-800:]!r} stats={slow.stats}"
        ) from None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    assert entry_count(cache_dir) == 0  # nothing visible yet
    rerun = run_rq("preload", f"s3://{bucket}/big/", "--json", env=cache_env)
    assert rerun.returncode == 0, rerun.stderr
    s = summary(rerun)
    assert s["objects"] == 1 and s["resumed_bytes"] >= PIECE_SIZE - 12345  # at least one piece
    from cache import Cache

    with Cache(cache_dir) as c, c.open(f"s3://{bucket}/big/one.bin") as fh:
        assert hashlib.sha256(fh.read()).digest() == hashlib.sha256(body).digest()
    assert_consistent(cache_env)


def test_server_stopped_midway_fails_clearly_and_rerun_completes(
    s3_client: Any, bucket: str, cache_env: dict[str, str], proxy_factory: Any
) -> None:
    n = 120
    seed_objects(s3_client, bucket, "s/", n, 64 * 1024)
    proxy = proxy_factory(rate_bytes_per_s=256 * 1024)
    cache_dir = Path(cache_env["RQ_CACHE_DIR"])
    proc = popen_rq(
        "preload", f"s3://{bucket}/s/", "--workers", "4", "--endpoint-url", proxy.endpoint, env=cache_env
    )
    wait_for(lambda: len(tree_files(cache_dir / "objects")) >= 8, 60, "some objects to land")
    proxy.stop()  # the S3 server goes away: listener closed, connections reset
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 6, err
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "re-run" in lines[0], lines
    assert_consistent(cache_env)
    landed = entry_count(cache_dir)
    rerun = run_rq("preload", f"s3://{bucket}/s/", "--json", env=cache_env)
    assert rerun.returncode == 0
    assert summary(rerun)["skipped"] == landed and summary(rerun)["objects"] == n - landed
    assert_consistent(cache_env)


def preload_through(proxy: Any, bucket: str, cache_env: dict[str, str]) -> Any:
    """`rq preload --json` of s3://bucket/f/ with the fault proxy as its endpoint."""
    return run_rq("preload", f"s3://{bucket}/f/", "--json", "--endpoint-url", proxy.endpoint, env=cache_env)


def test_slowdown_and_connection_resets_are_retried(
    s3_client: Any, bucket: str, cache_env: dict[str, str], proxy_factory: Any
) -> None:
    n = 80
    data = seed_objects(s3_client, bucket, "f/", n, 48 * 1024)
    flaky = proxy_factory(p_slowdown=0.25, p_reset=0.1, seed=7)
    proc = preload_through(flaky, bucket, cache_env)
    assert proc.returncode == 0, proc.stderr
    s = summary(proc)
    assert s["objects"] == n and s["failed"] == 0
    assert flaky.stats.slowdowns > 0 and flaky.stats.resets > 0
    assert_consistent(cache_env)
    from cache import Cache

    with Cache(Path(cache_env["RQ_CACHE_DIR"])) as c:
        for key, body in data.items():
            assert c.read_bytes(f"s3://{bucket}/{key}") == body


def test_a_throttling_storm_backs_concurrency_off_and_the_run_recovers(
    s3_client: Any, bucket: str, cache_env: dict[str, str], proxy_factory: Any
) -> None:
    n = 80
    seed_objects(s3_client, bucket, "f/", n, 48 * 1024)
    # Every object GET answers SlowDown for the first 2 s. With 80 objects at once that drains the
    # CRT's shared retry budget within ~0.2 s, so objects fail past the CRT's retries and reach the
    # fetcher's window; 2 s is still shorter than the fetcher's own 5 attempts take (>= 3 s).
    storm = proxy_factory(storm_s=2.0)
    proc = preload_through(storm, bucket, cache_env)
    assert proc.returncode == 0, proc.stderr
    s = summary(proc)
    assert s["objects"] == n and s["failed"] == 0
    # objects the store kept throttling past the client's retries halved the AIMD window; the run
    # then finished, so it grew back and fetched everything
    assert s["throttled"] > 0 and s["smallest_window"] < 256
    assert_consistent(cache_env)


def test_a_store_whose_connections_all_drop_is_unreachable_not_retried_forever(
    s3_client: Any, bucket: str, cache_env: dict[str, str], proxy_factory: Any
) -> None:
    # a port-forward or proxy whose backend died: it accepts, lists, then drops every object GET
    n = 100
    seed_objects(s3_client, bucket, "f/", n, 16 * 1024)
    dead = proxy_factory(p_reset=1.0, only_objects=True)
    proc = preload_through(dead, bucket, cache_env)
    # one lost connection is one object's trouble (retried); a run of them with nothing landing
    # means the store is gone: exit 6 and "re-run", not 5 attempts of every object and exit 1
    assert proc.returncode == 6, proc.stderr
    assert b"in a row" in proc.stderr and b"re-run" in proc.stderr
    assert dead.stats.resets > 0
    assert_consistent(cache_env)


def test_corrupted_byte_is_named_by_verify_and_refetched_by_open(
    s3_client: Any, bucket: str, cache_env: dict[str, str]
) -> None:
    data = seed_objects(s3_client, bucket, "c/", 6, 20_000)
    assert run_rq("preload", f"s3://{bucket}/c/", env=cache_env).returncode == 0
    victim = f"s3://{bucket}/c/00004.bin"
    path = Path(run_rq("cache", "path", victim, env=cache_env).stdout.decode().strip())
    raw = bytearray(path.read_bytes())
    raw[12345] ^= 0x20
    os.chmod(path, 0o644)
    path.write_bytes(bytes(raw))

    verify = run_rq("cache", "verify", "--json", env=cache_env)
    assert verify.returncode == 5
    corrupt = [json.loads(x) for x in verify.stdout.splitlines() if json.loads(x).get("event") == "corrupt"]
    assert [c["url"] for c in corrupt] == [victim]
    from cache import Cache

    with Cache(Path(cache_env["RQ_CACHE_DIR"])) as c:
        assert c.read_bytes(victim) == data["c/00004.bin"]  # refetched, never served corrupt
    assert run_rq("cache", "verify", env=cache_env).returncode == 0


READER = r"""
import hashlib, random, sys
from cache import Cache
cache_dir, bucket, n, size, rounds, seed = sys.argv[1:7]
sys.path.insert(0, sys.argv[7])
from cachekit import payload
rng = random.Random(int(seed))
c = Cache(cache_dir)
for _ in range(int(rounds)):
    i = rng.randrange(int(n))
    with c.open(f"s3://{bucket}/r/{i:05d}.bin") as fh:
        if fh.read() != payload(i, int(size)):
            sys.exit(f"torn or wrong read of object {i}")
c.close()
"""


@pytest.mark.slow
def test_caps_hold_under_eight_readers_and_a_preloader(
    s3_client: Any, bucket: str, cache_env: dict[str, str], ram_dir: Path
) -> None:
    n, size = 48, 64 * 1024
    seed_objects(s3_client, bucket, "r/", n, size)
    cache_dir = Path(cache_env["RQ_CACHE_DIR"])
    ram_cap, disk_cap = 640 * 1024, 2048 * 1024  # 10 and 32 objects: far less than the 48
    from cache import Cache

    Cache(cache_dir, ram_limit=ram_cap, disk_limit=disk_cap).close()
    peaks = {"ram": 0, "disk": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            # tmp/ before objects/: files only move tmp -> objects (one inode, counted once), so this
            # order can miss a file but never count an evicted file beside its replacement
            ram = tree_bytes(ram_dir / "tmp", ram_dir / "objects")
            disk = tree_bytes(cache_dir / "tmp", cache_dir / "objects")
            peaks["ram"], peaks["disk"] = max(peaks["ram"], ram), max(peaks["disk"], disk)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    env = {**os.environ, **cache_env}
    helpers = str(Path(__file__).parent)
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(cache_dir), bucket, str(n), str(size), "60", str(i), helpers],
            env=env,
            stderr=subprocess.PIPE,
        )
        for i in range(8)
    ]
    try:
        pre = run_rq("preload", f"s3://{bucket}/r/", "--tier", "ram", "--json", env=cache_env)
        results = [(r.wait(120), r.stderr.read().decode() if r.stderr else "") for r in readers]
    finally:
        stop.set()
        sampler.join()
        for r in readers:
            if r.poll() is None:
                r.kill()
    assert pre.returncode == 0, pre.stderr
    assert all(code == 0 for code, _ in results), [r for r in results if r[0] != 0]
    assert peaks["ram"] <= ram_cap and peaks["disk"] <= disk_cap, peaks
    assert peaks["ram"] > ram_cap // 2  # the sampler did see the tier in use
    with Cache(cache_dir) as c:
        c.collect()  # old versions a reader still had open when they were superseded
        usage = c.usage()
        assert usage["ram"]["bytes"] <= ram_cap and usage["disk"]["bytes"] <= disk_cap
        assert usage["ram"]["held"] == 0 and usage["disk"]["held"] == 0
        assert usage["disk"]["objects"] > 0  # RAM evictions were demoted to disk
        # the running per-tier totals agree with the entries themselves
        entries = c.entries()
        for tier in ("ram", "disk"):
            assert usage[tier]["bytes"] == sum(e.size for e in entries if e.tier == tier)
    assert_consistent(cache_env)


def test_two_preloaders_at_once_agree(s3_client: Any, bucket: str, cache_env: dict[str, str]) -> None:
    n = 60
    seed_objects(s3_client, bucket, "t/", n, 32 * 1024)
    procs = [popen_rq("preload", f"s3://{bucket}/t/", "--json", env=cache_env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert entry_count(Path(cache_env["RQ_CACHE_DIR"])) == n
    assert_consistent(cache_env)


def test_pinned_entries_are_never_evicted_and_a_full_tier_says_so(
    s3_client: Any, bucket: str, cache_env: dict[str, str]
) -> None:
    seed_objects(s3_client, bucket, "p/", 5, 64 * 1024)
    env = cache_env
    first = run_rq(
        "preload", f"s3://{bucket}/p/", "--include", "0000[0-3].bin", "--tier", "ram", "--ram-limit", "256K",
        "--disk-limit", "0", env=env,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert run_rq("cache", "pin", f"s3://{bucket}/p/", env=env).returncode == 0
    more = run_rq("preload", f"s3://{bucket}/p/", "--tier", "ram", env=env)
    assert more.returncode == 7, more.stderr
    err = more.stderr.decode()
    assert len(err.strip().splitlines()) == 1 and "pinned" in err
    ls = [json.loads(x) for x in run_rq("cache", "ls", "--json", env=env).stdout.splitlines()]
    assert len(ls) == 4 and all(e["pinned"] and e["tier"] == "ram" for e in ls)
    assert run_rq("cache", "unpin", f"s3://{bucket}/p/", env=env).returncode == 0
    assert run_rq("preload", f"s3://{bucket}/p/", "--tier", "ram", env=env).returncode == 0


@pytest.fixture
def small_fs(tmp_path: Path) -> Any:
    with small_tmpfs(tmp_path / f"tiny-{uuid.uuid4().hex[:6]}", "2m") as mnt:
        yield mnt


def test_full_disk_is_a_clear_error_and_the_cache_stays_consistent(
    s3_client: Any, bucket: str, aws_env: dict[str, str], small_fs: Path, ram_dir: Path
) -> None:
    seed_objects(s3_client, bucket, "d/", 30, 128 * 1024)  # 3.75 MiB into a 2 MiB file system
    from cache import Cache

    cache_dir = small_fs / "cache"
    Cache(cache_dir, ram_dir=ram_dir, disk_limit="1G").close()  # a cap the file system cannot honour
    env = {**aws_env, "RQ_CACHE_DIR": str(cache_dir)}
    proc = run_rq("preload", f"s3://{bucket}/d/", "--json", env=env)
    assert proc.returncode == 7, proc.stderr
    err = proc.stderr.decode()
    assert len(err.strip().splitlines()) == 1 and "no space" in err, err
    assert_consistent(env)
    assert entry_count(cache_dir) < 30  # what landed is whole and verified; the rest is not there at all


def test_a_big_object_into_a_full_disk_stops_the_run_with_exit_7(
    s3_client: Any, bucket: str, aws_env: dict[str, str], small_fs: Path, ram_dir: Path
) -> None:
    """A big object's body is written by the CRT itself: its AWS_ERROR_NO_SPACE was an origin error,
    retried ~5 times per object and exit 1, not the full disk it is."""
    s3_client.put_object(Bucket=bucket, Key="big/one.bin", Body=os.urandom(6 << 20))
    from cache import Cache

    cache_dir = small_fs / "cache"
    Cache(cache_dir, ram_dir=ram_dir, disk_limit="1G").close()
    proc = run_rq("preload", f"s3://{bucket}/big/", "--json", env={**aws_env, "RQ_CACHE_DIR": str(cache_dir)})
    assert proc.returncode == 7, proc.stderr
    assert b"no space left" in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert summary(proc)["aborted"] is True
    assert_consistent({**aws_env, "RQ_CACHE_DIR": str(cache_dir)})


def test_one_vanished_object_is_a_failure_line_and_a_nonzero_exit(
    s3_client: Any, bucket: str, cache_env: dict[str, str], proxy_factory: Any
) -> None:
    seed_objects(s3_client, bucket, "g/", 10, 4096)
    gone = proxy_factory(missing=("g/00003.bin",))  # listed, then 404 on GET: deleted in between
    proc = run_rq("preload", f"s3://{bucket}/g/", "--json", "--endpoint-url", gone.endpoint, env=cache_env)
    assert proc.returncode == 3, proc.stderr
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    failed = [x for x in lines if x.get("event") == "failed"]
    assert [(f["url"], f["kind"]) for f in failed] == [(f"s3://{bucket}/g/00003.bin", "not_found")]
    s = summary(proc)
    assert s["objects"] == 9 and s["failed"] == 1
    assert_consistent(cache_env)


def test_an_index_that_cannot_record_a_batch_takes_its_files_back(
    s3_client: Any, bucket: str, cache_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Published under final names, then the index write fails (its disk filled up in between):
    the run fails with that error and no file is left under objects/ without an entry."""
    seed_objects(s3_client, bucket, "ix/", 12, 8 * 1024)
    for key, value in cache_env.items():
        monkeypatch.setenv(key, value)
    from cache import Cache, CacheFullError
    from cache.store import Store

    def full(*_: Any, **__: Any) -> None:
        raise CacheFullError("no space left for the index (injected)")

    monkeypatch.setattr(Store, "land", full)
    cache_dir = Path(cache_env["RQ_CACHE_DIR"])
    c = Cache(cache_dir)
    try:
        with pytest.raises(CacheFullError):
            c.preload([f"s3://{bucket}/ix/"], tier="disk")
        # a read-through miss lands its file already locked for its reader: taken back all the same
        with pytest.raises(CacheFullError):
            c.open(f"s3://{bucket}/ix/00003.bin")
    finally:
        c.close()
    monkeypatch.undo()
    for key, value in cache_env.items():
        monkeypatch.setenv(key, value)
    assert entry_count(cache_dir) == 0
    assert_consistent(cache_env)
