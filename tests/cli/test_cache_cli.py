"""`rq preload` and `rq cache …` at the command line: sizes, counts, exit codes and the JSON contract."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import popen_rq_with, run_rq, small_tmpfs

from rqcli.exitcodes import ExitCode


@pytest.fixture
def cache_dir(tmp_path: Path) -> Iterator[Path]:
    """A cache dir whose RAM tier is a private /dev/shm dir, removed afterwards."""
    from cache import Cache

    ram = Path("/dev/shm") / f"rqtest-{uuid.uuid4().hex[:10]}"
    Cache(tmp_path / "c", ram_dir=ram).close()
    yield tmp_path / "c"
    shutil.rmtree(ram, ignore_errors=True)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    for i in range(5):
        (d / f"{i}.bin").write_bytes(bytes([i]) * 1000)
    return d


def json_lines(out: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize("flag", ["--ram-limit", "--disk-limit"])
def test_a_size_beyond_64_bits_is_refused_and_not_stored(cache_dir: Path, src: Path, flag: str) -> None:
    before = json_lines(run_rq("cache", "du", "--json", "--cache-dir", str(cache_dir)).stdout)[0]
    res = run_rq(
        "preload", str(src), "--cache-dir", str(cache_dir), "--ram-limit", "1G", flag, "99999999999999999999P"
    )
    assert res.returncode == ExitCode.USAGE and b"out of range" in res.stderr, res.stderr
    du = run_rq("cache", "du", "--json", "--cache-dir", str(cache_dir))
    assert du.returncode == 0, du.stderr
    assert json_lines(du.stdout)[0] == before  # neither limit stored
    exact = run_rq("preload", str(src), "--cache-dir", str(cache_dir), "--disk-limit", str(2**63 - 1), "-q")
    assert exact.returncode == 0, exact.stderr


def test_dry_run_counts_what_it_would_fetch_big_objects_included(tmp_path: Path, cache_dir: Path) -> None:
    d = tmp_path / "big"
    d.mkdir()
    for name in ("a", "b"):
        with open(d / name, "wb") as fh:
            fh.truncate(64 << 20)  # sparse: big enough to be fetched in ranged pieces, no real bytes
    (d / "c").write_bytes(b"abc")
    res = run_rq("preload", str(d), "--cache-dir", str(cache_dir), "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    summary = json_lines(res.stdout)[-1]
    assert summary["event"] == "summary" and summary["dry_run"] is True
    assert (summary["objects"], summary["bytes"]) == (3, 2 * (64 << 20) + 3)
    human = run_rq("preload", str(d), "--cache-dir", str(cache_dir), "--dry-run")
    assert b"would fetch 3 objects (128.0 MiB)" in human.stdout, human.stdout


# In the rq process, listing any directory named zz fails with EIO, as a dying disk or mount does
# (a tree deeper than PATH_MAX no longer stops the run: that directory fails alone, ed9d36f).
_ZZ_FAILS = """
import errno, os
_scandir = os.scandir
def _failing(path='.'):
    if isinstance(path, (str, os.PathLike)) and os.fspath(path).endswith('zz'):
        raise OSError(errno.EIO, 'Input/output error')
    return _scandir(path)
