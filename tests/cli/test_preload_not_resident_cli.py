"""`rq preload --tier ram` of a set bigger than the RAM cap, cached on disk before: the summary's
`not_resident` counts what stays on disk, with a warning (it exited 0 with evicted_own, demoted_own
and demoted_full all 0, and `rq cache ls` showed the set on disk: a script's check passed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rqtest import run_rq


def test_a_set_left_on_disk_is_counted_and_warned_about(tmp_path: Path) -> None:
    src, cache = tmp_path / "src", tmp_path / "cache"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}").write_bytes(os.urandom(1000))
    first = run_rq("preload", f"{src}/", "--cache-dir", str(cache), "--tier", "disk", "-q")
    assert first.returncode == 0, first.stderr
    out = run_rq(
        "preload", f"{src}/", "--cache-dir", str(cache), "--tier", "ram", "--ram-limit", "2500", "--json"
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])
    resident = (
        summary["evicted_own"],
        summary["demoted_own"],
        summary["demoted_full"],
        summary["not_resident"],
    )
    listed = run_rq("cache", "ls", "--cache-dir", str(cache), "--json").stdout.splitlines()
    on_disk = sum(json.loads(x)["tier"] == "disk" for x in listed)
    assert on_disk >= 3 and sum(resident) == on_disk, (resident, on_disk)
    assert b"raise --ram-limit" in out.stderr
