"""A second SIGTERM while `rq replay -f --group g --commit` stores its position on the first (GNU
`timeout` signals rq, then its whole process group). The old code let the second signal cut in:
the final commit was skipped or interrupted inside nats-py's event loop (exit 130 with the group
behind what stdout got, "Task was destroyed but it is pending" on stderr). Now a stop's commit is
done first, whatever else arrives: the group is exactly after the last record written, exit 130,
the done line last with that offset. A real nats-server (the lead's), a real rq process."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import pytest
from jskit import MakeStream, made_streams, produce
from rqtest import popen_rq, read_lines, run_rq

_RECORDS = 151


@pytest.fixture
def stream(nats_url: str) -> Iterator[MakeStream]:
    with made_streams(nats_url, "sig-twice") as make:
        yield make


@pytest.mark.integration
@pytest.mark.parametrize("gap", [0.0, 0.001, 0.003, 0.01, 0.03])
def test_a_second_sigterm_does_not_drop_the_stop_commit(
    nats_url: str, stream: MakeStream, gap: float
) -> None:
    name = stream()
    url = f"{nats_url}/{name}/{name}.x"
    produce(url, b"".join(b"%d\n" % i for i in range(1, _RECORDS + 1)))
    rq = popen_rq("replay", url, "-f", "--group", "g", "--commit", "--format", "raw", "--json")
    read_lines(rq, [b"%d" % i for i in range(1, _RECORDS + 1)])
    os.kill(rq.pid, signal.SIGTERM)
    time.sleep(gap)
    os.kill(rq.pid, signal.SIGTERM)
    rc = rq.wait(60)
    assert rq.stdout is not None and rq.stderr is not None
    rest, err = rq.stdout.read().decode().splitlines(), rq.stderr.read().decode()
    assert rc == 130, err
    assert err.strip().splitlines() == ["rq: stopped by SIGTERM"], err  # no asyncio warning
    assert rest, (rc, err)
    done = json.loads(rest[-1])
    assert done["event"] == "done" and done["error"] == "stopped by SIGTERM"
    assert done["committed"] == {"group": "g", "offset": _RECORDS + 1}
    r = run_rq("offsets", url, "--group", "g", "--json")
    assert json.loads(r.stdout)["groups"][0]["committed"] == _RECORDS + 1
