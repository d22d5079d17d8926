"""Under umask 000 the directories rq makes for an embedded topic (the data dir above it, the topic,
its groups/) were 0777: a co-tenant could replace a group's committed offset or a segment. Every
directory rq makes is at most 0755 (others may read a topic, as its 0644 files say; never write);
one that was there is left as it was."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from topics.embedded.groups import GroupStore
from topics.embedded.log import LogWriter


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_under_umask_000_no_directory_of_a_new_topic_is_writable_by_others(
    tmp_path: Path, umask_000: None
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    topic = home / ".local" / "share" / "rq" / "topics" / "t"
    LogWriter(topic).close()
    GroupStore(topic).commit("g", 0)
    made = [
        home / ".local",
        home / ".local/share",
        home / ".local/share/rq",
        topic.parent,
        topic,
        topic / "groups",
    ]
    assert {p.name: _mode(p) for p in made} == {p.name: 0o755 for p in made}  # each was 0777
    assert _mode(home) == 0o755
