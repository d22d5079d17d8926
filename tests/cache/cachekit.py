"""Helpers for the cache tests (a unique module name: tests/ has several conftest.py files)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

V1_MEMORY = Path("/sys/fs/cgroup/memory")


@contextlib.contextmanager
def v1_memory_group(limit: int, prefix: str = "rq-test") -> Iterator[Path]:
    """A child cgroup v1 memory group with `limit` (skips the test where one cannot be made);
    removed after, once the processes put in it have exited and the kernel has reaped them."""
    group = V1_MEMORY / f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a v1 memory cgroup: {exc}")
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit))
        yield group
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise  # (saying why it stays)
                time.sleep(0.05)


def payload(i: int, size: int) -> bytes:
    """Deterministic, incompressible-enough content for object i."""
    seed = hashlib.sha256(f"obj-{i}-{size}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def local_source(root: Path, n: int, size: int) -> Path:
    """A directory `root` of n distinct random files f0..f{n-1} of `size` + 1 bytes: a local origin."""
    root.mkdir()
    for i in range(n):
        (root / f"f{i}").write_bytes(os.urandom(size) + bytes([i]))
    return root


def seed_objects(s3: Any, bucket: str, prefix: str, n: int, size: int) -> dict[str, bytes]:
    data = {f"{prefix}{i:05d}.bin": payload(i, size) for i in range(n)}
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), data.items()))
    return data


def tree_files(root: Path) -> dict[str, int]:
    out = {}
    for base, _, files in os.walk(root):
        for name in files:
            p = Path(base) / name
            try:
                out[str(p)] = p.stat().st_size
            except FileNotFoundError:
                pass
    return out


def tree_bytes(*roots: Path) -> int:
    """Bytes of the files under roots, each inode once (a file being published has two names)."""
    seen: dict[tuple[int, int], int] = {}
    for root in roots:
        for base, _, files in os.walk(root):
            for name in files:
                try:
                    st = os.lstat(os.path.join(base, name))
                except FileNotFoundError:
                    continue
                seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def summary(proc: Any) -> dict[str, Any]:
    """The final `{"event": "summary", …}` line of a `--json` run."""
    lines = [json.loads(x) for x in proc.stdout.decode().splitlines() if x.strip()]
    return next(x for x in reversed(lines) if x.get("event") == "summary")


def entry_count(cache_dir: Path) -> int:
    from cache import Cache

    with Cache(cache_dir) as c:
        return len(c.entries())


def assert_consistent(cache_env: dict[str, str]) -> None:
    """Every entry verifies; one file per entry under objects/ (both tiers); tmp/ is empty."""
    from rqtest import run_rq  # (here: reader subprocesses import this kit without tests/ on the path)

    verify = run_rq("cache", "verify", "--json", env=cache_env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    from cache import Cache

    cache_dir = Path(cache_env["RQ_CACHE_DIR"])
    ram_root = Cache(cache_dir).layout.ram_root
    on_disk = len(tree_files(cache_dir / "objects")) + len(tree_files(ram_root / "objects"))
    assert on_disk == entry_count(cache_dir)
    leftovers = {**tree_files(cache_dir / "tmp"), **tree_files(ram_root / "tmp")}
    assert leftovers == {}, leftovers


# Fills the file system of `path` (a small tmpfs in the tests) to the last byte, in the script of
# a test that runs in a private mount namespace (unshared): call fill(path) there.
FILL = r"""
def fill(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for size in (1 << 20, 4096, 512, 1):
        try:
            while True:
                os.write(fd, b"\0" * size)
        except OSError:
            pass
    os.close(fd)
"""


def unshared(script: str, tmp_path: Path) -> Any:
    """What `script` (Python, run as root in a private mount namespace, where it may mount tmpfs
    file systems; sys.argv[1] is tmp_path) prints last, as JSON."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(root)},
        cwd=str(root),
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def cache_with_both_tiers(tmp_path: Path) -> tuple[Path, Path]:
    """A cache at tmp_path/c holding src/d in its disk tier and src/r in its RAM tier (whose root
    comes from wherever the caller pointed default_ram_root); returns (src, the RAM root)."""
    from cache import Cache

    src = tmp_path / "src"
    src.mkdir()
    (src / "d").write_bytes(b"disk")
    (src / "r").write_bytes(b"ram")
    with Cache(tmp_path / "c") as c:
        c.preload([str(src / "d")], tier="disk")
        c.preload([str(src / "r")], tier="ram")
        assert {e.tier for e in c.entries()} == {"ram", "disk"}
        return src, c.layout.ram_root


def preload_disk_cmd(src: Path, cache: Path, *extra: str) -> list[str]:
    """`rq preload SRC/ --cache-dir CACHE --tier disk EXTRA…`, run by this interpreter."""
    return [
        sys.executable,
        "-m",
        "rqcli",
        "preload",
        f"{src}/",
        "--cache-dir",
        str(cache),
        "--tier",
        "disk",
        *extra,
    ]
