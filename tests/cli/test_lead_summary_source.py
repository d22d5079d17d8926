"""Under --json the summary's `error` is stderr's line, the source of a refused value included
(it lacked the `config file F: [send] chunk-size:` / `(from VAR)` part stderr had)."""

from __future__ import annotations

import json
from pathlib import Path

from rqtest import home_config, home_env, run_rq

from rqcli.exitcodes import ExitCode


def _summary_and_error(res: object) -> tuple[dict[str, object], str]:
    out, err = res.stdout.decode(), res.stderr.decode()  # type: ignore[attr-defined]
    summary = json.loads(out.splitlines()[-1])
    return summary, err.strip().removeprefix("rq: error: ")


def test_a_send_refused_by_a_config_value_names_it_in_its_summary(tmp_path: Path) -> None:
    home_config(tmp_path, '[send]\nchunk-size = "10GB"\n')
    (tmp_path / "a.txt").write_text("a")
    res = run_rq("send", "--json", str(tmp_path / "a.txt"), "rq://127.0.0.1:9", env=home_env(tmp_path))
    assert res.returncode == ExitCode.USAGE, res.stderr
    summary, line = _summary_and_error(res)
    assert summary["event"] == "summary" and "[send] chunk-size:" in line and summary["error"] == line


def test_a_preload_refused_by_an_aws_variable_names_it_in_its_summary(tmp_path: Path) -> None:
    env = home_env(
        tmp_path, AWS_ENDPOINT_URL="127.0.0.1:18333", AWS_ACCESS_KEY_ID="a", AWS_SECRET_ACCESS_KEY="b"
    )
    res = run_rq("preload", "--json", "s3://b/x/", "--cache-dir", str(tmp_path / "c"), "--dry-run", env=env)
    assert res.returncode == ExitCode.USAGE, res.stderr
    summary, line = _summary_and_error(res)
    assert "(from AWS_ENDPOINT_URL)" in line and summary["error"] == line
