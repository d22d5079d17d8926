"""`rq send` with a SOURCE that does not exist is exit 3 (docs/transfer.md), whatever else is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rqtest import run_rq

from rqcli.exitcodes import ExitCode


@pytest.mark.parametrize(
    "extra",
    [
        [],  # QUIC without --pin: was "no --pin", exit 4
        ["--token-file", "absent-token"],  # and no token either: was exit 4 as well
        ["--transport", "tcp", "--token-file", "absent-token"],  # a token file that does not exist
    ],
)
def test_a_missing_source_is_exit_3_before_the_pin_and_token_checks(tmp_path: Path, extra: list[str]) -> None:
    res = run_rq(
        "send", "nope", "rq://127.0.0.1:9", "--json", *extra, cwd=tmp_path, env={"RQ_TOKEN": "", "RQ_PIN": ""}
    )
    assert res.returncode == ExitCode.NOT_FOUND, res.stderr
    assert res.stderr.decode().strip() == "rq: error: source not found: nope"
    summary = json.loads(res.stdout.decode().splitlines()[-1])
    assert summary["transfer_id"] is None and summary["error"] == "source not found: nope"
