"""A hostile manifest of deep names is parsed in memory bounded by its size, and the tree checks
that replaced the per-prefix lists still refuse and accept exactly what they did."""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import orjson
import pytest

from transfer.errors import ProtocolError, UnsafeNameError
from transfer.manifest import FileEntry, Limits, parse_manifest, transfer_id


def _body(names: list[str], dirs: list[str] | None = None, **extra: Any) -> bytes:
    files = [FileEntry(name=n, size=0, mode=0o644, key=f"{i:032x}", elem=1) for i, n in enumerate(names)]
    obj: dict[str, Any] = {
        "version": 2 if dirs else 1,
        "chunk_size": 1 << 22,
        "transfer_id": transfer_id(1 << 22, tuple(files), tuple(dirs or ())),
        "files": [{"name": f.name, "size": 0, "mode": 0o644, "key": f.key, "elem": 1} for f in files],
        **extra,
    }
    if dirs:
        obj["dirs"] = dirs
    return orjson.dumps(obj)


def test_deep_names_do_not_make_the_receiver_list_every_prefix() -> None:
    # 12 names of 2,041 components (4 KiB each, the most a name may be): listing each one's prefixes
    # took ~4 MB per name (a 32 MiB manifest of them: ~30 GB); the manifest itself is 50 KB
    names = [f"{i:x}/" + "/".join(["a"] * 2040) for i in range(12)]
    body = _body(names)
    tracemalloc.start()
    try:
        parse_manifest(body, Limits())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, peak


def _old_verdict(names: list[str], dirs: list[str], table: dict[str, int]) -> str:
    """What the per-prefix checks decided (the code before this change), as a word."""
    fileset = set(names)
    for n in [*names, *dirs]:
        parts = n.split("/")
        upto = len(parts) if n in dirs else len(parts) - 1
        if any("/".join(parts[:i]) in fileset for i in range(1, upto + 1)):
            return "conflict"
    ours = set(dirs)
    for n in [*names, *dirs]:
        parts = n.split("/")
        ours.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return "ok" if all(k in ours for k in table) else "unsafe"


def _new_verdict(names: list[str], dirs: list[str], table: dict[str, int]) -> str:
    try:
        parse_manifest(_body(names, dirs, dir_modes=table), Limits())
    except UnsafeNameError:
        return "unsafe"
    except ProtocolError as exc:
        assert "both a file and a directory" in str(exc), exc
        return "conflict"
    return "ok"


@pytest.mark.parametrize("seed", range(6))
def test_tree_checks_decide_as_before(seed: int) -> None:
    rng = random.Random(seed)
    comps = ["a", "b", "a-", "a.b", "ab", "a b", "é"]
    for _ in range(60):
        pool = sorted({"/".join(rng.choices(comps, k=rng.randint(1, 4))) for _ in range(rng.randint(1, 6))})
        names = [n for n in pool if rng.random() < 0.6]
        dirs = sorted(n for n in pool if n not in names)
        table = {"/".join(rng.choices(comps, k=rng.randint(1, 3))): 0o755 for _ in range(rng.randint(0, 2))}
        if not names:
            continue
        assert _new_verdict(names, dirs, table) == _old_verdict(names, dirs, table), (names, dirs, table)
