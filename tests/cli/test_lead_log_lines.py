"""What -v / -vv and the heartbeat put on stderr, after the review of 21c9698 (dr7):
- `-vv` printed botocore's DEBUG dump of every signed request: the session token
  (X-Amz-Security-Token) and the Authorization header, into CI logs. Those loggers stay at INFO
  under -vv, and every log line is passed through a redaction of signed headers, presigned URL
  signatures and URL passwords.
- `-v` printed qh3's "Native peer close" warning on every healthy QUIC receive: under -v other
  libraries say only their errors. `-q -v` printed log lines although -q is "only errors".
- The receiver's heartbeat kept beating (with a time left) for a transfer it had refused; the
  first rate of a resumed send or receive counted the bytes already there.
- A heartbeat task id could come back after a remove_task."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from rqcli.output import Heartbeat, Output, hide_logs, redact, show_logs


@pytest.fixture
def logs() -> Iterator[io.StringIO]:
    yield io.StringIO()
    hide_logs()


def _show(stderr: io.StringIO, verbose: int, quiet: bool = False) -> None:
    show_logs(Output(stderr=stderr, stdout=io.StringIO(), verbose=verbose, quiet=quiet))


SIGNED = (
    "Sending http request: <AWSPreparedRequest headers={'X-Amz-Security-Token': b'SESSIONTOKEN123', "
    "'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE/20261125/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=0123abcd'}>"
)


def test_vv_does_not_print_signed_requests(logs: io.StringIO) -> None:
    _show(logs, 2)
    logging.getLogger("botocore.endpoint").debug(SIGNED)
    logging.getLogger("urllib3.connectionpool").debug("https://b.s3:443 GET /k?X-Amz-Signature=ff00")
    logging.getLogger("botocore.endpoint").info("an INFO line with %s", SIGNED)
    logging.getLogger("aioquic.quic").debug("a QUIC debug line")
    text = logs.getvalue()
    assert "SESSIONTOKEN123" not in text and "AKIAEXAMPLE" not in text and "0123abcd" not in text, text
    assert "ff00" not in text, text
    assert "rq: info: botocore.endpoint: an INFO line with" in text, text  # said, redacted
    assert "rq: debug: aioquic.quic: a QUIC debug line" in text, text  # other libraries: DEBUG


def test_redact_keeps_what_is_not_secret() -> None:
    assert redact("nats://user:s3cret@127.0.0.1:4222 refused") == "nats://user:***@127.0.0.1:4222 refused"
    assert redact("?X-Amz-Credential=AKIA%2Fx&X-Amz-Signature=ab&x-id=GetObject") == (
        "?X-Amz-Credential=***&X-Amz-Signature=***&x-id=GetObject"
    )
    plain = "connected to http://127.0.0.1:18333/bucket in 3 ms; 2 of 9 chunk(s)"
    assert redact(plain) == plain


def test_v_shows_other_libraries_errors_only(logs: io.StringIO) -> None:
    _show(logs, 1)
    logging.getLogger("quic").warning("Native peer close: ('peer_closed', True, 0, None, b'')")
    logging.getLogger("quic").error("a real error")
    logging.getLogger("transfer.quic").info("rq's own")
    lines = logs.getvalue().splitlines()
    assert lines == ["rq: error: quic: a real error", "rq: info: transfer.quic: rq's own"], lines


def test_quiet_wins_over_verbose(logs: io.StringIO) -> None:
    _show(logs, 2, quiet=True)
    logging.getLogger("transfer.quic").error("not under -q")
    assert "not under -q" not in logs.getvalue()


def test_heartbeat_task_ids_are_never_reused() -> None:
    beat = Heartbeat(Output(stderr=io.StringIO(), stdout=io.StringIO()), transfer=False)
    try:
        first = beat.add_task("a", total=10)
        second = beat.add_task("b", total=10)
        beat.remove_task(first)
        third = beat.add_task("c", total=10)
        assert len({first, second, third}) == 3
        beat.update(second, completed=5)
        assert [t.description for t in beat._tasks.values()] == ["b", "c"]
    finally:
        beat.stop()


class _Bar:
    """The calls the commands make on a progress display (rich's or a Heartbeat)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []

    def add_task(self, description: str, **kw: Any) -> int:
        self.calls.append(("add_task", description, kw))
        return 7

    def update(self, task: int, **kw: Any) -> None:
        self.calls.append(("update", task, kw))

    def remove_task(self, task: int) -> None:
        self.calls.append(("remove_task", task, {}))


def test_resumed_transfers_start_their_bars_at_what_is_already_there() -> None:
    from rqcli.commands.transfer import _recv_progress, _send_progress
    from transfer.events import TransferPlanned

    planned = TransferPlanned("ab" * 16, 1, 1000, 4, 600)
    for make in (_send_progress, _recv_progress):
        bar = _Bar()
        make(Output(stderr=io.StringIO(), stdout=io.StringIO()), bar)(planned)
        added = [c for c in bar.calls if c[0] == "add_task"]
        assert added and added[0][2].get("completed") == 600, (make.__name__, bar.calls)


def test_a_refused_transfer_stops_its_receiver_bar() -> None:
    from rqcli.commands.transfer import _recv_progress
    from transfer.events import TransferFailed, TransferPlanned

    bar = _Bar()
    on_event = _recv_progress(Output(stderr=io.StringIO(), stdout=io.StringIO()), bar)
    on_event(TransferPlanned("cd" * 16, 1, 1000, 4, 0))
    on_event(TransferFailed("receiver disk is full", "no-space"))
    assert ("remove_task", 7, {}) in bar.calls, bar.calls


def test_the_restarted_warning_counts_every_file_not_only_the_names_sent() -> None:
    from rqcli.commands.transfer import _send_progress
    from transfer.events import TransferPlanned

    err = io.StringIO()
    names = tuple(f"f{i}" for i in range(1000))
    _send_progress(Output(stderr=err, stdout=io.StringIO()), None)(
        TransferPlanned("ef" * 16, 1500, 1000, 4, 0, names, 1500)
    )
    assert "f0, f1, f2, f3, f4 and 1495 more" in err.getvalue(), err.getvalue()
