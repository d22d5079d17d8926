"""jx: `rq produce` to a NATS server without JetStream was exit 1 "unexpected
ServiceUnavailableError": the sink asked nats-py for the stream's info directly, not through the
call that words a 503 as replay/tail/offsets do. Now exit 6, "JetStream is not enabled …".
A nats-server of the test's own, without JetStream."""

from __future__ import annotations

from pathlib import Path

import pytest
from jskit import own_nats_server
from rqtest import run_rq

from rqcli.exitcodes import ExitCode

pytestmark = pytest.mark.integration


def test_produce_to_a_server_without_jetstream_says_so(tmp_path: Path) -> None:
    with own_nats_server(tmp_path, range(23450, 23500), jetstream=False) as url:
        r = run_rq("produce", f"{url}/NOJS", input=b"one\n")
        tail = run_rq("tail", f"{url}/NOJS", "-n", "1")
    err = r.stderr.decode().strip()
    assert r.returncode == ExitCode.UNREACHABLE, err  # was 1
    assert "JetStream is not enabled" in err and "unexpected" not in err, err
    assert err.splitlines()[-1] == tail.stderr.decode().strip().splitlines()[-1], tail.stderr
