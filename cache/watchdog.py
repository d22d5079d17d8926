"""Cancels S3 requests that hear nothing for too long.

The CRT client has a connect timeout but no read timeout: a store that accepts connections and
then stays silent (a half-dead proxy or port-forward, a frozen server) held `Cache.open` and
`rq preload` for ever. Each request takes a ticket; its callbacks mark activity; one daemon thread
per process cancels a request whose allowance of silence ran out, and the request's `on_done`
(which the CRT still calls, with a cancel error) reads `ticket.timed_out` to say what happened.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from typing import Any

SILENCE_S = 30.0  # as cache.ranged.READ_TIMEOUT_S: this long without a byte is a lost connection
# A body the CRT writes to a file reports no progress to Python (a callback per chunk would cost a
# GIL hand-off each): once headers came, its allowance grows with its size at this slowest rate.
SLOWEST_BYTES_PER_S = 256 << 10


class Ticket:
    """One request's watch: `alive()` on every sign of life, `close()` when it is done."""

    __slots__ = ("allowance", "answered", "body_bytes", "closed", "dog", "id", "last", "request", "timed_out")

    def __init__(self, dog: Watchdog, ident: int, allowance: float):
        self.dog, self.id, self.allowance = dog, ident, allowance
        self.last = time.monotonic()
        self.answered = False  # headers came: the store is working on this one
        self.body_bytes = 0  # the size of the body: listed (expect) or announced by the headers
        self.request: Any = None  # the CRT's S3Request, set once make_request returned it
        self.timed_out = False
        self.closed = False

    def alive(self, body_bytes: int = 0) -> None:
        """A sign of life; `body_bytes`: the size of a body that will now arrive unobserved."""
        self.last = self.dog.heard = time.monotonic()
        self.answered = True
        if body_bytes:
            self.expect(body_bytes)

    def expect(self, body_bytes: int) -> None:
        """The body's size, known before the request is sent: its allowance counts it from the start."""
        if body_bytes:
            self.body_bytes = body_bytes
            self.allowance = self.dog.silence + body_bytes / SLOWEST_BYTES_PER_S

    def hold(self, request: Any) -> None:
        """Keeps the request to cancel, unless it is already done (its on_done may run on a CRT
        thread before make_request returns)."""
        self.request = request
        if self.closed:  # done meanwhile (close() sets closed before it clears request)
            self.request = None

    def close(self) -> None:
        # The request goes with the watch: its callbacks hold this ticket, a cycle through the
        # CRT's native code the garbage collector cannot see, which kept every request of a run
        # (and what its callbacks refer to) alive.
        self.closed = True
        self.request = None
        self.dog.forget(self)


class Watchdog:
    def __init__(self, silence: float | None = None):
        self.silence = SILENCE_S if silence is None else silence
        self._lock = threading.Lock()
        self._tickets: dict[int, Ticket] = {}
        self._ids = itertools.count()
        self._pid = 0
        self._started = False
        _dogs.add(self)
        self.heard = time.monotonic()  # the last sign of life from the store on any request

    def watch(self) -> Ticket:
        with self._lock:
            # first use, or a forked child (threads do not survive fork): _forked resets _started
            # there, so no getpid per request
            if not self._started:
                self._pid = os.getpid()
                self._tickets.clear()
                try:
                    threading.Thread(target=self._run, name="rq-s3-watchdog", daemon=True).start()
                except RuntimeError as exc:
                    # "can't start new thread" (ulimit -v / -u): requests go on unwatched (a stall is
                    # then the client's own read timeout) and the next one tries again
                    if "can't start new thread" not in str(exc):
                        raise
                else:
                    self._started = True
            ticket = Ticket(self, next(self._ids), self.silence)
            self._tickets[ticket.id] = ticket
            return ticket

    def forget(self, ticket: Ticket) -> None:
        with self._lock:
            self._tickets.pop(ticket.id, None)

    def _late(self, now: float) -> list[Ticket]:
        """The requests to give up on. One that the store answered: when its own allowance ran
        out. One still waiting for an answer (it may be queued in the CRT behind others, on a
        slow link): only when the store said nothing on any request for the allowance and no
        answered request is still within its own, i.e. the store as a whole went silent."""
        tickets = [t for t in self._tickets.values() if t.request is not None]
        busy = any(t.answered and now - t.last <= t.allowance for t in tickets)
        silent = now - self.heard > self.silence and not busy
        return [t for t in tickets if now - t.last > t.allowance and (t.answered or silent)]

    def _run(self) -> None:
        pid = os.getpid()
        while pid == self._pid:
            time.sleep(min(1.0, self.silence / 4))
            now = time.monotonic()
            with self._lock:
                late = self._late(now)
                for t in late:
                    del self._tickets[t.id]
                    t.timed_out = True  # decided here: on_done reads it only with the cancel's error
            for t in late:
                try:
                    t.request.cancel()
                except Exception:  # already finished: its on_done has run or is running
                    pass


_dogs: weakref.WeakSet[Watchdog] = weakref.WeakSet()


def _forked() -> None:
    for dog in list(_dogs):
        dog._started = False
        dog._lock = threading.Lock()  # a parent's thread may have held it at the fork


os.register_at_fork(after_in_child=_forked)
