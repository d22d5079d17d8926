"""rq on a machine without a usable RAM tier: `rq preload --tier ram` into a new cache dir is
refused (exit 10) and creates nothing (old code: an empty disk cache with its index was left
behind), and `rq cache du` of a disk-only cache says it has no RAM tier, in its header and in
--json, instead of naming a RAM path that does not exist (old code: "(RAM tier /…/rq-0)")."""

from __future__ import annotations

import json
from pathlib import Path

from rqtest import run_rq_ram_root_at as _rq


def _no_shm_and_source(tmp_path: Path) -> tuple[Path, Path]:
    shm = tmp_path / "shm"
    shm.write_bytes(b"")  # nothing can be made under it, whoever we are
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"hello")
    return shm, src


def test_refused_ram_preload_creates_no_cache_dir(tmp_path: Path) -> None:
    shm, src = _no_shm_and_source(tmp_path)
    for where in (tmp_path / "new", tmp_path / "empty"):
        if where.name == "empty":
            where.mkdir()  # an empty directory given as the cache dir stays empty
        rc, _, err = _rq(shm, "preload", str(src), "--tier", "ram", "--cache-dir", str(where))
        assert rc == 10, err
        assert "no RAM tier" in err and "--tier disk" in err, err
        assert where.name == "empty" or not where.exists(), sorted(where.iterdir())
        assert where.name == "new" or list(where.iterdir()) == []
    rc, _, err = _rq(shm, "preload", str(src), "--tier", "ram", "--json", "--cache-dir", str(tmp_path / "j"))
    assert rc == 10, err
    assert not (tmp_path / "j").exists()


def test_du_of_a_disk_only_cache_names_no_ram_path(tmp_path: Path) -> None:
    shm, src = _no_shm_and_source(tmp_path)
    c = str(tmp_path / "c")
    rc, _, err = _rq(shm, "preload", str(src), "--tier", "disk", "--cache-dir", c)
    assert rc == 0, err
    rc, out, err = _rq(shm, "cache", "du", "--cache-dir", c)
    assert rc == 0, err
    header = out.splitlines()[0]
    assert str(shm) not in header and "no RAM tier" in header, out
    rc, out, err = _rq(shm, "cache", "du", "--json", "--cache-dir", c)
    assert rc == 0, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["ram_dir"] is None and str(shm) in summary["ram_unavailable"], summary
