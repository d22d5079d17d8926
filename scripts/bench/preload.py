#!/usr/bin/env python3
"""Preload speed beside the peers, on the SeaweedFS of scripts/services.sh, cache on local disk.

  small:  2,000 x 256 KiB   rq preload --tier disk   vs  s5cmd cp 's3://b/small/*' dir/
  large:  8 x 128 MiB       rq preload --tier disk   vs  s5cmd cp, rclone copy --multi-thread-streams 8
  hit:    10,000 x Cache.open+read of a 1 MiB RAM-tier object (p50/p99) vs open+read of the same file
  many:   10,000 and 100,000 x 100 B local files: rq preload DIR vs cp -r, for peak RSS per object
          (issue 3: memory stays bounded however big the dataset); only with --only many

    .venv/bin/python scripts/bench/preload.py --rounds 3 [--only small|large|hit|many]

Objects are seeded once (boto3: CRC32 checksums; the large ones multipart, like real shards) into the
bucket rq-bench-preload. Every round starts from an empty target directory / cache dir.
"""

from __future__ import annotations

import io
import os
import shutil
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import REPO, Bench, bench_args, s5cmd_binary, services_env, tool

BUCKET = "rq-bench-preload"
SMALL_N, SMALL_SIZE = 2000, 256 * 1024
LARGE_N, LARGE_SIZE = 8, 128 * 1024 * 1024


def s3(env: dict[str, str]) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )


def count(client: Any, prefix: str) -> int:
    n = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        n += len(page.get("Contents", []))
    return n


def seed(env: dict[str, str], which: set[str]) -> None:
    client = s3(env)
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.ClientError as exc:
        if "BucketAlready" not in str(exc):
            raise
    if "small" in which and count(client, "small/") < SMALL_N:
        blob = os.urandom(SMALL_SIZE + 4096)

        def put(i: int) -> None:
            client.put_object(
                Bucket=BUCKET, Key=f"small/{i:05d}.bin", Body=blob[i % 4096 : i % 4096 + SMALL_SIZE]
            )

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, range(SMALL_N)))
    if "large" in which and count(client, "large/") < LARGE_N:
        big = os.urandom(LARGE_SIZE)
        for i in range(LARGE_N):
            body = big[i:] + big[:i]
            client.upload_fileobj(io.BytesIO(body), BUCKET, f"large/{i:02d}.bin")


def set_aside(path: Path) -> None:
    """Moves a previous run's output into `.trash` beside it, removed only when the script ends.

    Deleting it here put thousands of just-freed inodes in front of the next run: on an ext4 without
    a journal (this VM's) every file created in the next 60 s scans past them (`recently_deleted`,
    24-66% of a run's CPU in profiles, both tools alike, varying with what was deleted when). A
    rename frees nothing, so each tool writes into a file system as a user's would be."""
    if path.exists():
        trash = path.parent / ".trash"
        trash.mkdir(exist_ok=True)
        path.rename(trash / uuid.uuid4().hex)
    # and what a run left dirty in the page cache (a peer that does not fsync leaves all it wrote)
    # is written back now, untimed: deleting it used to drop it unwritten; set aside, it would be
    # written back during the next run, whichever tool that is
    os.sync()


def fresh(path: Path) -> Any:
    def setup() -> None:
        set_aside(path)
        path.mkdir(parents=True)

    return setup


def fresh_cache(cache_dir: Path, ram_dir: Path) -> Any:
    def setup() -> None:
        set_aside(cache_dir)
        shutil.rmtree(ram_dir, ignore_errors=True)  # (tmpfs: nothing scans freed inodes there)
        cache_dir.mkdir(parents=True)
        # the RAM root this cache dir uses (so the bench never touches a real user's cache)
        from cache import Cache

        Cache(cache_dir, ram_dir=ram_dir).close()

    return setup


def rclone_cmd(env: dict[str, str], src: str, dst: Path) -> list[str]:
    # Debian's rclone 1.60 fails when AWS_CA_BUNDLE is set (FIELD-NOTES): run it without
    return [
        "env",
        "-u",
        "AWS_CA_BUNDLE",
        tool("rclone"),
        "copy",
        "--multi-thread-streams",
        "8",
        f"x:{src}",
        str(dst),
    ]


def rclone_env(env: dict[str, str]) -> dict[str, str]:
    return {
        **env,
        "RCLONE_CONFIG_X_TYPE": "s3",
        "RCLONE_CONFIG_X_PROVIDER": "Other",
        "RCLONE_CONFIG_X_ENDPOINT": env["AWS_ENDPOINT_URL"],
        "RCLONE_CONFIG_X_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
        "RCLONE_CONFIG_X_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"],
        "RCLONE_CONFIG_X_REGION": "us-east-1",
    }


