"""Under a container's memory limit the RAM tier's tmpfs pages count against the cgroup, so the
default RAM cap (a quarter of /dev/shm, sized by the node) got `--tier ram` OOM-killed. A new
cache's default RAM cap is now also at most half the cgroup's memory limit (v1 or v2, the lowest
of the group and those above it); an unlimited group changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cachekit import V1_MEMORY as V1
from cachekit import v1_memory_group

import cache.api
from cache import Cache
from cache.sizes import cgroup_memory_limit


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v2_lowest_limit_of_the_group_and_above(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(tmp_path / "self", "0::/a/b/c\n")
    _write(root / "a" / "memory.max", "1073741824\n")
    _write(root / "a" / "b" / "memory.max", "max\n")
    _write(root / "a" / "b" / "c" / "memory.max", "2147483648\n")
    assert cgroup_memory_limit(str(root), str(tmp_path / "self")) == 1 << 30
    _write(root / "a" / "memory.max", "max\n")
    assert cgroup_memory_limit(str(root), str(tmp_path / "self")) == 2 << 30


def test_v2_unlimited_or_unreadable_is_none(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(tmp_path / "self", "0::/\n")
    assert cgroup_memory_limit(str(root), str(tmp_path / "self")) is None
    _write(root / "memory.max", "max\n")
    assert cgroup_memory_limit(str(root), str(tmp_path / "self")) is None
    assert cgroup_memory_limit(str(root), str(tmp_path / "no-such-file")) is None


def test_v1_memory_controller_and_a_host_path_not_under_the_mount(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(
        tmp_path / "self",
        "9:name=systemd:/\n4:memory:/docker/abc\n3:cpuset:/\n0::/\n",
    )
    # inside a container: /sys/fs/cgroup/memory is the container's own group, its host path absent
    _write(root / "memory" / "memory.limit_in_bytes", "536870912\n")
    _write(root / "cpuset" / "memory.limit_in_bytes", "1\n")  # not the memory controller's
    assert cgroup_memory_limit(str(root), str(tmp_path / "self")) == 512 << 20
    _write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")  # v1's unlimited
    assert cgroup_memory_limit(str(root), str(tmp_path / "self")) is None
    _write(tmp_path / "self", "4:cpuacct,memory:/docker/abc\n")
    _write(root / "memory" / "docker" / "abc" / "memory.limit_in_bytes", "268435456\n")
    assert cgroup_memory_limit(str(root), str(tmp_path / "self")) == 256 << 20


def test_default_ram_cap_is_at_most_half_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache.api, "cgroup_memory_limit", lambda: 64 << 20)
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram") as c:
        assert c.caps["ram"] == min(
            32 << 20, os.statvfs(tmp_path / "ram").f_blocks * os.statvfs(tmp_path / "ram").f_frsize // 4
        )
    monkeypatch.setattr(cache.api, "cgroup_memory_limit", lambda: None)
    with Cache(tmp_path / "c2", ram_dir=tmp_path / "ram2") as c:
        fs = os.statvfs(tmp_path / "ram2")
        assert c.caps["ram"] == fs.f_blocks * fs.f_frsize // 4


@pytest.mark.skipif(
    os.geteuid() != 0 or not (V1 / "cgroup.procs").exists() or not os.access(V1, os.W_OK),
    reason="needs root and a writable cgroup v1 memory hierarchy",
)
def test_in_a_v1_memory_cgroup(tmp_path: Path) -> None:
    with v1_memory_group(96 << 20) as group:
        ram = tmp_path / "ram"
        code = (
            f"open({str(group / 'cgroup.procs')!r}, 'w').write(str(__import__('os').getpid()))\n"
            "from cache import Cache\n"
            f"c = Cache({str(tmp_path / 'c')!r}, ram_dir={str(ram)!r})\n"
            "from cache.sizes import cgroup_memory_used\n"
            f"print(c.caps['ram'], cgroup_memory_used({96 << 20}))\nc.close()\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
        fs = os.statvfs(ram)
        cap, used = map(int, out.stdout.split())
        # half the limit, and half of what the group's use (this child: Python, the cache) leaves
        # of it (tests/cache/test_lead_ram_room.py); its use grows a little after the cap is set
        expected = min(48 << 20, ((96 << 20) - used) // 2, fs.f_blocks * fs.f_frsize // 4)
        assert used > 0 and abs(cap - expected) <= 2 << 20 and cap < 48 << 20, (cap, used)
