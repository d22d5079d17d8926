"""JetStream streams made for one test on the lead's real nats-server, and deleted after it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rqtest import js_call

MakeStream = Callable[..., str]


@contextmanager
def made_streams(nats_url: str, prefix: str) -> Iterator[MakeStream]:
    """Yields make(subjects=None, **config): adds a stream named PREFIX-<random> with `subjects`
    (each formatted with name=the stream's name; default ["{name}.x"]) and the other StreamConfig
    fields given, and returns its name. Every stream made is deleted at the end, those that
    source others first."""
    made: list[str] = []

    def make(subjects: list[str] | None = None, **config: Any) -> str:
        from nats.js.api import StreamConfig

        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        taken = [s.format(name=name) for s in (["{name}.x"] if subjects is None else subjects)]

        async def add(js: Any) -> None:
            await js.add_stream(StreamConfig(name=name, subjects=taken or None, **config))

        js_call(nats_url, add)
        made.append(name)
        return name

    try:
        yield make
    finally:

        async def drop(js: Any) -> None:
            for name in reversed(made):
                try:
                    await js.delete_stream(name)
                except Exception:
                    pass

        js_call(nats_url, drop)
