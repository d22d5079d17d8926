"""Edge cases found by a second review with real files and a real S3 store: verify racing other
preloads, preloads interrupted early, demotions counted for the disk tier, failed runs leaving
a cache behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from cachekit import local_source
from rqtest import popen_rq, run_rq

import cache.api
from cache import Cache
from cache.index import Index
from cache.store import lock_exclusive, unlink_quiet


def _relanding_check(cache_: Cache, url: str, tier: str) -> Any:
    """A `_check_blob` that, the first time it looks at `url`, first lets another process evict
    the entry and then lands it again (same URL and version: the same file name) before the
    index is read again: the window a verify beside busy preloads falls into."""
    real = cache.api._check_blob
    done: list[str] = []

    def check(path: Path, entry: Any) -> str | None:
        if entry.url != url or done:
            return real(path, entry)
        done.append(url)
        evicted, _ = cache_.evict(url)
        assert evicted == 1
        problem = real(path, entry)  # the file is gone just now
        assert problem == "missing file"
        cache_.preload([url], tier=tier)
        return problem

    return check


@pytest.mark.parametrize("tier", ["ram", "disk"])
@pytest.mark.parametrize("repair", [False, True])
def test_verify_does_not_call_an_entry_landed_again_meanwhile_corrupt(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch, tier: str, repair: bool
) -> None:
    """`rq cache verify` beside preloads that fill and evict the cache exited 5 ('N corrupt
    entries … missing file') on a healthy cache: an entry evicted and landed again between the
    file check and the index re-read names the same (tier, blob, xxh3), so the missing file was
    reported, and --repair dropped the good new entry. The landing's `created` stamp now tells
    them apart: nothing is reported and the entry stays."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}").write_bytes(os.urandom(5000) + bytes([i]))
    url = str(src / "f2")
    c = Cache(tmp_path / "cache", ram_dir=ram_dir)
    try:
        c.preload([str(src)], tier=tier)
        before = c.stat(url)
        monkeypatch.setattr(cache.api, "_check_blob", _relanding_check(c, url, tier))
        checked, problems = c.verify(repair=repair)
        assert checked == 4
        assert problems == []
        after = c.stat(url)  # landed again (a new stamp), kept, sound
        assert (after.tier, after.blob) == (before.tier, before.blob) and after.created != before.created
        with c.open(url) as f:
            assert f.read() == (src / "f2").read_bytes()
        monkeypatch.undo()
        assert c.verify() == (4, [])
    finally:
        c.close()


def test_verify_still_reports_a_file_that_is_really_missing(tmp_path: Path, ram_dir: Path) -> None:
    """The other side: a file gone under an entry the index still names is reported, and
    --repair drops that entry (only that one)."""
    src = local_source(tmp_path / "src", 3, 3000)
    c = Cache(tmp_path / "cache", ram_dir=ram_dir)
    try:
        c.preload([str(src)], tier="disk")
        url = str(src / "f1")
        c.path(url).unlink()
        checked, problems = c.verify(repair=True)
        assert checked == 3 and [(p.url, p.problem) for p in problems] == [(url, "missing file")]
        assert sorted(e.url for e in c.entries()) == [str(src / "f0"), str(src / "f2")]
    finally:
        c.close()


