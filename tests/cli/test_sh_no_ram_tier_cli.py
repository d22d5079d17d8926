"""rq on a machine without a usable RAM tier (/dev/shm missing or read-only, as in many
containers): `--tier disk` and reading a cache work; `--tier ram` is refused in one line, exit 10
("needs something this machine lacks"), not exit 2 (a bad argument). Old code: exit 2 for all."""

from __future__ import annotations

from pathlib import Path

from rqtest import run_rq_ram_root_at as _rq


def test_disk_tier_and_reads_work_ram_tier_exits_10(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.write_bytes(b"")  # nothing can be made under it, whoever we are
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"hello")
    c = str(tmp_path / "c")
    rc, _, err = _rq(shm, "preload", str(src), "--tier", "disk", "--cache-dir", c)
    assert rc == 0, err
    for args in (("cache", "ls"), ("cache", "cat", str(src / "a"))):
        rc, out, err = _rq(shm, *args, "--cache-dir", c)
        assert rc == 0, (args, err)
    assert out == "hello"
    rc, out, err = _rq(shm, "preload", str(src), "--tier", "ram", "--cache-dir", c)
    assert rc == 10, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "no RAM tier" in lines[0] and "--tier disk" in lines[0], err
