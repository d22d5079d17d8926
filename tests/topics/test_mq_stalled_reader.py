"""An MQTT tail whose reader stalls (a pager left open, a slow pipe) holds the broker back instead
of holding all it sends in memory: paho's network thread waits in on_message once HOLD_BYTES of
messages are queued unread (as mosquitto_sub's blocking write does), and goes on as they are read."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import topics.sources.mqtt as mqtt_source
from topics.sources.mqtt import MqttSource
from topics.sources.open import parse_topic

pytestmark = pytest.mark.integration


def message(topic: str, payload: bytes) -> object:
    import paho.mqtt.client as mqtt

    msg = mqtt.MQTTMessage(topic=topic.encode())
    msg.payload = payload
    return msg


@pytest.fixture
def held_source(mqtt_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MqttSource]:
    monkeypatch.setattr(mqtt_source, "HOLD_BYTES", 4096, raising=False)
    src = MqttSource(parse_topic(f"{mqtt_url}/rq-mq-hold/{uuid.uuid4().hex}", tmp_path))
    try:
        yield src
    finally:
        src.close()


def deliver(src: MqttSource, payloads: list[bytes]) -> threading.Thread:
    """Hands the messages to the source's on_message from another thread, as paho's would."""
    msgs = [message("rq-mq-hold/x", p) for p in payloads]

    def run() -> None:
        for m in msgs:
            src.client.on_message(src.client, None, m)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_unread_messages_past_the_bound_wait_and_none_is_lost(held_source: MqttSource) -> None:
    payloads = [bytes([i]) * 1000 for i in range(10)]
    t = deliver(held_source, payloads)
    t.join(1.0)
    # Old: all 10 were queued at once, the queue grew by whatever arrived
    assert t.is_alive(), "on_message took all 10 KB with nothing read"
    assert held_source.queue.qsize() < len(payloads)
    got: list[bytes] = []
    for batch in held_source.read(0, len(payloads), True):
        got += [r[4] for r in batch]
    t.join(10)
    assert not t.is_alive()
    assert got == payloads


def test_closing_while_on_message_waits_does_not_hang(held_source: MqttSource) -> None:
    t = deliver(held_source, [b"x" * 1000] * 10)
    t.join(1.0)
    assert t.is_alive(), "on_message took all 10 KB with nothing read"
    closer = threading.Thread(target=held_source.close, daemon=True)
    closer.start()
    closer.join(20)
    assert not closer.is_alive(), "close() hung on a waiting on_message"
    t.join(10)
    assert not t.is_alive()
