"""Live MQTT tail against the real Mosquitto, and capture into the embedded log for replay."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from rqtest import rq_command, run_rq

pytestmark = pytest.mark.integration


def publish(url: str, topic: str, payloads: list[bytes]) -> None:
    import paho.mqtt.client as mqtt

    u = urlsplit(url)
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.connect(u.hostname or "127.0.0.1", u.port or 1883)
    client.loop_start()
    try:
        for p in payloads:
            client.publish(topic, p, qos=1).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def test_tail_live_and_record_for_replay(mqtt_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "RQ_TOPICS_DIR": str(tmp_path / "topics"), "CI": "1"}
    root = f"rqtest/{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [
            *rq_command(),
            "tail",
            f"{mqtt_url}/{root}/#",
            "-n",
            "3",
            "--record",
            "cap",
            "--format",
            "json",
            "--timeout",
            "20",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stderr is not None
    assert b"listening on" in proc.stderr.readline()  # subscribed: what is published now is seen
    publish(mqtt_url, f"{root}/cam1", [b'{"t": 1}', b"\xff\xfe", b"plain"])
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    got = [json.loads(x) for x in out.splitlines()]
    assert [g["offset"] for g in got] == [0, 1, 2]
    assert got[0]["key"] == f"{root}/cam1" and got[0]["value"] == {"t": 1}
    assert [g["value_encoding"] for g in got] == ["json", "base64", "text"]
    r = run_rq(
        "replay", "cap", "--from", "start", "--format", "raw", env={"RQ_TOPICS_DIR": env["RQ_TOPICS_DIR"]}
    )
    assert r.stdout == b'{"t": 1}\n\xff\xfe\nplain\n'


def test_idle_timeout_ends_a_quiet_tail_and_replay_is_refused(mqtt_url: str) -> None:
    r = run_rq("tail", f"{mqtt_url}/rqtest/quiet-{uuid.uuid4().hex[:6]}", "--timeout", "0.5", timeout=20)
    assert r.returncode == 0 and r.stdout == b""
    r = run_rq("replay", f"{mqtt_url}/x", "--from", "start")
    assert r.returncode == 10 and b"MQTT has none" in r.stderr
    r = run_rq("produce", f"{mqtt_url}/rqtest/#", input=b"x\n")
    assert r.returncode == 2 and b"topic filter" in r.stderr
    r = run_rq("tail", f"{mqtt_url}/rqtest/#/x", "--timeout", "0.5", timeout=20)
    assert r.returncode == 2 and b"bad MQTT topic filter" in r.stderr and r.stderr.count(b"\n") == 1


def test_broker_going_away_ends_the_tail_with_unreachable(tmp_path: Path) -> None:
    """paho reconnects quietly, but without our subscription (clean session): a tail that waited on
    would never see another message. It must end with one line and exit 6 instead."""
    import shutil
    import socket
    import time

    broker = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None
    )
    if broker is None:
        pytest.skip("no mosquitto binary for a private broker")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "m.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
    server = subprocess.Popen([broker, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tail = None
    try:
        url = f"mqtt://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while True:  # wait until the broker listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("private mosquitto did not start")
                time.sleep(0.05)
        tail = subprocess.Popen(
            [*rq_command(), "tail", f"{url}/gone/#", "--format", "raw"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "CI": "1", "RQ_TOPICS_DIR": str(tmp_path / "topics")},
        )
        assert tail.stderr is not None and b"listening on" in tail.stderr.readline()
        publish(url, "gone/1", [b"before"])
        server.terminate()
        server.wait(10)
        out, err = tail.communicate(timeout=30)
        assert tail.returncode == 6, err
        assert out == b"before\n"
        assert b"lost the connection to the MQTT broker" in err and err.count(b"\n") == 1
    finally:
        for proc in (tail, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
