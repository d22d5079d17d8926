"""pol: NO_COLOR (https://no-color.org) on a terminal. rich's own no_color drops colours and keeps
bold and dim, so `rq offsets`, `rq tail --format table` and `rq doctor` still wrote bold headers
(`ESC[1m`), which many terminals draw in a bright colour. rq now writes no SGR code at all under a
non-empty NO_COLOR, as cargo, ripgrep and uv do; the table itself (box characters, columns) stays."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest
from rich.table import Table
from rqtest import run_rq, run_rq_on_a_pty

from rqcli.output import Output

SGR = re.compile(r"\x1b\[[0-9;]*m")  # colour, bold, dim...: any Select Graphic Rendition
BOX = {chr(c) for c in range(0x2500, 0x2580)}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _table() -> Table:
    table = Table(show_edge=False)
    for col in ("check", "status"):
        table.add_column(col)
    table.add_row("s3", "[green]ok[/]")
    table.add_row("nats", "[red]fail[/]")
    return table


@pytest.mark.parametrize(("no_color", "styled"), [("1", False), ("", True), (None, True)])
def test_table_on_a_terminal_has_no_style_under_no_color(
    monkeypatch: pytest.MonkeyPatch, no_color: str | None, styled: bool
) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)  # an empty NO_COLOR is not set (no-color.org)
    term = _Terminal()
    Output(stdout=term).table(_table())
    text = term.getvalue()
    assert BOX & set(text) and "fail" in text, text  # still the drawn table
    assert bool(SGR.search(text)) is styled, repr(text)


def test_progress_on_a_terminal_has_no_style_under_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    term = _Terminal()
    with Output(stderr=term).progress() as bar:
        assert bar is not None
        task = bar.add_task("fetch", total=10)
        bar.update(task, completed=5)
        bar.refresh()
    text = term.getvalue()
    assert "fetch" in text, repr(text)
    assert not SGR.search(text), repr(text)


def test_rq_offsets_and_tail_table_on_a_pty_under_no_color(tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path)}
    assert run_rq("produce", "ev", "-q", input=b"a\nb\n", env=env).returncode == 0
    assert run_rq("offsets", "reset", "ev", "--group", "g", "--to", "1", env=env).returncode == 0
    full = {**os.environ, **env, "COLUMNS": "100", "TERM": "xterm-256color", "NO_COLOR": "1"}
    full.pop("FORCE_COLOR", None)
    for args in (["offsets", "ev"], ["tail", "ev", "-n", "2", "--format", "table"]):
        text = run_rq_on_a_pty(args, full)
        assert BOX & set(text), text  # drawn
        assert not SGR.search(text), repr(text)  # was: ESC[1m around each header
