"""jx: a message stored near max_payload and read back after the server's max_payload was
lowered failed, exit 1 "broke the NATS protocol: it sent a message of 16777361 bytes": the frame
was a JetStream API reply (a message get: base64 of a 12 MiB value), bounded by the max_payload the
server declares now plus 8 MiB. nats-py's connection carries only API replies: they are now bounded
by base64 of the largest message a server stores (64 MiB) plus the room; still bounded."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import nats.errors
import pytest

from topics.sources.jetstream import _bounded_parser


def _parser() -> Any:
    parser = _bounded_parser()(SimpleNamespace(), "127.0.0.1:4222")
    parser.info = {"max_payload": 1024 * 1024}  # lowered after the message was stored
    return parser


def test_an_api_reply_with_a_large_stored_message_is_taken() -> None:
    parser = _parser()
    parser.needed = 16777361  # base64 of a 12 MiB value in a message get's reply: was refused
    assert parser.needed == 16777361


def test_an_api_reply_past_base64_of_the_ceiling_is_still_refused() -> None:
    parser = _parser()
    with pytest.raises(nats.errors.ProtocolError):
        parser.needed = 100_000_000_000
    assert "JetStream API reply of 100000000000 bytes" in str(parser.nc.rq_broke)
