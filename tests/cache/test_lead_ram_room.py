"""The RAM tier beside the rest of a container (ct's findings A, B, C).

A: in a 150 MiB memory cgroup with a 70 MiB trainer, `rq preload --tier ram` took half the limit
(75 MiB) as its default cap, whatever the group already used, and the trainer was OOM-killed. The
default cap (and the bound on a recorded one) is now half of what the group's use leaves of the
limit, and a cap that with that use would pass the limit is warned about at the start.
B: a dataset bigger than a 64 MiB /dev/shm (16 MiB cap) sent its tail to disk as "no space left
… 3.9 MiB free" with 48 MiB free: the admission counted the whole batch as resident at once.
C: `--ram-limit 200M` on a 64 MiB /dev/shm filled it to 60 MiB (others then failed ENOSPC) and was
warned about only at the end; rq now keeps ram_fs_share of it at most and says so at the start;
`rq doctor`'s hint names --shm-size and emptyDir, not only a remount a container cannot do."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cachekit import V1_MEMORY as V1
from cachekit import unshared, v1_memory_group

import cache.api
import cache.sizes
from cache import Cache

MIB = 1 << 20
NAMESPACES = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) for a mount namespace",
)


def _group(monkeypatch: pytest.MonkeyPatch, limit: int, used: int) -> None:
    """A cgroup limit and the group's use, as cache.api and the CLI read them."""
    for module in (cache.api, cache.sizes):
        monkeypatch.setattr(module, "cgroup_memory_limit", lambda *a, **k: limit)
    monkeypatch.setattr(cache.api, "cgroup_memory_used", lambda *a, **k: used, raising=False)


