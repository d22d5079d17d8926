"""Connections in processes: aioquic spends ~50 µs of Python per packet, so one connection fills one
core; with --connections N the sender runs each connection in its own process.

The parent keeps the control channel and the plan; each child gets a share of the missing chunks,
moves them over its own connection with the same ChannelSender as the threaded path, and reports
progress and the digests it computed through one queue.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from transfer.errors import PeerUnreachableError, TransferError, error_from_code
from transfer.events import ChunkMoved, ChunkResent, EventCallback
from transfer.manifest import Manifest
from transfer.source import SourceFile
from transfer.transport import ConnectOptions, Transport

Pair = tuple[int, int]
_PR_SET_PDEATHSIG = 1
STOP_S = 2.0  # how long children told to stop get to finish the chunk they are sending


def die_with_parent(parent: int) -> bool:
    """Asks the kernel for SIGTERM when this process's parent dies, kill -9 included: a child
    that outlived `rq send` went on sending and then hung for ever at exit, on a queue nobody
    read. False if the parent (`parent`: the pid it passed at spawn) died before the request was
    made: the caller then stops at once. Told by that pid, never by a parent pid of 1: rq run as
    PID 1 (a container's entrypoint without --init) is the real parent of its children, and they
    took it for gone (docs/transfer.md, *rq as PID 1*)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    return os.getppid() == parent


def _child(
    parent: int,
    slot: int,
    name: str,
    copts: ConnectOptions,
    token: bytes,
    manifest: Manifest,
    files: list[SourceFile],
    opts: Any,
    todo: list[Pair],
    out: Any,
    stop: Any,
) -> None:
    if not die_with_parent(parent):
        return  # nobody is left to read what this child would report
    import threading

    from transfer.sender import Stats, Work
    from transfer.transport import get_transport

    def on_event(ev: Any) -> None:
        if isinstance(ev, ChunkMoved):
            out.put(("moved", ev.raw_bytes, ev.wire_bytes, ev.file, ev.index))

    digests: list[dict[int, bytes]] = [{} for _ in manifest.files]
    work = Work(todo, lambda n: out.put(("acked", n)))

    def _stop_when_told() -> None:
        # The parent closed its end: it gave up on this attempt. Stop between chunks, so that
        # every chunk handed to the connection has been reported (a kill would lose the reports
        # still queued). A pipe, not an mp.Event: Event.set() waits for every waiter to wake, and
        # hangs for ever on a child that died (or exited) while it waited
        with contextlib.suppress(Exception):
            stop.poll(None)
        work.fail(PeerUnreachableError("the attempt was given up"))

    threading.Thread(target=_stop_when_told, daemon=True).start()
    try:
        _run_one(
            get_transport(name).connect, copts, token, manifest, files, work, opts, digests, Stats(), on_event
        )
        out.put(("ok", slot, [(f, k, d) for f, ds in enumerate(digests) for k, d in ds.items()]))
    except TransferError as exc:
        out.put(("error", exc.code, str(exc)))
    except BaseException as exc:  # connection-level OSErrors and the like: worth a retry
        out.put(("error", "unreachable", f"{type(exc).__name__}: {exc}"))


def move_in_processes(
    todo: list[Pair],
    transport: Transport,
    copts: ConnectOptions,
    token: bytes,
    manifest: Manifest,
    files: list[SourceFile],
    opts: Any,
    digests: list[dict[int, bytes]],
    stats: Any,
    on_event: EventCallback,
    data_ports: list[int],
) -> None:
    """Connection 0 runs in this process (in a thread, while the children start: a spawned child
    costs ~0.1 CPU-s of interpreter and imports before it sends), each other one in a child."""
    n = min(opts.connections, len(todo))
    ctx = mp.get_context("spawn")  # never fork a process that runs threads and an event loop
    out = ctx.Queue()
    stop, stopping = ctx.Pipe(duplex=False)
    shares = [todo[i::n] for i in range(n)]
    procs = [
        ctx.Process(
            target=_child,
            args=(
                os.getpid(),
                i - 1,
                transport.name,
                _port(copts, data_ports, i),
                token,
                manifest,
                files,
                opts,
                share,
                out,
                stop,
            ),
            daemon=True,
        )
        for i, share in enumerate(shares)
        if i > 0
    ]
    for p in procs:
        p.start()
    own = _Own(shares[0], stats)
    own_copts = _port(copts, data_ports, 0)

    def own_event(ev: Any) -> None:
        # the caller's callback raising (a training job cancelling the send) is the caller's
        # exception, raised as it is: it is no connection loss to retry
        try:
            on_event(ev)
        except BaseException as exc:
            own.caller_error = exc
            raise

    own.start(
        lambda: _run_one(
            own.connect(transport),
            own_copts,
            token,
            manifest,
            files,
            own.work,
            opts,
            digests,
            stats,
            own_event,
        ),
        out,
    )
    pending = len(procs) + 1
    finished: set[int] = set()  # the children that said "ok": their share is done

    def take(msg: tuple[Any, ...]) -> None:
        if msg[0] == "moved":  # the parent's Stats knows every attempt: it tells what was resent
            if stats.add(msg[1], msg[2], (msg[3], msg[4])):
                on_event(ChunkResent("sent again"))
            on_event(ChunkMoved(msg[1], msg[2], msg[3], msg[4]))
        elif msg[0] == "acked":
            stats.add_acked(msg[1])

    try:
        while pending:
            ended = _ended_unfinished(procs, finished)  # before the wait: see there
            try:
                msg = out.get(timeout=1.0)
            except queue.Empty:
                lost = _lost(ended)
                if lost is not None:
                    raise lost from None
                continue
            take(msg)
            if msg[0] == "ok":
                finished.add(msg[1])
                for f, k, d in msg[2]:
                    digests[f][k] = d
                pending -= 1
            elif msg[0] == "own":
                own.raise_failure()
                pending -= 1
            elif msg[0] == "error":
                raise error_from_code(msg[1], msg[2])
    finally:
        # Children still running when one failed go on sending until told to stop: what they
        # moved is counted (the summary's bytes_raw and chunks_sent, chunks_acked), or chunks the
        # receiver keeps would be missing from it and never sent again to be counted
        stopping.close()
        own.stop()
        _drain(out, procs, _counting_only(take))
        stop.close()
        with contextlib.suppress(Exception):
            out.close()


def _ended_unfinished(procs: list[Any], finished: set[int]) -> list[int]:
    """The exit codes of the children that exited without saying "ok". Taken before a wait on the
    queue that then finds it empty, it names only children that really left work undone: a child
    flushes its queue as it exits, so what it reported is read by then. Exit 0 counts too: a child
    that returned without doing its share (it took rq as PID 1 for a parent gone) left the send
    waiting for its chunks for ever, acked 8 of 15 and then nothing."""
    return [p.exitcode for i, p in enumerate(procs) if p.exitcode is not None and i not in finished]


def _lost(codes: list[int]) -> PeerUnreachableError | None:
    """A connection lost, as any other: the attempt is retried (--retry-for), then reported."""
    if not codes:
        return None
    if codes[0] == 0:
        return PeerUnreachableError("a connection process exited without finishing its share")
    return PeerUnreachableError(f"a connection process died (exit {codes[0]})")


class _Own:
    """Connection 0, run by a thread of the parent with the threaded path's run_connection: it
    counts into the parent's Stats and digests directly, and says it ended with an ("own",)
    message on the children's queue, so one loop waits for all of them."""

    def __init__(self, todo: list[Pair], stats: Any):
        from transfer.sender import Work

        self.work = Work(todo, stats.add_acked)
        self.failure: BaseException | None = None
        self.caller_error: BaseException | None = None  # what the caller's on_event raised
        self.thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._conn: Any = None
        self._abandoned = False

    def connect(self, transport: Transport) -> Callable[[ConnectOptions], Any]:
        """transport.connect, keeping the connection so that stop() can close it under a thread
        blocked in it; one made after stop() gave up on the attempt is closed at once."""

        def connect(copts: ConnectOptions) -> Any:
            conn = transport.connect(copts)
            with self._lock:
                if not self._abandoned:
                    self._conn = conn
                    return conn
            conn.close()
            raise PeerUnreachableError("the attempt was given up")

        return connect

    def start(self, body: Callable[[], None], out: Any) -> None:
        """Runs `body` (connection 0's _run_one) in a thread that says ("own",) on `out` at its end."""

        def run() -> None:
            try:
                body()
            except BaseException as exc:
                self.failure = exc
            finally:
                with contextlib.suppress(ValueError, OSError):  # the attempt ended: queue closed
                    out.put(("own",))

        self.thread = threading.Thread(target=run, name="rq-conn-0", daemon=True)
        self.thread.start()

    def raise_failure(self) -> None:
        if self.failure is None:
            return
        if self.caller_error is not None:
            raise self.caller_error
        if isinstance(self.failure, TransferError):
            raise self.failure
        raise PeerUnreachableError(f"{type(self.failure).__name__}: {self.failure}") from self.failure

    def stop(self) -> None:
        """Ends connection 0 between chunks (the attempt is over), waiting at most STOP_S; one
        still blocked then (in its handshake, or sending to a receiver that stopped reading) has its
        connection closed under it, as a child still running then is killed (review: it used to
        outlive the attempt, its QUIC connection open, and then fail on the closed queue)."""
        self.work.fail(PeerUnreachableError("the attempt was given up"))
        if self.thread is None:
            return
        self.thread.join(STOP_S)
        if not self.thread.is_alive():
            return
        with self._lock:
            self._abandoned = True
            conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        self.thread.join(STOP_S)


def _run_one(
    connect: Callable[[ConnectOptions], Any],
    copts: ConnectOptions,
    token: bytes,
    manifest: Manifest,
    files: list[SourceFile],
    work: Any,
    opts: Any,
    digests: list[dict[int, bytes]],
    stats: Any,
    on_event: EventCallback,
) -> None:
    """Connects, and moves `work` over that one connection (a child's, or connection 0's)."""
    from transfer.sender import run_connection

    conn = connect(copts)
    try:
        run_connection(
            conn, opts.streams, token, manifest, files, work, opts, digests, stats, on_event, copts.timeout
        )
    finally:
        conn.close()


def _counting_only(take: Callable[[tuple[Any, ...]], None]) -> Callable[[tuple[Any, ...]], None]:
    """`take` for the last reports, after the attempt ended: they are counted, and a callback that
    raises again (a caller that cancelled raises at every event) cannot cut the draining short and
    leave the children unkilled and unjoined."""

    def quiet(msg: tuple[Any, ...]) -> None:
        with contextlib.suppress(Exception):
            take(msg)

    return quiet


def _drain(out: Any, procs: list[Any], take: Callable[[tuple[Any, ...]], None]) -> None:
    """Takes the children's last reports while they stop (at most STOP_S), then kills those
    still running (one stuck sending to a receiver that is gone) and takes what they had sent."""
    deadline = time.monotonic() + STOP_S
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            take(out.get(timeout=0.02))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(timeout=2)
    # what a child wrote before it exited is still in the pipe; a child killed while writing
    # may have left half a report, which ends the reading
    with contextlib.suppress(Exception):
        while True:
            take(out.get_nowait())


def _port(copts: ConnectOptions, data_ports: list[int], i: int) -> ConnectOptions:
    """Connection i goes to the receiver's process i % N when it said where they listen."""
    return dataclasses.replace(copts, port=data_ports[i % len(data_ports)]) if data_ports else copts
