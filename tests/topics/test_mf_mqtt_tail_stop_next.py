"""`rq tail mqtt://… --record X --json` stopped by SIGTERM while a batch is written out: the batch
is written and counted (the stop waits for it), so the done line's `next_offset` is past it. It
was the read loop's own position, which moves only after the batch returns: `next_offset` 0 with
`last_offset` 0, and a rerun from there would take that record again. (replay took the larger
already.) Against the lead's Mosquitto (127.0.0.1:11883); the SIGTERM is sent by the rq process
to itself from inside --record's append, so it lands there on every run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mqttkit import mqtt_publish

pytestmark = pytest.mark.integration

_BROKER = "mqtt://127.0.0.1:11883"

_SETUP = """
import os, signal
import topics.sources.embedded as e
_append = e.EmbeddedSink.append
def append(self, records):
    os.kill(os.getpid(), signal.SIGTERM)  # held until the batch is out
    return _append(self, records)
e.EmbeddedSink.append = append
import sys
sys.argv[0] = 'rq'
from rqcli.console import main
main()
"""


def test_a_stop_inside_the_write_leaves_next_offset_past_it(tmp_path: Path) -> None:
    topic = f"mf/stop/{os.getpid()}/{tmp_path.name}"
    args = ("tail", f"{_BROKER}/{topic}", "--record", str(tmp_path / "cap"), "--json", "--no-retained")
    proc = subprocess.Popen(
        [sys.executable, "-c", _SETUP, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # once the subscription is acknowledged
        assert b"listening on" in line, line + proc.stderr.read()
        mqtt_publish(_BROKER, topic, b"one", retain=False)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert b"SIGTERM" in err, err
    lines = [json.loads(x) for x in out.splitlines()]
    done = lines[-1]
    assert done["event"] == "done" and done["records"] == 1 and done["stored"] == 1, done
    assert done["last_offset"] == 0 and done["next_offset"] == 1, done  # old: next_offset 0
