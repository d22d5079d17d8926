"""Room for peers that have not authenticated yet: a cap per listener and a smaller one per address.

A connection (TCP) or stream (QUIC) holds a slot from the moment it appears until its peer proved it
knows the token, or it ends. The listener-wide cap bounds threads and descriptors; the per-address
cap keeps one host that opens connections and then says nothing from taking every slot, so honest
senders elsewhere still get in (sshd's PerSourceMaxStartups plays the same part). QUIC validates a
client's address in its handshake, so the address of a stream cannot be forged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# Room for a big sender's channels, which all handshake at once (--connections x --streams).
MAX_UNAUTHENTICATED = 256
MAX_UNAUTHENTICATED_PER_PEER = 64


class PreAuthSlots:
    def __init__(self, total: int = MAX_UNAUTHENTICATED, per_peer: int = MAX_UNAUTHENTICATED_PER_PEER):
        self.total, self.per_peer = total, min(per_peer, total)
        self._held: dict[str, int] = {}
        self._count = 0
        self._lock = threading.Lock()

    def acquire(self, peer: str) -> Callable[[], None] | None:
        """A slot for `peer` (an address), as the function that gives it back (calling it again does
        nothing); None when the listener or this address has no room left."""
        with self._lock:
            if self._count >= self.total or self._held.get(peer, 0) >= self.per_peer:
                return None
            self._count += 1
            self._held[peer] = self._held.get(peer, 0) + 1
        given_back = False

        def release() -> None:
            nonlocal given_back
            with self._lock:
                if given_back:
                    return
                given_back = True
                self._count -= 1
                left = self._held[peer] - 1
                if left:
                    self._held[peer] = left
                else:
                    del self._held[peer]

        return release

    def held(self, peer: str | None = None) -> int:
        with self._lock:
            return self._count if peer is None else self._held.get(peer, 0)
