"""Publishing to the real Mosquitto from a test (set-up, not what is tested)."""

from __future__ import annotations

from urllib.parse import urlsplit


def mqtt_publish(url: str, topic: str, payload: bytes, retain: bool) -> None:
    """One QoS 1 publish to `url`'s broker, waited for; retain=True with b"" removes a retained value."""
    import paho.mqtt.client as mqtt

    u = urlsplit(url)
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.connect(u.hostname or "127.0.0.1", u.port or 1883)
    client.loop_start()
    try:
        client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()
