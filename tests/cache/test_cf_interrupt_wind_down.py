"""A Ctrl-C that lands in the fetch loop between taking a message off its queue and counting it:
the wind-down waited for that message forever (up to its 30 s deadline) with every worker idle,
so `rq preload` took 30 s to exit on 1 in 3-6 Ctrl-Cs. The interruption is injected at that
point, deterministically: the queue's get hands back nothing and raises KeyboardInterrupt after
taking a request's message."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from cache import Cache
from cache import fetcher as fetcher_mod


class _LosesOneMessage:
    """The fetcher's queue, whose first get of a request's report raises KeyboardInterrupt with
    the message taken (as a signal between `get()` returning and the loop's count does)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.fired = threading.Event()

    def put(self, item: Any) -> None:
        self._real.put(item)

    def get_nowait(self) -> Any:
        return self._real.get_nowait()

    def get(self, *args: Any, **kwargs: Any) -> Any:
        message = self._real.get(*args, **kwargs)
        if not self.fired.is_set() and message[0] in ("piece", "landed", "error"):
            self.fired.set()
            raise KeyboardInterrupt
        return message


def test_an_interrupt_that_takes_a_message_stops_the_run_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"f{i}").write_bytes(bytes([i]) * 4096)
    queues: list[_LosesOneMessage] = []
    real_run = fetcher_mod.Fetcher.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._q = _LosesOneMessage(self._q)
        queues.append(self._q)
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(fetcher_mod.Fetcher, "run", run)
    raised: list[BaseException] = []

    def preload() -> None:
        try:
            with Cache(tmp_path / "c") as c:
                c.preload([str(src)], workers=2)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=preload, daemon=True)
    thread.start()
    # the run stops as soon as the requests it handed off have reported (milliseconds); the old
    # code waited out its 30 s deadline for the message the interruption took
    thread.join(timeout=25)
    assert not thread.is_alive(), "the wind-down waited for a message that was already taken"
    assert queues and queues[0].fired.is_set()
    assert len(raised) == 1 and isinstance(raised[0], KeyboardInterrupt), raised
