"""`rq produce` stopped by SIGTERM (or Ctrl-C) must count in its done line every batch the topic
stored. The count came after the sink's append returned, outside any hold, so a signal landing
between the two (deterministic here: the hook signals rq itself right after an append returns)
left a durable batch out: `"records": 0` for a topic holding 3. produce now holds a stop during
the append and its count (_Stops, as tail and replay --commit do)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from rqtest import popen_rq_with

from rqcli.exitcodes import ExitCode
from topics.embedded.log import TopicLog

HOOK = (
    "import os\n"
    "os.dup2(os.open({data!r}, os.O_RDONLY), 0)  # stdin: the records\n"
    "from rqcli.commands import topics as _cmd\n"
    "_open = _cmd.open_sink\n"
    "class _Signalling:\n"
    "    def __init__(self, sink):\n"
    "        self.sink = sink\n"
    "    def append(self, records):\n"
    "        done = self.sink.append(records)\n"
    "        os.kill(os.getpid(), {sig})\n"
    "        return done\n"
    "    def __getattr__(self, name):\n"
    "        return getattr(self.sink, name)\n"
    "_cmd.open_sink = lambda *a, **k: _Signalling(_open(*a, **k))\n"
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_right_after_an_append_counts_that_batch(tmp_path: Path, sig: int) -> None:
    topic = tmp_path / "ev"
    data = tmp_path / "in.txt"
    data.write_bytes(b"a\nb\nc\n")
    proc = popen_rq_with(HOOK.format(sig=int(sig), data=str(data)), "produce", str(topic), "--json")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    stored = [r[4] for batch in TopicLog(topic).reader(0, None, False) for r in batch]
    assert stored == [b"a", b"b", b"c"]
    done = json.loads(out.splitlines()[-1])
    assert done["event"] == "done" and done["records"] == 3, (done, err)  # was 0
    assert (done["first_offset"], done["last_offset"]) == (0, 2)
