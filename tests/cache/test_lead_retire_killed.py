"""Store.retire renames a bad entry's file aside (`<blob>.retired-<hex>`) inside the transaction
that drops its row. A process killed between the rename and the commit left that file counted by
nothing: the row came back (rolled back) naming a missing file, and the aside file stayed on disk,
outside every cap, until a repair swept objects/. The aside name is now held before the rename,
so the next collect() (every preload starts with one) removes the file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from cache import Cache

KIB = 1024

_CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    import cache.api
    from cache import Cache
    from cache.errors import NotFoundError

    root, src = Path(sys.argv[1]), Path(sys.argv[2])
    cache.api.SMALL_READ = 4 * 1024  # the reader reads from the file, its lock kept
    real_rename = os.rename

    def rename_then_die(a, b, **kw):
        real_rename(a, b, **kw)
        if ".retired-" in str(b):
            os._exit(9)  # as kill -9 right after the rename, before the index commit

    with Cache(root / "c", ram_dir=root / "ram", disk_limit=1024 * 1024) as c:
        c.preload([str(src) + "/"], tier="disk")
        with c.open(str(src / "a")) as reader:  # held open: retire() renames instead of removing
            (src / "a").unlink()
            os.rename = rename_then_die
            try:
                c.open(str(src / "a")).close()
            except NotFoundError:
                pass
    sys.exit("retire never renamed the file aside")
    """
)


def _objects(root: Path) -> list[Path]:
    return [Path(b) / f for b, _, fs in os.walk(root / "objects") for f in fs]


def test_a_retire_killed_after_its_rename_leaves_no_uncounted_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a" * 64 * KIB)
    child = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), str(src)], capture_output=True)
    assert child.returncode == 9, child.stderr
    assert [p.name for p in _objects(tmp_path / "c") if ".retired-" in p.name]  # the window was hit

    (src / "b").write_bytes(b"b" * 64 * KIB)
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram", disk_limit=1024 * KIB) as c:
        c.preload([str(src / "b")], tier="disk")  # starts with a collect()
        assert [p.name for p in _objects(tmp_path / "c") if ".retired-" in p.name] == []
        use = c.usage()["disk"]
        assert use["held"] == 0
        on_disk = sum(p.stat().st_size for p in _objects(tmp_path / "c"))
        assert on_disk <= use["bytes"]  # every byte on disk is counted (the row of `a` may remain)
