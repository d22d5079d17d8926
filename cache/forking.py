"""Imports in flight when the process forks are finished first.

The cache imports its heavier modules (awscrt, botocore, cache.ranged, ...) where they are first
needed, often on a background thread: a prefetcher's, the CRT's. A fork while that thread holds a
module's import lock leaves the lock held for good in the child, and the child's first use of that
module waits for ever: the documented DataLoader pattern (`Cache.prefetch`, then forked workers)
hung in 5 runs of 5. Before a fork this waits for every import another thread has in flight, then
holds the interpreter's import lock until the fork is done, so that no thread starts one meanwhile
(a thread needs that lock to take a module's). Nothing is waited for when no import is in flight.

This reads importlib's own bookkeeping (`_module_locks`, `_lock_unlock_module`, the locks'
`owner` and `count`), checked for with getattr: an interpreter without them forks as before.
"""

from __future__ import annotations

import _imp
import contextlib
import os
import sys
import threading
from typing import Any

_forking = threading.local()  # `held`: this thread took the import lock for the fork under way


def _in_flight() -> tuple[Any, Any] | None:
    bootstrap: Any = sys.modules.get("importlib._bootstrap")
    locks = getattr(bootstrap, "_module_locks", None)
    wait = getattr(bootstrap, "_lock_unlock_module", None)
    if locks is None or wait is None:
        return None
    return locks, wait


def _held_by_another(locks: dict[str, Any]) -> bool:
    me = threading.get_ident()
    for ref in list(locks.values()):
        lock: Any = ref() if callable(ref) else None
        count: int = getattr(lock, "count", 0)
        owner: int | None = getattr(lock, "owner", None)
        if count and owner not in (None, me):
            return True
    return False


def _before_fork() -> None:
    found = _in_flight()
    if found is None:
        return
    locks, wait = found
    for _ in range(100):
        for name in list(locks):
            # acquires and releases the module's lock: returns once its importer is done (re-entrant
            # for a lock this thread holds; a cross-wait is a _DeadlockError it swallows)
            with contextlib.suppress(Exception):
                wait(name)
        # (not held while waiting: the importer may need it for the modules it imports in turn)
        _imp.acquire_lock()
        if not _held_by_another(locks):
            _forking.held = True
            return
        _imp.release_lock()  # one began meanwhile: wait for it too


def _after_fork() -> None:
    if getattr(_forking, "held", False):
        _forking.held = False
        with contextlib.suppress(RuntimeError):  # (a child's lock is made anew, as ours: never seen)
            _imp.release_lock()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)
