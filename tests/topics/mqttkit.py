"""Publishing to the real Mosquitto from a test, and a mosquitto of a test's own (set-up, not what
is tested)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
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


@contextmanager
def own_mosquitto(
    store: Path, ports: range, config: str = ""
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A mosquitto of the test's own (to kill, freeze or configure: `config` is more of its config
    file) on the first free port of `ports` (the caller's range), anonymous and not persistent.
    Yields its process and port; a frozen one (SIGSTOP) is let go on before it is killed."""
    from jskit import wait_for_port

    port = next(p for p in ports if _free(port=p))
    conf = store / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n{config}")
    proc = subprocess.Popen(
        [str(shutil.which("mosquitto")), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield proc, port
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(10)


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0
