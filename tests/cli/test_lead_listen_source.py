"""A port out of range in `rq recv --listen`, from the environment or the config file, names where
the value came from (the message quotes the value, so main's source naming can match it)."""

from __future__ import annotations

from pathlib import Path

from rqtest import home_config, home_env, run_rq

from rqcli.exitcodes import ExitCode


def test_a_port_out_of_range_from_the_environment_names_its_variable(tmp_path: Path) -> None:
    res = run_rq("recv", str(tmp_path / "d"), env=home_env(tmp_path, RQ_RECV_LISTEN="127.0.0.1:99999"))
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert b"port 99999 out of range in '127.0.0.1:99999' (from RQ_RECV_LISTEN)" in res.stderr


def test_a_port_out_of_range_from_the_config_file_names_its_key(tmp_path: Path) -> None:
    cfg = home_config(tmp_path, '[recv]\nlisten = "127.0.0.1:99999"\n')
    res = run_rq("recv", str(tmp_path / "d"), env=home_env(tmp_path))
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert f"config file {cfg}: [recv] listen: port 99999 out of range".encode() in res.stderr