def bench_transfer(
    name: str, prefix: str, n: int, size: int, peers: list[str], rounds: int, env: dict[str, str], work: Path
) -> None:
    cache_dir, ram_dir = work / "rq-cache", Path("/dev/shm") / f"rq-bench-{os.getpid()}"
    out = work / "peer-out"
    bench = Bench(
        f"preload-{name}",
        rounds=rounds,
        nbytes=n * size,
        nitems=n,
        description=f"{n} x {size // 1024} KiB from SeaweedFS to local disk (cache dir on {work})",
    )
    endpoint = env["AWS_ENDPOINT_URL"]
    if "s5cmd" in peers:
        bench.add(
            "s5cmd cp",
            [s5cmd_binary(), "--endpoint-url", endpoint, "cp", f"s3://{BUCKET}/{prefix}/*", f"{out}/"],
            setup=fresh(out),
            env=env,
        )
        # not the baseline: the same copy made durable (`sync`), which is what rq's default does with
        # its syncfs per landing batch; shown so the ratio can be read against like-for-like work
        s5 = " ".join(
            [s5cmd_binary(), "--endpoint-url", endpoint, "cp", f"'s3://{BUCKET}/{prefix}/*'", f"{out}/"]
        )
        bench.add("s5cmd cp && sync", ["bash", "-c", f"{s5} >/dev/null && sync"], setup=fresh(out), env=env)
    if "rclone" in peers:
        bench.add(
            "rclone copy mts8",
            rclone_cmd(env, f"{BUCKET}/{prefix}", out),
            setup=fresh(out),
            env=rclone_env(env),
        )
    bench.add(
        "rq preload",
        [
            tool("rq"),
            "preload",
            f"s3://{BUCKET}/{prefix}/",
            "--tier",
            "disk",
            "--cache-dir",
            str(cache_dir),
            "-q",
        ],
        setup=fresh_cache(cache_dir, ram_dir),
        env=env,
    )
    # the same rq without fsync before publish: not the default, only here to show what fsync costs
    bench.add(
        "rq preload --no-fsync",
        [tool("rq"), "preload", f"s3://{BUCKET}/{prefix}/", "--tier", "disk", "--cache-dir", str(cache_dir), "-q",
         "--no-fsync"],
        setup=fresh_cache(cache_dir, ram_dir),
        env=env,
    )  # fmt: skip
    try:
        result = bench.run()
    finally:
        shutil.rmtree(ram_dir, ignore_errors=True)
        set_aside(out)  # (the next set's runs must not meet these freed either; main() removes them)
        set_aside(cache_dir)
    table = result.table()
    baseline = min(
        (c for c in table if not c.startswith("rq ") and not c.endswith("&& sync")),
        key=lambda c: table[c]["wall_median_s"],
    )
    result.report(
        baseline=baseline,
        subject="rq preload",
        target=1.0,
        notes=(
            "rq verifies every object as it lands (CRC32 checksum header or MD5 ETag; composite CRC32 for "
            "multipart objects), records an xxh3 digest, fsyncs each file before its atomic rename and "
            "commits the SQLite index; the peers only write the bytes. Baseline = the faster peer "
            "(without sync). `s5cmd cp && sync` is not the baseline: it is the same copy made durable. "
            "`rq preload --no-fsync` (not the default) is listed only to show what the fsyncs cost. "
            "Every run writes into a new directory: earlier runs' files are renamed aside and deleted "
            "when the script ends, so no run creates files among just-freed inodes (this VM's ext4 has "
            "no journal and scans those on every file it creates); each run's setup syncs what earlier "
            "runs left dirty, so no run pays for another's writeback."
        ),
    )


def bench_hit(rounds: int, env: dict[str, str], work: Path) -> None:
    from cache import Cache

    cache_dir, ram_dir = work / "rq-cache-hit", Path("/dev/shm") / f"rq-bench-hit-{os.getpid()}"
    fresh_cache(cache_dir, ram_dir)()
    client = s3(env)
    client.put_object(Bucket=BUCKET, Key="hit/one-mib.bin", Body=os.urandom(1 << 20))
    for key, value in env.items():
        os.environ.setdefault(key, value)
    url = f"s3://{BUCKET}/hit/one-mib.bin"
    c = Cache(cache_dir)
    c.preload([url.rsplit("/", 1)[0] + "/"], tier="ram")
    assert c.stat(url).tier == "ram"
    path = c.path(url)
    reads = 10_000
    lat: dict[str, list[float]] = {"rq": [], "raw": []}

    def via_cache() -> dict[str, Any]:
        times = []
        for _ in range(reads):
            t = time.perf_counter()
            with c.open(url) as fh:
                fh.read()
            times.append(time.perf_counter() - t)
        lat["rq"] = times
        return pct(times)

    def via_file() -> dict[str, Any]:
        times = []
        for _ in range(reads):
            t = time.perf_counter()
            with open(path, "rb") as fh:
                fh.read()
            times.append(time.perf_counter() - t)
        lat["raw"] = times
        return pct(times)

    bench = Bench(
        "cache-hit-1mib-ram",
        rounds=rounds,
        nitems=reads,
        description="10,000 x open+read of a 1 MiB RAM-tier object: Cache.open (xxh3-verified) vs plain open()",
    )
    bench.add("plain open+read", via_file)
    bench.add("Cache.open+read", via_cache)
    result = bench.run()
    p = pct(lat["rq"])
    result.report(
        baseline="plain open+read",
        subject="Cache.open+read",
        notes=f"Cache.open+read latency, last round: p50 {p['p50_us']:.0f} µs, p99 {p['p99_us']:.0f} µs "
        f"(target p99 ≤ 1000 µs); includes the index lookup, shared lock and xxh3 check.",
    )
    print(f"Cache.open+read p50 {p['p50_us']:.0f} us  p99 {p['p99_us']:.0f} us")
    c.close()
    shutil.rmtree(ram_dir, ignore_errors=True)
    shutil.rmtree(cache_dir, ignore_errors=True)


