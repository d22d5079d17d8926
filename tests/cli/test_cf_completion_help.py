"""Shell completion of `rq offsets reset` and of the named --format values; `rq cache cat --help`
no longer offers the --json the command always refuses."""

from __future__ import annotations

from rqtest import run_rq


def _complete(words: str, cword: int) -> list[str]:
    done = run_rq(env={"COMP_WORDS": words, "COMP_CWORD": str(cword), "_RQ_COMPLETE": "bash_complete"})
    assert done.returncode == 0, done.stderr
    return [line.split(",", 1)[1] for line in done.stdout.decode().splitlines() if line]


def test_offsets_completes_its_reset_subcommand_first_only() -> None:
    assert _complete("rq offsets ", 2) == ["reset"]
    assert _complete("rq offsets reset ", 3) == []


def test_format_completes_the_named_formats() -> None:
    assert _complete("rq tail t --format ", 4) == ["json", "raw", "table"]
    assert _complete("rq replay t --format r", 4) == ["raw"]


def test_cache_cat_help_does_not_offer_json() -> None:
    done = run_rq("cache", "cat", "--help")
    assert done.returncode == 0 and b"--quiet" in done.stdout
    assert b"--json" not in done.stdout
