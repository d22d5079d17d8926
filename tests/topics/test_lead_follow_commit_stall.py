"""np2: a `replay -f --group G --commit` whose NATS server stalled for 5-6 s ended with exit 6 "could
not store the offset of group G", while the same follow without --commit rode out an 8 s stall
(the read waits ~10 s of missed heartbeats and a 5 s PING before it counts the server lost). The
follow's periodic commit now warns, keeps the records uncommitted (at least once) and stores the
position again once the server answers. Here the server is frozen (SIGSTOP) right after a record
was read and before its commit, which comes at most once a second: the commit meets the stall."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from jskit import freeze, own_nats_process
from rqtest import popen_rq, read_lines, run_rq, wait_or_fail

from topics.sources.open import open_sink, parse_topic

_PORTS = range(23500, 23550)


def test_a_follow_commit_rides_out_a_server_stall(tmp_path: Path) -> None:
    with own_nats_process(tmp_path, _PORTS) as (url, server):
        topic = f"{url}/ST/ST.x"
        sink = open_sink(parse_topic(topic, tmp_path))
        try:
            sink.append([(None, None, (), b"%d" % n) for n in (1, 2, 3)])
            rq = popen_rq(
                "replay", topic, "--from", "start", "-f", "--group", "g", "--commit", "--count", "6",
                "--format", "raw", "--json",
            )  # fmt: skip
            read_lines(rq, [b"1", b"2", b"3"])  # committed at once: the first commit is not held back
            sink.append([(None, None, (), b"4")])
            read_lines(rq, [b"4"])  # its commit waits for the second to pass
            freeze(server)
            time.sleep(7)  # the commit's request (5 s) goes unanswered
            server.send_signal(signal.SIGCONT)
            sink.append([(None, None, (), b"%d" % n) for n in (5, 6)])
            rc = wait_or_fail(rq, 60, "the follow did not end after its --count")
        finally:
            sink.close()
        assert rq.stdout is not None and rq.stderr is not None
        err = rq.stderr.read().decode()
        lines = rq.stdout.read().decode().splitlines()
        assert rc == 0, err  # (old: 6, "could not store the offset of group g: ...")
        assert lines[:2] == ["5", "6"] and json.loads(lines[-1])["committed"] == {"group": "g", "offset": 7}
        assert "could not store the offset of group g" in err and "stores it again later" in err
        shown = run_rq("offsets", topic, "--group", "g", "--json")
        assert shown.returncode == 0 and b'"g"' in shown.stdout and b"7" in shown.stdout, shown.stdout


def test_a_commit_cut_by_a_stall_is_a_lost_connection_not_an_unreachable_server(tmp_path: Path) -> None:
    """np2: the commit rewrapped a ConnectionLost as a plain SourceUnreachable, so the CLI added
    "is the server running and the URL right?" to a server that had answered all along."""
    from topics.errors import ConnectionLost
    from topics.sources.open import open_source

    with own_nats_process(tmp_path, _PORTS) as (url, server):
        ref = parse_topic(f"{url}/SL/SL.x", tmp_path)
        sink = open_sink(ref)
        sink.append([(None, None, (), b"x")] * 3)
        sink.close()
        source = open_source(ref)
        try:
            freeze(server)
            try:
                source.commit("g", 2)
            except ConnectionLost as exc:  # (old: SourceUnreachable)
                assert "could not store the offset of group g" in str(exc)
            else:
                raise AssertionError("a commit to a frozen server was stored")
        finally:
            server.send_signal(signal.SIGCONT)
            source.close()


def test_a_produce_left_unanswered_names_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """np2: "no answer from the NATS server for 4096 published record(s) within 10 s" named no
    server (the MQTT line does)."""
    import topics.sources.jetstream
    from topics.errors import ConnectionLost

    monkeypatch.setattr(topics.sources.jetstream, "_ANSWER_TIMEOUT", 1.0)
    with own_nats_process(tmp_path, _PORTS) as (url, server):
        sink = open_sink(parse_topic(f"{url}/PA/PA.x", tmp_path))
        try:
            freeze(server)
            with pytest.raises(
                ConnectionLost, match=r"no answer from the NATS server at 127\.0\.0\.1:\d+ for 3"
            ):
                sink.append([(None, None, (), b"x")] * 3)
        finally:
            server.send_signal(signal.SIGCONT)
            sink.close()


class _SlowRelay:
    """Carries bytes to `port` at about `rate` bytes/s (answers come back at full speed), with a
    small receive buffer so the client's own send queue is what waits: a healthy, slow link."""

    def __init__(self, port: int, rate: int):
        self.target, self.rate = port, rate
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 10)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.sock.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target))
                threading.Thread(target=self._pump, args=(client, upstream, self.rate), daemon=True).start()
                threading.Thread(target=self._pump, args=(upstream, client, 0), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, rate: int) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(rate // 20 if rate else 1 << 16):
                if rate:
                    time.sleep(len(data) / rate)
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def test_a_produce_over_a_slow_link_is_not_a_lost_server(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """np2: over a link at ~10 KB/s, `rq produce nats://` ended exit 6 "no answer ... within 10 s"
    for records still on their way (the answer wait counted from the hand-over to the kernel, and
    sendall's timeout bounded a whole 1 MiB send). Here the wait is 1 s, and the last record alone
    (300 kB, within NATS's 1 MB payload) takes ~3 s to arrive: no answer can come before it does."""
    from jskit import made_streams

    import topics.sources.jetstream

    monkeypatch.setattr(topics.sources.jetstream, "_ANSWER_TIMEOUT", 1.0)
    port = int(nats_url.rsplit(":", 1)[1])
    relay = _SlowRelay(port, 100_000)
    with made_streams(nats_url, "lead-slow") as make:
        name = make()
        sink = open_sink(parse_topic(f"nats://127.0.0.1:{relay.port}/{name}/{name}.x", tmp_path))
        try:
            done = sink.append(
                [(None, None, (), b"%0999d" % n) for n in range(30)] + [(None, None, (), bytes(300_000))]
            )
        finally:
            sink.close()
            relay.sock.close()
        assert (done.first, done.last, done.stored) == (1, 31, 31)  # (old: ConnectionLost)
