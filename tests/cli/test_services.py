"""The test services started by scripts/services.sh are real and usable."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def test_s3_bucket_roundtrip_through_boto3(s3_client: Any, bucket: str) -> None:
    body = bytes(range(256)) * 1024
    s3_client.put_object(Bucket=bucket, Key="dir/obj.bin", Body=body)
    got = s3_client.get_object(Bucket=bucket, Key="dir/obj.bin")["Body"].read()
    assert got == body
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="dir/")
    assert [o["Key"] for o in listed["Contents"]] == ["dir/obj.bin"]


def test_jetstream_publish_and_read(nats_url: str, stream_name: str) -> None:
    import nats

    async def roundtrip() -> list[bytes]:
        nc = await nats.connect(nats_url, connect_timeout=2, max_reconnect_attempts=0)
        try:
            js = nc.jetstream()
            await js.add_stream(name=stream_name, subjects=[f"{stream_name}.>"])
            for i in range(3):
                ack = await js.publish(f"{stream_name}.events", f"msg-{i}".encode())
                assert ack.seq == i + 1
            got = []
            for seq in (1, 2, 3):
                msg = await js.get_msg(stream_name, seq)
                got.append(msg.data or b"")
            return got
        finally:
            await nc.close()

    assert asyncio.run(roundtrip()) == [b"msg-0", b"msg-1", b"msg-2"]


def test_mqtt_broker_answers(mqtt_url: str) -> None:
    import socket
    from urllib.parse import urlparse

    url = urlparse(mqtt_url)
    with socket.create_connection((url.hostname, url.port), timeout=2) as sock:
        # MQTT 3.1.1 CONNECT with a clean session; the broker must answer CONNACK (0x20) accepted.
        payload = b"\x00\x04MQTT\x04\x02\x00\x3c" + b"\x00\x06rqtest"
        sock.sendall(bytes([0x10, len(payload)]) + payload)
        assert sock.recv(4) == b"\x20\x02\x00\x00"