def test_a_landing_never_adopts_a_twin_that_is_being_evicted(
    tmp_path: Path, cache_env: dict[str, str]
) -> None:
    """The real cause behind verify's 'missing file' beside busy preloads: a RAM entry being
    evicted (its row gone, its file locked while it is demoted) and a `--tier ram` preload landing
    the same URL again. link() found the old file under the name, the preload kept it as an
    identical twin and indexed it, and the evictor then unlinked it: the new row named a missing
    file until a later run landed it again. The landing now waits for the evictor and links its
    own file."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(os.urandom(200_000))
    url = str(src / "f")
    c = Cache(Path(cache_env["RQ_CACHE_DIR"]))
    try:
        c.preload([str(src)], tier="ram")
        entry = c.stat(url)
        path = c.layout.blob_path("ram", entry.blob)
        store = c._state().store
        # what an evictor in another process does (Store._pick_victims), up to its unlink
        fd = lock_exclusive(path)
        assert fd is not None and fd >= 0
        with c._state().index.write() as db:
            Index.delete(db, url)
            hid = Index.add_hold(db, "ram", entry.size, "evicting", entry.blob, url, store.owner)
        proc = popen_rq("preload", str(src), "--tier", "ram", "--json", env={**cache_env, "CI": "1"})
        try:
            tmp = c.layout.tier_root("ram") / "tmp"
            seen = waited = 0.0
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                parts = [p for p in tmp.iterdir() if p.name.endswith(".part")]
                if parts and not seen:
                    seen = time.monotonic()  # written; adopting the twin would remove it at once
                elif seen and not parts:
                    break  # it published (the old code: adopted the twin)
                elif seen and time.monotonic() - seen > 1.5:
                    waited = time.monotonic() - seen  # waiting for us: the new code
                    break
                time.sleep(0.01)
        finally:
            unlink_quiet(path)  # the evictor finishes: unlink, unlock, drop its hold
            os.close(fd)
            with c._state().index.write() as db:
                Index.drop_hold(db, hid)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        assert c.verify() == (1, []), f"waited {waited:.1f} s"
        with c.open(url) as f:
            assert f.read() == (src / "f").read_bytes()
    finally:
        c.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_preload_interrupted_while_it_opens_the_cache_still_ends_with_its_summary(
    tmp_path: Path, aws_env: dict[str, str], sig: signal.Signals
) -> None:
    """SIGTERM or Ctrl-C in the first ~0.1 s of `rq preload --json` (while the cache library was
    imported and the cache opened) exited 130 with no summary on stdout; docs/cli.md promises it
    comes last. The signal is sent the moment the new cache's index appears, a few times."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"f{i}").write_bytes(os.urandom(2000) + bytes([i]))
    stopped = 0
    for attempt in range(4):
        cache_dir = tmp_path / f"cache{attempt}"
        proc = popen_rq(
            "preload", str(src), "--json", "--cache-dir", str(cache_dir), env={**aws_env, "CI": "1"}
        )
        try:
            deadline = time.monotonic() + 30
            while not (cache_dir / "index.sqlite3").exists() and proc.poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.0005)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(OSError):
                shutil.rmtree(os.readlink(cache_dir / "ram"), ignore_errors=True)
        if proc.returncode == 0:
            continue  # it finished before the signal came
        stopped += 1
        assert proc.returncode == 130, err.decode()
        lines = out.decode().splitlines()
        assert lines, f"exit 130 with nothing on stdout: no summary ({err.decode().strip()})"
        last = json.loads(lines[-1])
        assert last["event"] == "summary" and last["aborted"] is True, out.decode()
        assert last["error"] == ("stopped by SIGTERM" if sig == signal.SIGTERM else "interrupted")
        assert err.decode().splitlines()[-1] == f"rq: {last['error']}"
    assert stopped, "every run finished before the signal: nothing was tested"


def test_a_disk_preload_does_not_count_a_parallel_ram_preload_as_its_demotions(
    tmp_path: Path, cache_env: dict[str, str]
) -> None:
    """A disk-tier preload over its cap, beside a `--tier ram` preload under the same source,
    reported the other run's new RAM entries as its own demotions (`demoted_own` 21, '84 … did
    not stay in the disk tier (63 evicted, 21 moved to disk)'); docs/cli.md says demoted_own is
    for --tier ram only. The RAM preload here runs (a real rq) while the disk run lands."""
    from cache import events as ev

    src = tmp_path / "src"
    for sub, n in (("a", 30), ("z", 6)):
        (src / sub).mkdir(parents=True)
        for i in range(n):
            (src / sub / f"f{i}").write_bytes(os.urandom(10_000) + bytes([i]))
    cache_dir = Path(cache_env["RQ_CACHE_DIR"])
    ran: list[int] = []

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.Landed) and not ran:
            proc = run_rq("preload", str(src / "z"), "--tier", "ram", "--json", env=cache_env)
            ran.append(proc.returncode)
            assert proc.returncode == 0, proc.stderr.decode()

    c = Cache(cache_dir, disk_limit=150_000)
    try:
        result = c.preload([str(src)], tier="disk", exclude=["z/*"], on_event=on_event)
        assert ran == [0] and result.objects == 30 and result.failed == []
        assert sum(e.tier == "ram" for e in c.entries()) == 6  # the other run's, under our source
        assert result.demoted_own == 0
        assert 0 < result.evicted_own < 30
    finally:
        c.close()


@pytest.mark.parametrize("source", ["notaurl://x/", "s3:/bucket/x", "s3://"])
def test_a_bad_source_creates_no_cache(tmp_path: Path, aws_env: dict[str, str], source: str) -> None:
    """`rq preload notaurl://x/ --cache-dir D` (exit 2) still created D (index.sqlite3, objects/,
    tmp/, the ram link) and a RAM root under /dev/shm. The sources are now checked first."""
    cache_dir = tmp_path / "cache"
    proc = run_rq("preload", source, "--cache-dir", str(cache_dir), "--json", env=aws_env)
    assert proc.returncode == 2, proc.stderr.decode()
    assert not cache_dir.exists()
    assert len(proc.stderr.decode().strip().splitlines()) == 1
    assert json.loads(proc.stdout.decode().splitlines()[-1])["aborted"] is True