os.scandir = _failing
"""


def _run_rq_failing_zz(*args: str) -> subprocess.CompletedProcess[bytes]:
    proc = popen_rq_with(_ZZ_FAILS, *args)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_dry_run_whose_listing_fails_summarises_what_it_planned(tmp_path: Path, cache_dir: Path) -> None:
    """A dry run prints its plan as it lists; when the listing then fails, its summary counts
    that plan and says it was a dry run (it said "stopped after 0 objects", dry_run false)."""
    d = tmp_path / "d"
    d.mkdir()
    for i in range(1000):  # the first page: planned and printed before the listing fails
        (d / f"f{i:04d}").write_bytes(b"x")
    (d / "zz").mkdir()
    res = _run_rq_failing_zz("preload", str(d), "--cache-dir", str(cache_dir), "--dry-run", "--json")
    assert res.returncode != 0 and res.stderr.decode().count("rq: error:") == 1, res.stderr.decode()
    lines = json_lines(res.stdout)
    assert sum(1 for x in lines if x["event"] == "plan") == 1000
    summary = lines[-1]
    assert summary["event"] == "summary" and summary["aborted"] is True and summary["dry_run"] is True
    assert (summary["objects"], summary["bytes"]) == (1000, 1000)
    human = _run_rq_failing_zz("preload", str(d), "--cache-dir", str(cache_dir), "--dry-run")
    assert "would fetch 1000 objects" in human.stdout.decode().splitlines()[-1]


def test_dry_run_does_not_remember_its_limits(tmp_path: Path, cache_dir: Path) -> None:
    d = tmp_path / "src"
    d.mkdir()
    (d / "a").write_bytes(b"a" * 100)
    before = json_lines(run_rq("cache", "du", "--cache-dir", str(cache_dir), "--json").stdout)[0]
    dry = run_rq("preload", str(d), "--cache-dir", str(cache_dir), "--dry-run", "--ram-limit", "10", "-q")
    assert dry.returncode == 0, dry.stderr
    after = json_lines(run_rq("cache", "du", "--cache-dir", str(cache_dir), "--json").stdout)[0]
    assert after == before  # the 10-byte RAM cap was stored and broke later runs


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "tiny", "1m") as mnt:
        yield mnt


def preload_into_full_fs(tmp_path: Path, small_fs: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    from cache import Cache

    d = tmp_path / "many"
    d.mkdir()
    for i in range(16):
        (d / f"{i:02}.bin").write_bytes(bytes([i]) * (128 << 10))  # 2 MiB into a 1 MiB file system
    ram = Path("/dev/shm") / f"rqtest-{uuid.uuid4().hex[:10]}"
    Cache(small_fs / "c", ram_dir=ram, disk_limit="1G").close()  # a cap the file system cannot honour
    try:
        return run_rq("preload", str(d), "--cache-dir", str(small_fs / "c"), *args)
    finally:
        shutil.rmtree(ram, ignore_errors=True)


def test_a_full_file_system_says_free_space_not_raise_the_cap(tmp_path: Path, small_fs: Path) -> None:
    res = preload_into_full_fs(tmp_path, small_fs)
    err = res.stderr.decode()
    assert res.returncode == ExitCode.NO_SPACE, err
    assert "free space" in err and "raise" not in err and len(err.strip().splitlines()) == 1, err


def test_an_aborted_preload_still_ends_with_its_summary(tmp_path: Path, small_fs: Path) -> None:
    res = preload_into_full_fs(tmp_path, small_fs, "--json")
    assert res.returncode == ExitCode.NO_SPACE, res.stderr
    last = json_lines(res.stdout)[-1]
    assert last["event"] == "summary" and last["aborted"] is True, last
    assert "no space" in str(last["error"]) and 0 <= int(str(last["objects"])) < 16


@pytest.fixture
def filled(cache_dir: Path, src: Path) -> Path:
    res = run_rq("preload", str(src), "--cache-dir", str(cache_dir), "-q")
    assert res.returncode == 0, res.stderr
    return cache_dir


@pytest.mark.parametrize("command", ["evict", "pin", "unpin", "ls", "verify"])
def test_a_pattern_matching_nothing_exits_3_on_every_command(filled: Path, src: Path, command: str) -> None:
    res = run_rq("cache", command, f"{src}/nope-*", "--cache-dir", str(filled))
    assert res.returncode == ExitCode.NOT_FOUND, res.stderr
    assert b"no cached entry matches" in res.stderr and len(res.stderr.splitlines()) == 1
    hit = run_rq("cache", command, f"{src}/0.bin", "--cache-dir", str(filled))
    assert hit.returncode == 0, hit.stderr


def test_every_cache_command_ends_its_json_with_one_summary(filled: Path, src: Path) -> None:
    url = f"{src}/0.bin"
    for args in (
        ["du"],
        ["stat", url],
        ["path", url],
        ["verify"],
        ["pin", url],
        ["unpin", url],
        ["evict", url],
    ):
        res = run_rq("cache", *args, "--json", "--cache-dir", str(filled))
        assert res.returncode == 0, (args, res.stderr)
        lines = json_lines(res.stdout)
        assert [x["event"] for x in lines].count("summary") == 1 and lines[-1]["event"] == "summary", args
    ls = json_lines(run_rq("cache", "ls", "--json", "--cache-dir", str(filled)).stdout)
    assert len(ls) == 4 and all(x["event"] == "entry" for x in ls)  # a listing: one line per entry
    clear = run_rq("--json", "cache", "clear", "--yes", "--cache-dir", str(filled))
    assert json_lines(clear.stdout) == [{"event": "summary", "removed": 4, "kept_open": 0}]


@pytest.mark.parametrize("where", ["before", "after"])
def test_cache_cat_refuses_json(filled: Path, src: Path, where: str) -> None:
    args = ["cache", "cat", f"{src}/1.bin", "--cache-dir", str(filled)]
    res = run_rq(*(["--json", *args] if where == "before" else [*args, "--json"]))
    assert res.returncode == ExitCode.USAGE and res.stdout == b"", res.stdout[:40]
    assert b"not JSON" in res.stderr


@pytest.mark.parametrize(("tier", "key"), [("disk", "evicted_own"), ("ram", "demoted_own")])
def test_overlapping_sources_count_what_did_not_stay_once(
    cache_dir: Path, src: Path, tier: str, key: str
) -> None:
    # src and src/sub overlap, and src2 starts with src's name: each object is counted once
    (src / "sub").mkdir()
    for i in range(2):
        (src / "sub" / f"s{i}.bin").write_bytes(bytes([10 + i]) * 1000)
    other = src.parent / (src.name + "2")
    other.mkdir()
    (other / "o.bin").write_bytes(b"o" * 1000)
    sources = [str(src), str(src / "sub"), str(other)]
    args = ["--json", "--tier", tier, f"--{tier}-limit", "2500", "--cache-dir", str(cache_dir)]
    res = run_rq("preload", *sources, *args)
    assert res.returncode == 0, res.stderr
    summary = json_lines(res.stdout)[-1]
    assert (summary["objects"], summary[key]) == (8, 6), summary  # 2 of the 8 stayed in the tier


@pytest.mark.parametrize(("tier", "key"), [("disk", "evicted_own"), ("ram", "demoted_own")])
def test_a_preload_bigger_than_its_tier_says_so(cache_dir: Path, src: Path, tier: str, key: str) -> None:
    res = run_rq(
        "preload",
        str(src),
        "--json",
        "--tier",
        tier,
        f"--{tier}-limit",
        "2500",
        "--cache-dir",
        str(cache_dir),
    )
    assert res.returncode == 0, res.stderr  # what stayed is cached and verified; the warning says the rest
    summary = json_lines(res.stdout)[-1]
    assert (summary["objects"], summary[key]) == (5, 3), summary
    assert b"3 of the 5 objects fetched did not stay in the " + tier.encode() in res.stderr, res.stderr
    again = run_rq(
        "preload", str(src), "--json", "--tier", tier, "--cache-dir", str(cache_dir), "--disk-limit", "1M"
    )
    assert json_lines(again.stdout)[-1][key] == 0 and b"did not stay" not in again.stderr


def test_inspecting_a_cache_that_does_not_exist_says_so_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    for args in (["ls"], ["du"], ["verify"], ["evict", "x"], ["clear", "--yes"]):
        r = run_rq("cache", *args, "--cache-dir", str(missing))
        assert r.returncode == 3 and b"no rq cache at" in r.stderr, (args, r.stderr)
    assert not missing.exists()  # it used to create an empty cache (and a /dev/shm root) there


# --- from a review of the docs against behaviour (2026-11-23, later session) --------------------


def test_quiet_drops_chatter_not_answers(filled: Path, src: Path) -> None:
    ls = run_rq("-q", "cache", "ls", "--cache-dir", str(filled))
    assert ls.returncode == 0 and len(ls.stdout.splitlines()) == 5, ls  # printed nothing before
    stat = run_rq("cache", "stat", f"{src}/0.bin", "-q", "--cache-dir", str(filled))
    assert b"xxh3" in stat.stdout, stat
    evict = run_rq("cache", "evict", f"{src}/0.bin", "-q", "--cache-dir", str(filled))
    assert evict.returncode == 0 and evict.stdout == b"", evict  # "evicted 1" is chatter
    du = run_rq("cache", "--json", "du", "--cache-dir", str(filled))  # was "No such option"
    assert du.returncode == 0 and json_lines(du.stdout)[-1]["disk"]["objects"] == 4, du  # type: ignore[index]


def test_clear_without_yes_and_nobody_to_ask_refuses(filled: Path) -> None:
    res = run_rq("cache", "clear", "--cache-dir", str(filled), input=b"")
    assert res.returncode == ExitCode.USAGE and b"--yes" in res.stderr, res  # cleared everything before
    ls = run_rq("cache", "ls", "--cache-dir", str(filled))
    assert len(ls.stdout.splitlines()) == 5


def test_a_dry_run_where_no_cache_exists_creates_nothing(tmp_path: Path, src: Path) -> None:
    missing = tmp_path / "typo"
    res = run_rq("preload", str(src), "--dry-run", "--json", "--cache-dir", str(missing))
    assert res.returncode == 0, res.stderr
    last = json_lines(res.stdout)[-1]
    assert last["objects"] == 5 and last["cache_dir"] == str(missing)
    assert not missing.exists()  # it created index, objects/, tmp/ and a RAM root before


def test_a_url_missing_a_slash_is_a_bad_url_in_one_line(tmp_path: Path) -> None:
    for url in ("s3:/bucket/x", "s3:bucket/x"):
        res = run_rq("preload", url, "--cache-dir", str(tmp_path / "c"))
        assert res.returncode == ExitCode.USAGE, res.stderr  # was 3, "directory not found: …/s3:/bucket/x"
        assert res.stdout == b"" and b"did you mean s3://bucket/x" in res.stderr, res


def test_a_usage_hint_names_the_subcommand(tmp_path: Path) -> None:
    for args, where in (
        (["send", "--pin"], b"rq send --help"),
        (["cache", "ls", "--cache-dir"], b"rq cache ls --help"),
    ):
        res = run_rq(*args)
        assert res.returncode == ExitCode.USAGE and where in res.stderr, res.stderr  # said `rq --help`


@pytest.fixture
def stale_s3_entry(
    cache_dir: Path,
    bucket: str,
    s3_client: object,
    aws_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[str, str]:
    """An S3 entry cached through --endpoint-url (nothing in the environment names the store), then
    changed at the origin, its last check made older than max_age: the next fresh look revalidates
    it there. Returns (url, endpoint)."""
    from cache import Cache

    endpoint = aws_env["AWS_ENDPOINT_URL"]
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    s3_client.put_object(Bucket=bucket, Key="shard.tar", Body=b"v1" * 100)  # type: ignore[attr-defined]
    url = f"s3://{bucket}/shard.tar"
    res = run_rq("preload", url, "--cache-dir", str(cache_dir), "--endpoint-url", endpoint, "-q")
    assert res.returncode == 0, res.stderr
    s3_client.put_object(Bucket=bucket, Key="shard.tar", Body=b"v2" * 100)  # type: ignore[attr-defined]
    with Cache(cache_dir) as c:
        c._state().index.mark_checked([url], 0.0)
    return url, endpoint


def test_cache_path_revalidates_a_stale_s3_entry_at_the_given_endpoint(
    cache_dir: Path, stale_s3_entry: tuple[str, str]
) -> None:
    """`rq cache path` revalidates an S3 entry older than 60 s, yet had no --endpoint-url: with a
    store that is not AWS it was "No such option" (exit 2), and without the flag it asked AWS."""
    url, endpoint = stale_s3_entry
    res = run_rq("cache", "path", url, "--cache-dir", str(cache_dir), "--endpoint-url", endpoint)
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.decode().strip()).read_bytes() == b"v2" * 100  # the new version, fetched


def test_cache_path_takes_the_endpoint_from_a_profile(
    cache_dir: Path, stale_s3_entry: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, endpoint = stale_s3_entry
    key, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    (tmp_path / "config").write_text(f"[profile rqtest]\nendpoint_url = {endpoint}\nregion = us-east-1\n")
    (tmp_path / "credentials").write_text(
        f"[rqtest]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
    )
    env = {
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
    }
    res = run_rq("cache", "path", url, "--cache-dir", str(cache_dir), "--profile", "rqtest", env=env)
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.decode().strip()).read_bytes() == b"v2" * 100


def test_cache_path_reads_its_endpoint_from_its_own_env_before_aws_endpoint_url(
    cache_dir: Path, stale_s3_entry: tuple[str, str]
) -> None:
    url, endpoint = stale_s3_entry
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "RQ_CACHE_PATH_ENDPOINT_URL": endpoint}
    res = run_rq("cache", "path", url, "--cache-dir", str(cache_dir), env=env)
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.decode().strip()).read_bytes() == b"v2" * 100


@pytest.mark.parametrize("command", ["path", "cat"])
def test_cache_commands_that_revalidate_say_a_hit_needs_the_endpoint_too(command: str) -> None:
    """`rq cache cat --help` said the endpoint was "for a miss"; a stale hit is revalidated there too."""
    res = run_rq("cache", command, "--help")
    assert res.returncode == 0, res.stderr
    text = b" ".join(res.stdout.split())
    assert b"--endpoint-url" in text and b"--profile" in text
    assert b"revalidate a stale entry" in text and b"for a miss." not in text