def test_a_default_cap_leaves_room_for_what_the_group_uses(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Cache(tmp_path / "old", ram_dir=ram_dir).close()  # made on the host: a big recorded cap
    _group(monkeypatch, 150 * MIB, 110 * MIB)  # a trainer and rq itself: 40 MiB left
    with Cache(tmp_path / "new", ram_dir=tmp_path / "ram-new") as c:
        assert c.caps["ram"] == 20 * MIB  # half of what is left (was 75 MiB: half the limit)
    with Cache(tmp_path / "old", ram_dir=ram_dir) as c:
        assert c.caps["ram"] == 20 * MIB
        assert c.ram_cap_note is not None and "150.0 MiB, 110.0 MiB of it in use" in c.ram_cap_note


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_busy_moment_is_not_recorded_as_the_cap(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dr5: the default cap, bounded by what the group used at that moment, was recorded: a cache
    made while the group was busy (or full of page cache) kept a fraction of the room, or 0 B, for
    good. The recorded default is half the limit; the use bounds each open only."""
    _group(monkeypatch, 150 * MIB, 150 * MIB)  # full at this moment
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        assert c.caps["ram"] == 0
    _group(monkeypatch, 150 * MIB, 10 * MIB)  # the moment passed
    with Cache(tmp_path / "c", ram_dir=ram_dir) as c:
        assert c.caps["ram"] == min(
            70 * MIB, os.statvfs(ram_dir).f_blocks * os.statvfs(ram_dir).f_frsize // 4
        )
        # (old: 0 B, recorded)


def test_a_group_use_is_read_without_reclaimable_file_cache(tmp_path: Path) -> None:
    from cache.sizes import cgroup_memory_used

    cg, me = tmp_path / "cg", tmp_path / "self"
    _write(me, "0::/a/b\n")
    _write(cg / "a" / "memory.max", "max\n")
    _write(cg / "a" / "b" / "memory.max", str(150 * MIB))
    _write(cg / "a" / "b" / "memory.current", str(120 * MIB))
    # the file cache (active or not) is taken off, its tmpfs/shmem part (a RAM tier's) is not (dr5)
    _write(cg / "a" / "b" / "memory.stat", f"anon 1\nfile {40 * MIB}\nshmem {10 * MIB}\n")
    assert cgroup_memory_used(150 * MIB, str(cg), str(me)) == 90 * MIB
    assert cgroup_memory_used(64 * MIB, str(cg), str(me)) == 0  # no group has that limit
    _write(me, "4:memory:/docker/x\n")  # v1, the container's group at the mount's root
    _write(cg / "memory" / "memory.limit_in_bytes", str(150 * MIB))
    _write(cg / "memory" / "memory.usage_in_bytes", str(100 * MIB))
    _write(cg / "memory" / "memory.stat", f"cache 1\ntotal_cache {30 * MIB}\ntotal_shmem {10 * MIB}\n")
    assert cgroup_memory_used(150 * MIB, str(cg), str(me)) == 80 * MIB


def test_a_cap_that_would_pass_the_limit_is_warned_about_at_the_start(
    tmp_path: Path, ram_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rqcli.main import main

    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a" * 1000)
    Cache(tmp_path / "c", ram_dir=ram_dir).close()
    _group(monkeypatch, 150 * MIB, 110 * MIB)
    with pytest.raises(SystemExit) as exc:  # 60M: under half the limit, over what is left
        main(["--config", "/dev/null", "preload", str(src), "--cache-dir", str(tmp_path / "c"),
              "--tier", "ram", "--ram-limit", "60M"])  # fmt: skip
    assert exc.value.code == 0
    err = capsys.readouterr().err
    assert "--ram-limit 60.0 MiB with the 110.0 MiB this cgroup uses now" in err, err
    assert "passes its memory limit of 150.0 MiB" in err and "20.0 MiB is safe" in err, err


TRAINER = "import time; b = bytearray(70 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"

IN_GROUP = r"""
import json, os, subprocess, sys, time
from pathlib import Path

base, group = Path(sys.argv[1]), sys.argv[2]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", "/dev/shm"], check=True)
open(f"{group}/cgroup.procs", "w").write(str(os.getpid()))  # the trainer and rq: in the group
src = base / "src"
src.mkdir()
for i in range(30):
    (src / f"f{i:02}").write_bytes(os.urandom(4 << 20))
trainer = subprocess.Popen([sys.executable, "-c", TRAINER])
time.sleep(1.0)
run = subprocess.run(
    [sys.executable, "-m", "rqcli", "--config", "/dev/null", "preload", str(src), "--cache-dir",
     str(base / "c"), "--tier", "ram"],
    capture_output=True, text=True, timeout=60,
)
alive = trainer.poll() is None
trainer.kill()
trainer.wait()
print(json.dumps([run.returncode, run.stderr, alive]))
"""


@NAMESPACES
@pytest.mark.skipif(
    not (V1 / "cgroup.procs").exists() or not os.access(V1, os.W_OK),
    reason="needs a writable cgroup v1 memory hierarchy for a child group",
)
def test_a_trainer_beside_a_ram_preload_in_a_150m_group_is_not_killed(tmp_path: Path) -> None:
    with v1_memory_group(150 * MIB, "rq-test-room") as group:
        script = f"TRAINER = {TRAINER!r}\n" + IN_GROUP.replace("sys.argv[2]", repr(str(group)))
        rc, stderr, alive = unshared(script, tmp_path)
        assert rc == 0, stderr
        assert alive, f"the trainer was killed (the RAM tier passed the group's limit): {stderr}"


# a 64 MiB /dev/shm (Docker's default) in a private mount namespace, rq's own RAM root in it
SHM64 = r"""
import json, os, subprocess, sys
from pathlib import Path

base = Path(sys.argv[1])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", "/dev/shm"], check=True)
src = base / "src"
src.mkdir()
for i in range(20):
    (src / f"f{i:02}").write_bytes(os.urandom(4 << 20))
run = subprocess.run(
    [sys.executable, "-m", "rqcli", "--config", "/dev/null", "preload", str(src), "--cache-dir",
     str(base / "c"), "--tier", "ram", "--json"] + sys.argv[2:],
    capture_output=True, text=True, timeout=60,
)
fs = os.statvfs("/dev/shm")
used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
try:  # another user of /dev/shm (a DataLoader worker's batch, NCCL) wants 8 MiB
    with open("/dev/shm/other", "wb") as f:
        f.write(b"\0" * (8 << 20))
    other = True
except OSError:
    other = False
print(json.dumps([run.returncode, run.stdout, run.stderr, used, other]))
"""


def _shm64(tmp_path: Path, *args: str) -> tuple[int, list[dict[str, object]], str, int, bool]:
    script = SHM64.replace("+ sys.argv[2:]", f"+ {list(args)!r}")
    rc, stdout, stderr, used, other = unshared(script, tmp_path)
    return rc, [json.loads(line) for line in stdout.splitlines() if line.strip()], stderr, used, other


@NAMESPACES
def test_b_a_dataset_bigger_than_the_ram_fs_is_not_sent_to_disk_as_full(tmp_path: Path) -> None:
    rc, events, stderr, _, _ = _shm64(tmp_path)
    assert rc == 0, stderr
    full = [e for e in events if e.get("event") == "demoted" and "no space" in str(e.get("reason"))]
    assert full == [], full[:2]  # (was 3 of 20: "3.9 MiB free, 4.0 MiB needed" with 48 MiB free)
    summary = events[-1]
    assert summary["demoted_full"] == 0 and summary["evicted_own"] == 0, summary
    assert summary["demoted_own"] == 16, summary  # the 16 MiB cap keeps 4 of the 20
    assert "is full" not in stderr, stderr


@NAMESPACES
def test_c_a_ram_limit_past_the_ram_fs_leaves_others_room_and_says_so_first(tmp_path: Path) -> None:
    rc, events, stderr, used, other = _shm64(tmp_path, "--ram-limit", "200M")
    assert rc == 0, stderr
    assert "--ram-limit 200.0 MiB is more than the RAM file system under /dev/shm (64.0 MiB) can spare" in (
        stderr
    ), stderr
    assert "--shm-size" in stderr, stderr
    assert used <= 48 * MIB + MIB, used / MIB  # (was 60 of 64 MiB)
    assert other, "another user of /dev/shm could not write 8 MiB"
    assert events[-1]["demoted_full"] == 0, events[-1]


def test_c_ram_fs_share_figures() -> None:
    from cache.sizes import ram_fs_share

    assert ram_fs_share(64 * MIB) == 48 * MIB  # a quarter, below 64 MiB
    assert ram_fs_share(1 << 30) == (1 << 30) - (1 << 30) // 10  # a tenth, above 64 MiB
    assert ram_fs_share(256 * MIB) == 192 * MIB  # 64 MiB


def test_c_doctor_hint_names_what_a_container_can_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rqcli.commands.doctor as doctor

    real = shutil.disk_usage
    small = type(real(tmp_path))(64 * MIB, 17 * MIB, 47 * MIB)
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda _p: small)
    monkeypatch.setattr(cache.sizes, "cgroup_memory_limit", lambda *a, **k: None)
    ram = doctor.check_ram_tier(tmp_path / "c", tmp_path, ram_root=tmp_path / "r")[0]
    assert ram.status == "warn", ram
    assert "--shm-size" in str(ram.fix) and "emptyDir" in str(ram.fix) and "medium: Memory" in str(ram.fix), (
        ram
    )
