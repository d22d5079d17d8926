"""Tables into a pipe or a file (`rq offsets T | cat`, `rq doctor | grep`, `rq tail T --format table
> f`) were rich's drawings: box characters, cells folded over several lines at 80 columns (a URL cut
in two), a centred title. Off a terminal rq now prints plain lines, as kubectl and ps do: a header
line, then one line per row, cells separated by one tab (docs/cli.md, *Tables*). A terminal keeps
the rich table; --json is unchanged."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from rqtest import run_rq, run_rq_on_a_pty

from rqcli.output import Output

BOX = {chr(c) for c in range(0x2500, 0x2580)}


def _plain(text: str) -> list[list[str]]:
    assert not BOX & set(text) and "\x1b" not in text, text
    return [line.split("\t") for line in text.splitlines()]


def _topic(tmp_path: Path) -> dict[str, str]:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    data = b'{"a": 1}\n{"b": "x\\ty"}\nplain\n'
    assert run_rq("produce", "ev", "-q", input=data, env=env).returncode == 0
    assert run_rq("offsets", "reset", "ev", "--group", "g", "--to", "1", env=env).returncode == 0
    return env


def test_offsets_into_a_pipe_is_tab_separated(tmp_path: Path) -> None:
    env = _topic(tmp_path)
    r = run_rq("offsets", "ev", env=env)
    assert r.returncode == 0, r.stderr
    first, *table = r.stdout.decode().splitlines()
    assert first.endswith("ev: first 0, last 2, 3 records")
    assert _plain("\n".join(table)) == [["group", "committed", "lag"], ["g", "1", "2"]]
    as_json = json.loads(run_rq("offsets", "ev", "--json", env=env).stdout)
    assert as_json["groups"] == [{"group": "g", "committed": 1, "lag": 2}]  # --json as it was


def test_tail_format_table_into_a_file_is_tab_separated(tmp_path: Path) -> None:
    env = _topic(tmp_path)
    r = run_rq("tail", "ev", "--format", "table", env=env)
    assert r.returncode == 0, r.stderr
    rows = _plain(r.stdout.decode())
    assert rows[0] == ["offset", "time", "key", "value"]
    # a tab inside a value is escaped: one line, one cell per column
    assert [(x[0], x[2], x[3]) for x in rows[1:]] == [
        ("0", "", '{"a":1}'),
        ("1", "", '{"b":"x\\ty"}'),
        ("2", "", "plain"),
    ]


def test_a_followed_table_has_one_header_line(tmp_path: Path) -> None:
    """tail -f draws a table per batch on a terminal; into a pipe the header comes once."""
    from rqcli.commands.topics import Writer

    out = Output(stdout=io.StringIO())
    writer = Writer("table", None, b"\n", True, out)
    for offset in (0, 1):
        writer([(offset, 0, None, [], b"v%d" % offset)], None)
    rows = _plain(out.stdout.getvalue())
    assert [x[0] for x in rows] == ["offset", "0", "1"]


def test_doctor_into_a_pipe_is_one_line_per_check(tmp_path: Path) -> None:
    r = run_rq("doctor", "--cache-dir", str(tmp_path / "c"), "--nats-url", "nats://127.0.0.1:9", timeout=60)
    rows = _plain(r.stdout.decode())
    assert rows[0] == ["check", "status", "finding", "what to do"]
    assert len(rows) > 3 and all(len(x) == 4 for x in rows), rows
    nats = [x for x in rows if x[0] == "nats"]
    assert nats and "nats://127.0.0.1:9" in nats[0][2]  # whole, not folded over two lines


def test_a_terminal_keeps_the_rich_table(tmp_path: Path) -> None:
    env = {**os.environ, **_topic(tmp_path), "COLUMNS": "100"}
    text = run_rq_on_a_pty(["offsets", "ev"], env)
    assert BOX & set(text), text  # drawn
    assert "group" in text and "committed" in text
