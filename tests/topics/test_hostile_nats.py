"""rq against a NATS server that breaks the protocol: memory stays bounded and the error is one
line naming the server and what it did wrong (exit 1: it was reached, it answered garbage).

On the old code a MSG declaring 100 GB, or a line with no CRLF, was buffered as it came (2.1 GB
and 1.6 GB in ~5 s, then 'nats: timeout'); an HMSG whose header size exceeded its total size was
a nats-py IndexError traceback, then 'nats: timeout'; a stream info reply of the wrong shape was
'unexpected AttributeError'. Both of rq's NATS paths are driven: nats-py's (the stream info
request every command makes first) and natswire's (the ordered consumer that reads)."""

from __future__ import annotations

import resource
import socket
import subprocess

import pytest
from hostile_kit import Hostile, fake_nats, msg, push, stream_info
from rqtest import rq_command, serving

from rqcli.exitcodes import ExitCode

# The most a hostile server may push before rq hangs up: socket buffers and one read, far below
# what an unbounded buffer takes in the server's PUSH_FOR.
_BOUNDED = 64 * 1024 * 1024
# rq runs under an address-space limit, so the old code fails with MemoryError instead of taking
# the shared machine's memory.
_AS_LIMIT = 1536 * 1024 * 1024


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_AS_LIMIT, _AS_LIMIT))


def _tail(port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*rq_command(), "tail", f"nats://127.0.0.1:{port}/S"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited,
        check=False,
    )


def _one_line(out: subprocess.CompletedProcess[str], port: int, *words: str) -> None:
    err = out.stderr.strip()
    assert out.returncode == ExitCode.FAILURE, err
    assert "Traceback" not in err and "timeout" not in err, err
    assert len(err.splitlines()) <= 2, err  # the line, and at most a hint
    line = err.splitlines()[0]
    assert f"NATS at 127.0.0.1:{port}" in line, line
    for word in words:
        assert word in line, line


def _huge(conn: socket.socket, reply: bytes, sid: bytes, seen: Hostile) -> bool:
    push(conn, b"MSG %s %s 100000000000\r\n" % (reply, sid), seen)
    return True


def _endless(conn: socket.socket, reply: bytes, sid: bytes, seen: Hostile) -> bool:
    push(conn, b"MSG " + b"B" * 65536, seen)
    return True


def _on_info(hostile):
    """Answers the stream info request with `hostile` (nats-py's path)."""

    def answer(conn: socket.socket, subject: str, reply: bytes, sid: bytes, seen: Hostile) -> bool:
        return bool(hostile(conn, reply, sid, seen))

    return answer


def _on_consumer(hostile):
    """A valid stream info, then `hostile` for the consumer create (natswire's path)."""

    def answer(conn: socket.socket, subject: str, reply: bytes, sid: bytes, seen: Hostile) -> bool:
        if subject.startswith("$JS.API.STREAM.INFO."):
            conn.sendall(msg(reply, sid, stream_info("S", messages=5)))
            return False
        if subject.startswith("$JS.API.CONSUMER.CREATE."):
            return bool(hostile(conn, reply, sid, seen))
        return False

    return answer


@pytest.mark.parametrize("path", [_on_info, _on_consumer], ids=["nats-py", "natswire"])
def test_a_frame_declaring_100_gb_is_refused_before_it_is_buffered(path) -> None:
    with fake_nats(path(_huge)) as seen:
        out = _tail(seen.port)
    _one_line(out, seen.port, "100000000000", "max_payload")
    assert seen.pushed and max(seen.pushed) < _BOUNDED


@pytest.mark.parametrize("path", [_on_info, _on_consumer], ids=["nats-py", "natswire"])
def test_a_line_that_never_ends_is_refused(path) -> None:
    with fake_nats(path(_endless)) as seen:
        out = _tail(seen.port)
    _one_line(out, seen.port, "line")
    assert seen.pushed and max(seen.pushed) < _BOUNDED


def _header_past_total(conn: socket.socket, reply: bytes, sid: bytes, seen: Hostile) -> bool:
    conn.sendall(b"HMSG %s %s 5 3\r\nabcde\r\n" % (reply, sid))
    return False


@pytest.mark.parametrize("path", [_on_info, _on_consumer], ids=["nats-py", "natswire"])
def test_a_header_larger_than_its_message_is_one_line(path) -> None:
    with fake_nats(path(_header_past_total)) as seen:
        out = _tail(seen.port)
    _one_line(out, seen.port, "header")


def test_a_stream_info_reply_of_the_wrong_shape_is_one_line() -> None:
    bad = b'{"type":"io.nats.jetstream.api.v1.stream_info_response","config":{"name":5},"state":"x"}'

    def answer(conn: socket.socket, subject: str, reply: bytes, sid: bytes, seen: Hostile) -> bool:
        conn.sendall(msg(reply, sid, bad))
        return False

    with fake_nats(answer) as seen:
        out = _tail(seen.port)
    _one_line(out, seen.port, "stream info")


def _error(conn: socket.socket, reply: bytes, sid: bytes, seen: Hostile) -> bool:
    conn.sendall(b"-ERR 'Unknown Protocol Operation'\r\n")
    return False


@pytest.mark.parametrize("path", [_on_info, _on_consumer], ids=["nats-py", "natswire"])
def test_a_server_error_is_named_with_its_text(path) -> None:
    """Was 'lost the connection to NATS at …' (exit 6) on nats-py's path: the server's words gone."""
    with fake_nats(path(_error)) as seen:
        out = _tail(seen.port)
    err = out.stderr.strip()
    assert out.returncode == ExitCode.FAILURE, err
    assert len(err.splitlines()) == 1, err
    assert f"NATS at 127.0.0.1:{seen.port}" in err and "unknown protocol operation" in err.lower(), err


@pytest.mark.parametrize(
    ("greeting", "words"),
    [(b"INFO " + b"{" * 65536, ("INFO", "no end")), (b"INFO {nonsense}\r\n", ("INFO", "JSON"))],
    ids=["endless", "not-json"],
)
def test_an_info_line_that_never_ends_or_is_no_json_is_one_line(
    greeting: bytes, words: tuple[str, ...]
) -> None:
    """nats-py reads the connect-time INFO with readline (a 32 KiB bound): an endless one was
    exit 6 'cannot connect to NATS at …: Separator is not found, and chunk exceed the limit — is
    the server running and the URL right?', a garbled one exit 6 'info message, json parse
    error': the server is up and talking, it broke the protocol (exit 1, as for any other line)."""
    seen = Hostile(0)

    def serve(conn: socket.socket, done: object) -> None:
        push(conn, greeting, seen)

    with serving(serve) as port:
        out = _tail(port)
    _one_line(out, port, *words)
    assert max(seen.pushed) < _BOUNDED
