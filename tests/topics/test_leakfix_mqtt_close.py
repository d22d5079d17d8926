"""A process that opens and closes MQTT sources and sinks as a library (a long-running service)
kept two descriptors per client after close(): paho closes the connection's socket and the
socketpair loop_start() makes only in Client.__del__, and a client lives in reference cycles, so
they waited for the cyclic garbage collector. With it off, each open/close cost 2 descriptors."""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from topics.sources.open import open_sink, open_source, parse_topic

pytestmark = pytest.mark.integration


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("opener", [open_sink, open_source], ids=["sink", "source"])
def test_closed_mqtt_clients_keep_no_descriptor(
    mqtt_url: str, tmp_path: Path, opener: Callable[[Any], Any]
) -> None:
    ref = parse_topic(f"{mqtt_url}/rqtest/leakfix{uuid.uuid4().hex[:8]}", tmp_path / "topics")
    opener(ref).close()  # what the first use imports and sets up once
    gc.collect()
    gc.disable()
    try:
        before = _fds()
        for _ in range(4):
            opener(ref).close()
        after = _fds()
    finally:
        gc.enable()
    assert after == before, f"{after - before} descriptors left by 4 closed clients"  # old code: 8
