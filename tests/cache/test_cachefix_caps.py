"""Two preloads asking for the same --disk-limit: run A set it (replacing the cap before), run B
found it already set and recorded nothing; A failed and restore_limits put the old cap back because
the stored value still equalled A's, and B, still running, then failed objects "more than the disk
tier's cap" though it passed the limit. A cap is now put back only by the run that last asked for
it; one that asks for the limit already set takes over what the run before it would put back."""

from __future__ import annotations

from pathlib import Path

from cache import Cache
from cache.sizes import parse_size

OLD, NEW = parse_size("10M"), parse_size("200M")


def _cap(root: Path, ram_dir: Path) -> int:
    with Cache(root, ram_dir=ram_dir) as c:
        return c.caps["disk"]


def test_a_failed_run_leaves_the_cap_of_a_run_that_asked_for_the_same(tmp_path: Path, ram_dir: Path) -> None:
    root = tmp_path / "c"
    Cache(root, ram_dir=ram_dir, disk_limit=OLD).close()  # kept: the cache's cap
    a = Cache(root, ram_dir=ram_dir, disk_limit="200M")
    b = Cache(root, ram_dir=ram_dir, disk_limit="200M")  # already set: nothing to change
    a.restore_limits()  # run A failed
    assert _cap(root, ram_dir) == NEW  # (old code: 10 MiB, under B's feet)
    assert b._state().store.cap("disk") == NEW
    b.restore_limits()  # B failed too: the cap from before both is back
    assert _cap(root, ram_dir) == OLD
    a.close()
    b.close()


def test_a_run_that_succeeded_keeps_its_cap_whoever_fails_after(tmp_path: Path, ram_dir: Path) -> None:
    root = tmp_path / "c"
    Cache(root, ram_dir=ram_dir, disk_limit=OLD).close()
    a = Cache(root, ram_dir=ram_dir, disk_limit="200M")
    b = Cache(root, ram_dir=ram_dir, disk_limit="200M")
    b.close()  # B succeeded: its limit stays
    a.restore_limits()
    a.close()
    assert _cap(root, ram_dir) == NEW
    c = Cache(root, ram_dir=ram_dir, disk_limit="200M")  # a later run asking the same, failing
    c.restore_limits()
    c.close()
    assert _cap(root, ram_dir) == NEW


def test_a_failed_run_puts_back_what_it_replaced_unless_another_asked_since(
    tmp_path: Path, ram_dir: Path
) -> None:
    root = tmp_path / "c"
    Cache(root, ram_dir=ram_dir, disk_limit=OLD).close()
    a = Cache(root, ram_dir=ram_dir, disk_limit="200M")
    a.restore_limits()
    a.close()
    assert _cap(root, ram_dir) == OLD
    a = Cache(root, ram_dir=ram_dir, disk_limit="200M")
    b = Cache(root, ram_dir=ram_dir, disk_limit="300M")
    a.restore_limits()  # B's limit stands
    assert _cap(root, ram_dir) == parse_size("300M")
    b.restore_limits()  # and B puts back what it replaced
    assert _cap(root, ram_dir) == NEW
    a.close()
    b.close()
