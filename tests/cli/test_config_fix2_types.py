"""The config file is checked as strictly as the command line (review round fix2).

Click converts what default_map hands it: `workers = 1.5` became int(1.5) = 1 and `workers = true`
1 (`--workers 1.5` is refused), `endpoint-url = 5` the URL "5". A value an option's callback refuses
(`ram-limit = -1`) was said as `Invalid value for '--ram-limit'`, naming no file. A FIFO given as
--config hung rq for ever; a UTF-8 BOM was "Invalid statement (at line 1, column 1)"."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rqtest import run_rq

from rqcli.exitcodes import ExitCode


def _usage(res: object, *texts: str) -> None:
    assert res.returncode == ExitCode.USAGE, res.stderr  # type: ignore[attr-defined]
    err = res.stderr.decode()  # type: ignore[attr-defined]
    assert all(t in err for t in texts) and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("workers = 1.5", "workers: 1.5 (float) is not a valid whole number"),
        ("workers = true", "workers: true (bool) is not a valid whole number"),
        ("endpoint-url = 5", "endpoint-url: 5 (int) is not a valid string"),
        ("dry-run = 1", "dry-run: 1 (int) is not a valid boolean"),
        ("ram-limit = true", "ram-limit: true (bool) is not a valid string or number"),
    ],
)
def test_a_value_of_another_kind_is_refused_not_converted(tmp_path: Path, line: str, said: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[preload]\n{line}\n")
    res = run_rq("--config", str(cfg), "preload", str(tmp_path / "absent"), "--dry-run")
    _usage(res, str(cfg), f"[preload] {said}")


def test_numbers_where_the_option_reads_them_still_work(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"a")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[preload]\nram-limit = 1073741824\nworkers = "8"\ncache-dir = "{tmp_path / "cache"}"\n')
    res = run_rq("--config", str(cfg), "preload", str(tmp_path / "src"), "--dry-run")
    assert res.returncode == 0, res.stderr


def test_a_value_a_callback_refuses_names_the_file_table_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[preload]\nram-limit = -1\n")
    res = run_rq("--config", str(cfg), "preload", str(tmp_path / "absent"), "--dry-run")
    _usage(res, f"config file {cfg}: [preload] ram-limit: not a size")
    assert b"Invalid value for" not in res.stderr


def test_a_fifo_as_config_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    res = run_rq("--config", str(fifo), "doctor", timeout=60)  # (waited for a writer for ever)
    _usage(res, str(fifo), "not a regular file")


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(b"\xef\xbb\xbf[offsets]\nbogus = 1\n")
    res = run_rq("--config", str(cfg), "offsets", "t")
    _usage(res, "[offsets] bogus: no such option")  # the table was read: the BOM is no statement
