"""The fix hint for a group whose committed offset is past the topic's end said `rq offsets reset
TOPIC --group g1 --to SPEC`, placeholders where rq knows the answer (review, on-call at 3 a.m.): the
topic is named (its directory: a path any rq takes, quoted for a shell) and the target is `end`,
what the group had read to (the records past it are gone). A damaged offset (not a number) names
the topic too; its SPEC stays the user's choice. The command given works as printed."""

from __future__ import annotations

import shlex
from pathlib import Path

from rqtest import run_rq


def _topic(tmp_path: Path) -> tuple[dict[str, str], Path]:
    topics = tmp_path / "my topics"  # a space: the path in the hint must be quoted
    env = {"RQ_TOPICS_DIR": str(topics)}
    assert run_rq("produce", "ev", input=b"1\n2\n3\n", env=env).returncode == 0
    r = run_rq("replay", "ev", "--group", "g1", "--commit", "--format", "raw", env=env)
    assert r.returncode == 0, r.stderr
    return env, topics / "ev"


def _hinted_command(stderr: str) -> list[str]:
    start = stderr.index("`rq offsets reset ") + 1
    return shlex.split(stderr[start : stderr.index("`", start)])


def test_a_group_past_the_end_is_told_the_whole_command(tmp_path: Path) -> None:
    env, topic = _topic(tmp_path)
    (topic / "groups" / "g1.json").write_text('{"group": "g1", "committed": 999}')
    r = run_rq("replay", "ev", "--group", "g1", "--format", "raw", env=env)
    err = r.stderr.decode()
    assert r.returncode != 0 and "past the end of the topic (3)" in err, err
    assert "TOPIC" not in err and "SPEC" not in err, err  # was: `... reset TOPIC --group g1 --to SPEC`
    cmd = _hinted_command(err)
    assert cmd == ["rq", "offsets", "reset", str(topic), "--group", "g1", "--to", "end"], cmd
    r = run_rq(*cmd[1:], env={})  # as printed, from anywhere (no RQ_TOPICS_DIR needed)
    assert r.returncode == 0, r.stderr
    r = run_rq("replay", "ev", "--group", "g1", "--format", "raw", env=env)
    assert r.returncode == 0 and r.stdout == b"", r.stderr  # at the end: reads what comes next


def test_a_damaged_offset_names_the_topic(tmp_path: Path) -> None:
    env, topic = _topic(tmp_path)
    (topic / "groups" / "g1.json").write_text('{"group": "g1", "committed": "x"}')
    r = run_rq("replay", "ev", "--group", "g1", "--format", "raw", env=env)
    err = r.stderr.decode()
    assert r.returncode != 0 and "is damaged" in err, err
    cmd = _hinted_command(err)
    assert cmd[:6] == ["rq", "offsets", "reset", str(topic), "--group", "g1"] and "TOPIC" not in err, err
