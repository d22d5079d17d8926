"""The driver interface every transport implements (TCP, QUIC, RDMA): see docs/transfer.md.

A driver moves whole frames over *channels* and knows nothing of manifests, chunks or files: the
sans-I/O core (session.py) and the glue (sender.py, receiver.py) do that for every transport alike.
All methods are blocking and thread-safe per channel; the glue runs one thread per channel.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from transfer.errors import UnsupportedError
from transfer.frames import Frame

TRANSPORTS = ("quic", "tcp", "rdma")


@dataclass(frozen=True)
class Identity:
    """The receiver's TLS certificate and key (PEM) and its sha256 fingerprint ("sha256:<hex>")."""

    cert_pem: bytes
    key_pem: bytes
    fingerprint: str


@dataclass(frozen=True)
class ListenOptions:
    host: str
    port: int
    identity: Identity
    tls: bool = True  # QUIC always uses TLS; TCP only when asked
    max_frame: int = 64 * 1024 * 1024 + 64  # largest CHUNK body a driver must accept
    extra: dict[str, Any] = field(default_factory=dict)  # transport-specific (datagram_size, rdma_device, …)


@dataclass(frozen=True)
class ConnectOptions:
    host: str
    port: int
    pin: str | None  # "sha256:<hex>" of the receiver's certificate; None only for plain TCP
    tls: bool = True
    max_frame: int = 64 * 1024 * 1024 + 64
    timeout: float = 10.0
    # The connection's own set-up (TCP connect and TLS, the QUIC handshake) at most this long;
    # None: `timeout`. The sender lowers it to --timeout, or to what is left of the wait for a
    # receiver that never answered; the channels opened later keep `timeout`.
    connect_timeout: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        """HOST:PORT as a person writes it: an IPv6 address in brackets ([::1]:7420)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def connect_within(self) -> float:
        return self.timeout if self.connect_timeout is None else self.connect_timeout


class Channel(Protocol):
    """One ordered, reliable pipe of frames."""

    def send(self, *parts: bytes | bytearray | memoryview) -> None:
        """Sends bytes that make up whole frames, in order; blocks while the pipe is full."""

    def recv(self, timeout: float | None = None) -> Frame | None:
        """The next frame; None when the peer closed cleanly. Raises PeerUnreachableError on loss
        and TimeoutError when `timeout` passes; ProtocolError for bytes that are not frames."""

    def close(self) -> None: ...


class Connection(Protocol):
    """A sender's connection to the receiver; it may carry several channels (QUIC streams)."""

    def open_channel(self) -> Channel: ...

    def close(self) -> None: ...


class Listener(Protocol):
    """A receiver's bound endpoint. `serve_forever` calls the handler once per new channel, each
    in its own thread, until `close` is called (from any thread)."""

    address: tuple[str, int]

    def serve_forever(self) -> None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    name: str
    # True where one connection saturates a core in Python (aioquic): the sender then runs each
    # connection in its own process.
    connection_per_process: bool

    def listen(self, opts: ListenOptions, handler: Callable[[Channel], None]) -> Listener: ...

    def connect(self, opts: ConnectOptions) -> Connection: ...


def get_transport(name: str) -> Transport:
    """The driver for `name`; UnsupportedError (one line, saying what to use instead) if unavailable."""
    if name == "tcp":
        from transfer.tcp import TcpTransport

        return TcpTransport()
    if name == "quic":
        from transfer.quic import QuicTransport

        return QuicTransport()
    if name == "rdma":
        try:
            module = importlib.import_module("transfer.rdma")
            transport: Transport = module.make_transport()
        except UnsupportedError:
            raise
        except Exception as exc:  # missing module, missing pyverbs, no device: all the same to a user
            raise UnsupportedError(
                f"RDMA transport unavailable ({type(exc).__name__}: {exc}); use --transport tcp or quic"
            ) from None
        return transport
    raise UnsupportedError(f"unknown transport {name!r}; use one of {', '.join(TRANSPORTS)}")
