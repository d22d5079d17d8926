"""Wrong argument types at the library's entry points, and an MQTT append ended by close() (tw)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from topics import LogWriter, TopicLog
from topics.errors import SpecError, TopicError, WriterBusy
from topics.sources.mqtt import MqttSink


@pytest.mark.parametrize(
    "record",
    [
        (1.5, None, (), b"a"),  # a float timestamp
        (2**64, None, (), b"a"),  # past int64
        (None, "k", (), b"a"),  # a str key
        (None, None, (), "v"),  # a str value
        (None, None, (("h", "v"),), b"a"),  # a str header value
        (None, None, (), b"a", 5),  # five fields
        7,
    ],
)
def test_a_record_of_the_wrong_shape_is_refused_in_one_line(tmp_path: Path, record: Any) -> None:
    t = tmp_path / "t"
    with LogWriter(t) as w:
        with pytest.raises(SpecError, match="cannot append: each record is"):
            w.append([(None, None, (), b"ok"), record])
        assert w.append([(None, None, (), b"next")]) == (0, 0)  # nothing of it was written
    with LogWriter(t) as w:
        assert w.next_offset == 1


def test_offset_for_time_takes_int_milliseconds(tmp_path: Path) -> None:
    t = tmp_path / "t"
    with LogWriter(t) as w:
        w.append([(1_700_000_000_000 + i * 1000, None, (), b"v") for i in range(100)])
    log = TopicLog(t)
    with pytest.raises(SpecError, match="milliseconds"):
        log.offset_for_time(1700000050.0)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="milliseconds"):
        log.offset_for_time(True)
    assert log.offset_for_time(1_700_000_050_000) == 50


def test_a_second_writer_in_this_process_is_told_as_such(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "t"), pytest.raises(WriterBusy, match="another LogWriter in this one"):
        LogWriter(tmp_path / "t")


class _Info:
    def __init__(self, on_wait: Any) -> None:
        self.on_wait = on_wait

    def is_published(self) -> bool:
        return False

    def wait_for_publish(self, timeout: float) -> None:
        self.on_wait()


class _Client:
    """A paho client whose PUBACKs never come; close() disconnects it."""

    def __init__(self) -> None:
        self.connected = True
        self.close_now = threading.Event()

    def publish(self, topic: str, value: bytes, qos: int) -> _Info:
        return _Info(self.close_now.set)

    def is_connected(self) -> bool:
        return self.connected

    def disconnect(self) -> None:
        self.connected = False

    def loop_stop(self) -> None: ...

    def reinitialise(self) -> None: ...


def _faked_sink() -> tuple[MqttSink, _Client]:
    """An MqttSink on a faked connection: only append and close run."""
    sink = MqttSink.__new__(MqttSink)
    client = _Client()
    sink.url, sink.topic, sink.where = "mqtt://h:1/tw-a", "tw-a", "h:1"
    sink.max_packet_size, sink.client, sink.gone, sink.closed = 1 << 20, client, [], False
    sink.ACK_WAIT_S = 3600.0
    return sink, client


def test_an_mqtt_append_ended_by_close_says_so(tmp_path: Path) -> None:
    sink, client = _faked_sink()
    err: list[BaseException] = []

    def append() -> None:
        try:
            sink.append([(None, None, (), b"x")] * 3)
        except BaseException as exc:
            err.append(exc)

    th = threading.Thread(target=append)
    th.start()
    assert client.close_now.wait(30)  # the append waits for its PUBACKs
    sink.close()  # from this thread
    th.join(30)
    assert len(err) == 1 and isinstance(err[0], TopicError)
    msg = str(err[0])
    assert "was closed" in msg and "size limit" not in msg, msg
    with pytest.raises(TopicError, match="is closed"):
        sink.append([(None, None, (), b"y")])


def test_a_close_between_the_checks_is_still_told_as_close(tmp_path: Path) -> None:
    """close() landing between the append's two checks (closed? connected?) — the ordering the
    suite met once on a loaded runner: the disconnect it made was told as the broker's."""
    sink, client = _faked_sink()

    def closed_meanwhile() -> bool:
        sink.close()  # (as another thread's close() would, just before this check)
        return client.connected

    client.is_connected = closed_meanwhile  # type: ignore[method-assign]
    with pytest.raises(TopicError, match="was closed") as raised:
        sink.append([(None, None, (), b"x")])
    assert "size limit" not in str(raised.value)
