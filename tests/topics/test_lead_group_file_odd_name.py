"""A group file whose name no rq group may have now (an older rq's `$` check let "gn\\n" through)
was left out of `rq offsets` without a word, exit 0: the group was invisible and nothing said why.
It is now named in a warning, as JetStream consumers with foreign names are; the listing goes on."""

from __future__ import annotations

import json
from pathlib import Path

from rqtest import run_rq


def test_an_odd_group_file_is_named_in_a_warning_and_the_good_groups_listed(tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", "ev", "-q", input=b"a\nb\n", env=env).returncode == 0
    assert run_rq("offsets", "reset", "ev", "--group", "g1", "--to", "1", "-q", env=env).returncode == 0
    (tmp_path / "ev" / "groups" / "gn\n.json").write_bytes(b'{"group": "gn\\n", "committed": 0}')
    r = run_rq("offsets", "ev", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert [g["group"] for g in json.loads(r.stdout)["groups"]] == ["g1"]
    assert b"skipped consumer 'gn\\n': not an rq group name" in r.stderr, r.stderr
