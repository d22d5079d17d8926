"""docs/cli.md's --json table named `cache verify`'s summary as (`checked`, `corrupt`, `repaired`,
`dropped`): it lacked `unreadable` (the count of entries whose file cannot be read back, exit 5)
and did not say that `repaired` is a boolean (--repair was given), not a count like its
neighbours. The row is checked against what the command emits."""

from __future__ import annotations

import json
from pathlib import Path

from rqtest import run_rq

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _row() -> str:
    return next(line for line in DOCS.read_text().splitlines() if line.startswith("| `cache verify` |"))


def test_the_documented_summary_is_the_emitted_one(tmp_path: Path) -> None:
    env = {"RQ_CACHE_DIR": str(tmp_path / "cache")}
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 10)
    assert run_rq("preload", str(src), env=env).returncode == 0
    for repair in ([], ["--repair"]):
        r = run_rq("--json", "cache", "verify", *repair, env=env)
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout.splitlines()[-1])
        assert summary["event"] == "summary"
        assert summary["repaired"] is bool(repair)  # a boolean, whatever was dropped
        row = _row()
        summary_doc = row.split("`summary`", 1)[1]
        for key in summary:
            if key != "event":
                assert f"`{key}`" in summary_doc, (key, summary_doc)
    assert "`repaired`: a boolean" in _row()
    assert "`unreadable` per entry" in _row()  # the per-entry event too
