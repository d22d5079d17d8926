"""A cached name with glob characters in it (`data/run[1]/x.bin`): a PATTERN that names it as it
is written is that entry, or that directory, for ls, verify, evict and pin alike (literal first);
it is a glob only when nothing is cached under that exact name. `data/run[1]` matched nothing (the
glob `run[1]` is `run1`) and exited 3."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache import Cache


@pytest.fixture
def cached(tmp_path: Path, ram_dir: Path) -> tuple[Cache, Path]:
    data = tmp_path / "src" / "data"
    for name in ("run[1]/x.bin", "run1/y.bin", "a*b"):
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_bytes(name.encode())
    c = Cache(tmp_path / "c", ram_dir=ram_dir)
    c.preload([str(data)])
    return c, data


def urls(c: Cache, pattern: str) -> list[str]:
    return [Path(e.url).name for e in c.entries(pattern)]


def test_an_exact_name_with_glob_characters_is_that_entry(cached: tuple[Cache, Path]) -> None:
    c, data = cached
    try:
        assert urls(c, str(data / "run[1]")) == ["x.bin"]  # the directory as written, not run1
        assert urls(c, str(data / "run[1]/")) == ["x.bin"]
        assert urls(c, str(data / "run[1]" / "x.bin")) == ["x.bin"]
        assert urls(c, str(data / "a*b")) == ["a*b"]
        assert sorted(urls(c, str(data / "run*"))) == ["x.bin", "y.bin"]  # no such name: a glob
        assert urls(c, str(data / "run[1]*") + "/y.bin") == ["y.bin"]
        assert c.verify(str(data / "run[1]"))[0] == 1
        assert c.pin(str(data / "run[1]")) == 1
        assert c.pin(str(data / "run[1]"), False) == 1
        assert c.evict(str(data / "run[1]")) == (1, 0)
        assert urls(c, str(data / "run1")) == ["y.bin"]  # what the glob would have named is kept
        assert urls(c, str(data / "run[1]") + "/*") == ["y.bin"]  # nothing has that name now: a glob
    finally:
        c.close()
