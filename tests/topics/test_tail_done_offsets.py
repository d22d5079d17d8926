"""`rq tail --json`'s done line names the offsets of the first and last record it wrote out, as
docs/cli.md says for tail and replay alike (null when none was), also when a follow ends.
It had only records and next_offset (first-hour review): a script resuming after the last record
shown had to parse every record line for it."""

from __future__ import annotations

import json
from pathlib import Path

from rqtest import run_rq


def _done(out: bytes) -> dict:
    lines = [json.loads(x) for x in out.decode().splitlines() if x.strip()]
    assert lines and lines[-1].get("event") == "done", lines
    return lines[-1]


def test_tail_says_which_offsets_it_wrote_out(tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert (
        run_rq("produce", "ev", "-q", input=b"".join(b"%d\n" % i for i in range(30)), env=env).returncode == 0
    )
    done = _done(run_rq("tail", "ev", "-n", "3", "--json", env=env).stdout)
    assert (done["records"], done["first_offset"], done["last_offset"], done["next_offset"]) == (
        3,
        27,
        29,
        30,
    )
    done = _done(run_rq("tail", "ev", "-n", "0", "--json", env=env).stdout)
    assert (done["records"], done["first_offset"], done["last_offset"]) == (0, None, None)


def test_a_follow_names_them_too(tmp_path: Path) -> None:
    """A follow ended by its --timeout (idle). (Not by SIGTERM: a signal landing between the
    write and the count leaves them out, a window replay --commit closes with _Stops and tail
    does not; a test signalling right after reading the records would race it.)"""
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", "ev", "-q", input=b"a\nb\nc\n", env=env).returncode == 0
    r = run_rq("tail", "ev", "-n", "2", "-f", "--timeout", "1", "--json", env=env)
    assert r.returncode == 0, r.stderr
    done = _done(r.stdout)
    assert (done["records"], done["first_offset"], done["last_offset"], done["next_offset"]) == (
        2,
        1,
        2,
        3,
    ), done