def bench_many(rounds: int, work: Path) -> None:
    """Peak RSS against the number of objects: the same tiny files, 10x more of them."""
    ram_dir = Path("/dev/shm") / f"rq-bench-many-{os.getpid()}"
    for n in (10_000, 100_000):
        src, out, cache_dir = work / f"many-{n}", work / "many-out", work / "many-cache"
        for i in range(n):
            sub = src / f"d{i // 1000:03d}"
            if i % 1000 == 0:
                sub.mkdir(parents=True)
            (sub / f"f{i % 1000:03d}.bin").write_bytes(b"%099d\n" % i)
        bench = Bench(
            f"preload-many-{n // 1000}k",
            rounds=rounds,
            nitems=n,
            description=f"{n:,} x 100 B local files into a local cache dir: peak RSS per object",
        )
        bench.add("cp -r", ["cp", "-r", str(src), str(out)], setup=fresh_missing(out))
        rq = [tool("rq"), "preload", str(src), "--tier", "disk", "--cache-dir", str(cache_dir), "-q"]
        bench.add("rq preload DIR", rq, setup=fresh_cache(cache_dir, ram_dir))
        # the two modes that held the whole listing until the eighth session: a dry run (its plan
        # lines go to /dev/null) and the RAM tier (which first asks whether the set fits its cap)
        bench.add("rq preload --dry-run", [*rq, "--dry-run", "--json"], setup=fresh_cache(cache_dir, ram_dir))
        ram = [*rq[:3], "--tier", "ram", "--ram-limit", "2G", *rq[5:]]
        bench.add("rq preload --tier ram", ram, setup=fresh_cache(cache_dir, ram_dir))
        try:
            result = bench.run()
        finally:
            shutil.rmtree(ram_dir, ignore_errors=True)
            for path in (src, out, cache_dir):
                shutil.rmtree(path, ignore_errors=True)
        rss = {case: row["peak_rss_mib"] for case, row in result.table().items()}
        result.report(
            baseline="cp -r",
            subject="rq preload DIR",
            notes=f"Peak RSS: rq {rss['rq preload DIR']:.0f} MiB (--dry-run {rss['rq preload --dry-run']:.0f}, "
            f"--tier ram {rss['rq preload --tier ram']:.0f}), cp {rss['cp -r']:.0f} MiB. Compare with the other "
            "size: what grows with the number of objects is the memory rq keeps per object. rq also "
            "hashes, fsyncs and indexes each file; cp only copies.",
        )


def fresh_missing(path: Path) -> Any:
    def setup() -> None:
        shutil.rmtree(path, ignore_errors=True)  # cp -r SRC OUT copies into OUT only when OUT is absent

    return setup


def pct(times: list[float]) -> dict[str, Any]:
    ordered = sorted(times)
    return {
        "p50_us": statistics.median(ordered) * 1e6,
        "p99_us": ordered[int(len(ordered) * 0.99) - 1] * 1e6,
        "max_us": ordered[-1] * 1e6,
    }


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


def main() -> None:
    parser = bench_args(__doc__ or "")
    parser.add_argument("--only", choices=["small", "large", "hit", "many"], action="append")
    parser.add_argument("--seed-only", action="store_true", help=argparse_hidden())
    args = parser.parse_args()
    which = set(args.only or ["small", "large", "hit"])
    env = services_env()
    if args.seed_only:
        seed(env, which)
        return
    # seed in a child: the large set's buffers would otherwise inflate every forked case's peak RSS
    import subprocess
    import sys

    only = [a for w in sorted(which) for a in ("--only", w)]
    if which - {"many"}:
        subprocess.run([sys.executable, __file__, "--seed-only", *only], check=True)
    work = Path(tempfile.mkdtemp(prefix="rq-bench-preload-", dir="/var/tmp"))
    try:
        if "small" in which:
            bench_transfer("small-2000x256k", "small", SMALL_N, SMALL_SIZE, ["s5cmd"], args.rounds, env, work)
        if "large" in which:
            bench_transfer(
                "large-8x128m", "large", LARGE_N, LARGE_SIZE, ["s5cmd", "rclone"], args.rounds, env, work
            )
        if "hit" in which:
            bench_hit(args.rounds, env, work)
        if "many" in which:
            bench_many(args.rounds, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(REPO))
    main()
