"""Embedded groups: a name with a final newline passed the name check (`$` matches before it) and
became the file `groups/nl\\n.json`; a library commit past the topic's end was stored, to read back
as damaged at the next read (JetStream refuses it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rqtest import run_rq

from topics import LogWriter, TopicError, TopicLog


def test_a_group_name_with_a_final_newline_is_refused(tmp_path: Path) -> None:
    run_rq("produce", "t", "--topics-dir", str(tmp_path), input=b"a\n")
    r = run_rq("offsets", "reset", "t", "--group", "nl\n", "--to", "0", "--topics-dir", str(tmp_path))
    # old: exit 0, groups/'nl\n.json' made
    assert r.returncode == 2 and b"bad group name" in r.stderr, r.stderr
    assert not (tmp_path / "t" / "groups").exists() or list((tmp_path / "t" / "groups").iterdir()) == []


def test_a_library_commit_past_the_end_is_refused(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "t") as w:
        w.append([(None, None, (), b"x")] * 3)
    log = TopicLog(tmp_path / "t")
    log.groups.commit("g", 3)  # the end itself is fine: "read everything"
    with pytest.raises(TopicError, match=r"past the end of the topic \(3\)"):
        log.groups.commit("g", 10**6)  # old: stored, then DamagedGroup on every read
    assert log.groups.committed("g") == 3
