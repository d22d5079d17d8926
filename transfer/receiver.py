"""The receiving glue: runs the protocol core for each channel a driver hands it, against the Store.

One Receiver serves many transfers, one after another or at once; a transfer that fails (hostile
sender, wrong token, disk full) closes its channels with an ERROR frame and leaves the receiver up.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import socket
import ssl
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from transfer.errors import (
    FINISHED_MEANWHILE,
    AuthError,
    ChunkSizeError,
    FinishedMeanwhileError,
    PeerUnreachableError,
    TransferError,
)
from transfer.events import (
    ChunkMoved,
    ChunkResent,
    EventCallback,
    PartialExpired,
    TransferFailed,
    TransferFinished,
    TransferPlanned,
    ignore,
)
from transfer.frames import PRE_AUTH_LIMIT
from transfer.manifest import Limits, Manifest
from transfer.names import STATE_DIR_NAME, display_name
from transfer.session import (
    Authenticated,
    ChunkRejected,
    ChunkVerified,
    CommitRequested,
    FlushRequested,
    ManifestReceived,
    ReceiverChannel,
)
from transfer.store import KEEP_PARTIAL, Plan, Store, no_space
from transfer.transport import Channel

IDLE_TIMEOUT = 300.0  # a channel that sends nothing for this long is dropped
# until it authenticated, a channel gets this long per frame: HELLO and AUTH are one round trip
# apart, and a peer that stalls there holds a connection (a thread, a descriptor) for nothing
PRE_AUTH_TIMEOUT = 30.0
LINGER = 5.0  # after DONE, how long to wait for the sender to close the channel
# While a COMMIT is worked on (the journals checked, every file sealed, linked and synced: minutes
# for 100,000 files or a slow disk), a sender that asked for it (HELLO "features") is sent PROGRESS
# this often, so that it can tell a receiver still at work from a stalled one within a few of these
# intervals instead of waiting its whole COMMIT wait (sender.COMMIT_WAIT, 120 s) per try.
PROGRESS_S = 5.0
# A receiver that stays up sweeps abandoned partial state (keep_partial) again at most this often,
# when a new transfer is planned and, idle, on a timer: the sweep as it starts was the only one, so
# one up for weeks kept every abandoned transfer's .part files for good (on tmpfs: its RAM).
SWEEP_EVERY = 3600.0
DEFAULT_ACK_EVERY = 2  # verified chunks made durable (fdatasync + journal) and ACKed at once
# Group commit for small chunks (many small files): a batch whose chunks average under this many
# bytes is not made durable every `ack_every` chunks but when the channel has nothing more to read
# right now (the sender's window is full or it has nothing left), or at the bounds below. Big
# chunks keep the count: each of their flushes is worth its cost (docs/transfer.md).
GROUP_BELOW = 1 << 20
MAX_BATCH_CHUNKS = 1024
MAX_BATCH_BYTES = 32 << 20
# A chunk smaller than this is written in the channel's thread: handing it to the writer thread
# costs more than the write (measured: 5,000 files of 10 KB, the hand-offs were a quarter of the
# receiver's time).
INLINE_BELOW = 256 * 1024
# What a sender whose transfer was in flight is told when the receiver goes away under it (its
# listener or the Receiver closed: `rq recv` stopped). An "unreachable" ERROR, which senders retry
# like a lost connection: before, one that had been paused was told "receiver refused: transfer
# already finished" once it went on (its channel's handler outlived the close, the plan did not),
# and gave up on a transfer its re-run resumes.
SHUT_DOWN = (
    "the receiver shut down with this transfer in flight; what arrived is kept, and a re-run resumes it"
)


@dataclass
class _Shared:
    plan: Plan
    users: int = 0
    started: float = field(default_factory=time.monotonic)
    raw: int = 0
    wire: int = 0
    resent: int = 0
    # the refusals (error codes) already reported for this plan: every channel of a transfer hits
    # the same full disk, and each reported it (QUIC's two streams: twice per transfer)
    refused: set[str] = field(default_factory=set)


class _ChunkWriter:
    """Writes a channel's verified chunks, one in flight, so the disk works on chunk n while chunk
    n+1 arrives. Only where the driver keeps a body valid past the next recv (body_lifetime >= 2);
    otherwise it writes in the caller's thread, as before.

    A chunk joins `done` (the caller's list of chunks awaiting fdatasync + journal) only once its
    write returned: a failed write is never journalled."""

    def __init__(self, ch: Channel, done: list[tuple[int, int, bytes]]):
        overlap = getattr(ch, "body_lifetime", 1) >= 2
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rq-recv-write") if overlap else None
        self._done = done
        self._flight: tuple[Future[None], tuple[int, int, bytes]] | None = None
        self._recvs = 0  # recv() calls since the write in flight was handed over

    def write(self, plan: Plan, f: int, k: int, data: bytes | memoryview, digest: bytes) -> None:
        self.wait()
        if self._pool is None or len(data) < INLINE_BELOW:
            plan.write(f, k, data)
            self._done.append((f, k, digest))
            return
        self._flight = (self._pool.submit(plan.write, f, k, data), (f, k, digest))
        self._recvs = 0

    @property
    def in_flight(self) -> int:
        return 1 if self._flight is not None else 0

    def before_recv(self) -> None:
        """The next recv may reuse the buffer of the frame before last: its write must be over."""
        if self._flight is not None and self._recvs >= 1:
            self.wait()
        self._recvs += 1

    def wait(self) -> None:
        if self._flight is None:
            return
        fut, item = self._flight
        self._flight = None
        fut.result()
        self._done.append(item)

    def close(self) -> None:
        """Waits for the write in flight (the caller may still journal it) and stops the thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)


class _Progress:
    """Sends PROGRESS on a control channel every `core.progress_every` seconds from a thread of
    its own while the channel's thread works on a COMMIT (nothing else is sent on the channel
    meanwhile); `stop` returns once no send is under way any more, so DONE or ERROR follow it."""

    def __init__(self, ch: Channel, core: ReceiverChannel):
        self._ch, self._core = ch, core
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if core.progress_every is not None:
            self._thread = threading.Thread(target=self._run, name="rq-recv-progress", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        every = self._core.progress_every
        assert every is not None
        while not self._stop.wait(every):
            frame = self._core.progress(time.monotonic() - self._started)
            if not frame:
                return
            try:
                self._ch.send(frame)
            except Exception:  # the channel is gone: the commit's own reply will say so
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


# The receiver's own state files under DEST/.rq-partial (a key, transfer id or name hash first):
# an error writing one is DEST's, reported without rq's internal names.
_STATE_FILE = re.compile(r"^[0-9a-f]{32}\.")

# Out of descriptors or memory: this moment's trouble, which the sender's reconnect outlasts.
_TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


class _Readiness:
    """Whether a channel has a frame's bytes waiting (so recv would not block): the driver's
    optional `readable()`, else a poll of a plain socket driver's `sock`; None where neither
    exists (then batches go by count alone)."""

    def __init__(self, ch: Channel):
        self._probe = getattr(ch, "readable", None)
        self._sock: socket.socket | None = None
        self._poll: select.poll | None = None
        sock = getattr(ch, "sock", None)
        if not callable(self._probe) and isinstance(sock, socket.socket):
            self._sock = sock
            self._poll = select.poll()
            self._poll.register(sock.fileno(), select.POLLIN)

    @property
    def known(self) -> bool:
        return callable(self._probe) or self._poll is not None

    def __call__(self) -> bool:
        if callable(self._probe):
            return bool(self._probe())
        if self._poll is None:
            return True
        if isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
            return True
        return bool(self._poll.poll(0))


class _Batch:
    """The verified chunks of one channel not yet durable, and when to make them so."""

    def __init__(self, ack_every: int, readiness: _Readiness):
        self.pending: list[tuple[int, int, bytes]] = []  # written (the write returned), not durable
        self.count = 0  # chunks handed to the writer since the last flush (pending + in flight)
        self.bytes = 0
        self.ack_every = ack_every
        self.group = readiness.known

    def add(self, nbytes: int) -> None:
        self.count += 1
        self.bytes += nbytes

    def cleared(self) -> None:
        self.count = self.bytes = 0

    def small(self) -> bool:
        """Group commit applies: the driver can say whether more is waiting, and the chunks of
        this batch average under GROUP_BELOW bytes."""
        return self.group and self.bytes < GROUP_BELOW * max(1, self.count)

    def full(self) -> bool:
        """Time to flush after adding a chunk: every ack_every chunks for big chunks (as before;
        the write in flight counts), at the group-commit bounds for small ones."""
        if not self.small():
            return self.count >= self.ack_every
        return self.count >= MAX_BATCH_CHUNKS or self.bytes >= MAX_BATCH_BYTES


class Receiver:
    def __init__(
        self,
        dest: Path,
        token: bytes,
        limits: Limits | None = None,
        overwrite: bool = False,
        on_event: EventCallback = ignore,
        flush_every: int | None = None,
        owner: str | None = None,
        keep_partial: float | None = KEEP_PARTIAL,
    ):
        """`owner`: an id the processes of one receiver share (`rq recv --workers` passes its own to
        each worker); another receiver on the same DEST is refused a transfer one of them is
        writing (store.Store._owning). None: a new id, this receiver alone.
        `keep_partial`: seconds the partial state of a transfer nobody touched is kept for its
        sender to resume; older state is removed as the receiver starts, and `expired` says
        what went (store.Store.expire); while it runs, planning a new transfer sweeps again
        at most every SWEEP_EVERY seconds (a PartialExpired event), and so does a thread while
        nothing is planned. None or 0: never."""
        if not token.strip():
            raise AuthError("the receiver's token is empty: any sender would be let in")
        self.limits = limits or Limits()
        self.store = Store(dest, overwrite=overwrite, limits=self.limits, owner=owner)
        # a receiver killed mid-commit left files linked and others waiting: finish that first,
        # so DEST and its placed records agree before any transfer is planned against them
        self.expired = self.store.recover(keep_partial)
        self.keep_partial = keep_partial
        self._swept = time.monotonic()
        self.token = token
        self.overwrite = overwrite
        self.on_event = on_event
        self.flush_every = flush_every  # None: the channel's ack_every, else DEFAULT_ACK_EVERY
        self._lock = threading.Lock()
        self._plans: dict[str, _Shared] = {}
        self.completed = threading.Event()  # set after each committed transfer
        self.committed = 0  # transfers committed by this process (rq recv says so when stdout failed)
        # Ports of this receiver's processes (rq recv --workers): told to senders in ACCEPT so that
        # connection i goes to process i % N, instead of trusting SO_REUSEPORT's hash to spread them.
        self.data_ports: list[int] = []
        self._closing = threading.Event()
        self._sweeper: threading.Thread | None = None
        if keep_partial:
            self._sweeper = threading.Thread(target=self._sweep_idle, name="rq-recv-sweep", daemon=True)
            self._sweeper.start()

    def _sweep_idle(self) -> None:
        """An idle receiver sweeps too: a transfer abandoned while nothing else comes would keep its
        .part files (reserved whole: on /dev/shm, RAM) until the next plan or restart."""
        while not self._closing.wait(max(0.05, self._swept + SWEEP_EVERY - time.monotonic())):
            with self._lock, contextlib.suppress(Exception):  # (on_event's own failure included)
                if self._closing.is_set():
                    return
                self._sweep()

    def close(self) -> None:
        if self._closing.is_set():
            return  # closed already (its store's descriptors are gone)
        self._closing.set()
        if self._sweeper is not None and self._sweeper is not threading.current_thread():
            self._sweeper.join(timeout=10)
        with self._lock:
            for shared in self._plans.values():
                shared.plan.close()
            self._plans.clear()
        self.store.close()

    def in_flight(self) -> list[Manifest]:
        """The transfers this process serves right now (a channel of theirs open, not committed):
        what stopping it now cuts off mid-way. What arrived of them is durable and their senders'
        re-runs resume them. A transfer committed here, or by another process of the same
        receiver (`rq recv --workers`) whose channels here have not closed yet, is not one."""
        with self._lock:
            plans = [s.plan for s in self._plans.values() if s.users > 0 and not s.plan.closed]
        return [p.manifest for p in plans if not self.store.has_finished(p.manifest.transfer_id)]

    # -- plans shared by the channels of one transfer in this process ------------------------------

    def _open_plan(self, tid: str) -> _Shared | None:
        """The plan of transfer `tid` open in this process, if any. One that is closed (committed,
        or failed) while channels of its sender still hold it is none: a sender killed hard leaves
        its channels open here until they time out (QUIC: ~10 s; a TCP peer whose host died:
        IDLE_TIMEOUT), and a re-run meanwhile must be planned against what is on disk now, not
        against that plan's view (every chunk present, files placed that the user deleted since)."""
        shared = self._plans.get(tid)
        if shared is not None and shared.plan.closed:
            del self._plans[tid]  # its lingering channels' _release leaves the new one alone
            return None
        return shared

    def _acquire(self, tid: str, manifest: Manifest | None) -> _Shared:
        """The plan of transfer `tid` for a new channel: its MANIFEST (`manifest`) or a data channel
        (None). Two senders of the same source at once share it. One whose plan is being committed
        by the other waits for that commit outside the lock (it may take minutes) and is told
        FinishedMeanwhileError (retried: its retry hears "complete"); re-planning the transfer
        meanwhile dropped the journals of files the commit had placed."""
        while True:
            with self._lock:
                shared = self._open_plan(tid)
                if not self._plans:
                    self.store.reopen_if_removed()
                if shared is None:
                    plan = self.store.plan(manifest) if manifest is not None else self.store.join(tid)
                    shared = self._plans[tid] = _Shared(plan)
                    if manifest is not None:
                        self._sweep()  # after the plan: its own state is fresh and open (kept)
                    shared.users += 1
                    return shared
                with shared.plan.gate.shared(wait=False) as free:
                    if free:
                        self._replan(tid, manifest, shared)
                        shared.users += 1
                        return shared
                committing = shared.plan
            committing.gate.wait_idle()
            if committing.committed:
                raise FinishedMeanwhileError(FINISHED_MEANWHILE)

    def _replan(self, tid: str, manifest: Manifest | None, shared: _Shared) -> None:
        """A new channel of a transfer open here: what the disk says of its files now."""
        if manifest is None and shared.plan.planned_as != self.store.stamp(tid):
            # A data channel of a transfer planned again since this process opened it (a new
            # sender, its MANIFEST taken by another process of `rq recv --workers`): the files'
            # states are the new plan's. Before, a chunk of a file deleted since was "had"
            # here, ACKed unwritten, and the commit found it missing.
            newer = self.store.join(tid)
            try:
                shared.plan.refresh(newer)
            finally:
                newer.close()
        elif manifest is not None:
            # re-checks the destination (a reconnecting sender, or a new one while the dead
            # one's channels linger, or one beside it); the open plan stays, and so does its
            # reservation, but each file's state is the re-plan's: a placed file deleted since
            # is written again
            replan = self.store.plan(manifest, reserve=False)
            try:
                shared.plan.refresh(replan)
            finally:
                replan.close()

    def _sweep(self) -> None:
        """Expires abandoned partial state again, at most every SWEEP_EVERY seconds. Never a
        transfer open or being planned in any process (Store.expire); a failure waits for the
        next sweep and costs the transfer nothing."""
        if not self.keep_partial or time.monotonic() - self._swept < SWEEP_EVERY:
            return
        self._swept = time.monotonic()
        try:
            gone = self.store.expire(self.keep_partial)
        except (TransferError, OSError):
            return
        if gone.files:
            self.on_event(PartialExpired(gone.transfers, gone.files, gone.bytes, gone.older_than))

    def _release(self, tid: str, shared: _Shared) -> None:
        with self._lock:
            shared.users -= 1
            if shared.users <= 0 and self._plans.get(tid) is shared:
                del self._plans[tid]
                shared.plan.close()

    # -- one channel ---------------------------------------------------------------------------

    def handle_channel(self, ch: Channel) -> None:
        """Serves one channel until the sender closes it or something fails; never raises."""
        core = ReceiverChannel(self.token, os.urandom(16), self.limits)
        shared: _Shared | None = None
        every = (
            self.flush_every if self.flush_every is not None else getattr(ch, "ack_every", DEFAULT_ACK_EVERY)
        )
        readiness = _Readiness(ch)
        batch = _Batch(max(1, every), readiness)
        pending = batch.pending
        writer = _ChunkWriter(ch, pending)
        committed = False
        authenticated = False
        told = False  # an ERROR went to the sender
        _set_frame_limit(ch, PRE_AUTH_LIMIT)  # drivers that support it refuse big frames before AUTH
        try:
            while True:
                writer.before_recv()
                if shared is not None and batch.count and batch.small() and not readiness():
                    # group commit: nothing more to read right now, so make what arrived durable
                    # and ACK it before waiting (the sender may be waiting for this very ACK)
                    writer.wait()
                    self._flush(shared, core, batch)
                    self._send(ch, core)
                # After DONE, wait (briefly) for the sender to hang up: that is how we know DONE
                # arrived, before `rq recv --once` may exit and take the connection down with it.
                timeout = IDLE_TIMEOUT if authenticated else PRE_AUTH_TIMEOUT
                frame = ch.recv(timeout=LINGER if committed else timeout)
                if frame is None:
                    break
                for ev in core.handle(frame):
                    if isinstance(ev, ChunkVerified):
                        assert shared is not None
                        if shared.plan.has(ev.file, ev.index):
                            core.durable([(ev.file, ev.index)])  # a resend after a lost ACK
                            continue
                        writer.write(shared.plan, ev.file, ev.index, ev.data, ev.digest)
                        batch.add(len(ev.data))
                        shared.raw += len(ev.data)
                        shared.wire += ev.wire_bytes
                        self.on_event(ChunkMoved(len(ev.data), ev.wire_bytes))
                        # the write in flight counts: a sender whose window equals ack_every
                        # (an older rq's 8) must get its ACKs without a ninth chunk arriving
                        if batch.full():
                            writer.wait()
                            self._flush(shared, core, batch)
                    elif isinstance(ev, FlushRequested):
                        assert shared is not None
                        writer.wait()
                        self._flush(shared, core, batch)
                    elif isinstance(ev, ChunkRejected):
                        if shared is not None:
                            shared.resent += 1
                        self.on_event(ChunkResent(ev.reason))
                    elif isinstance(ev, Authenticated) and ev.role == "control":
                        authenticated = True
                        _set_frame_limit(ch, None)
                    elif isinstance(ev, Authenticated) and ev.role == "data":
                        authenticated = True
                        _set_frame_limit(ch, None)
                        shared = self._acquire(ev.transfer_id, None)
                        core.ready(shared.plan.manifest)
                    elif isinstance(ev, ManifestReceived) and self._completed(ev.manifest):
                        # an earlier run finished here (its sender never heard DONE): this is the
                        # transfer finishing, as far as this receiver (and `rq recv --once`) goes
                        core.accept(ev.manifest, [], complete=True)
                        self._send(ch, core)
                        self._already_complete(ev.manifest)
                        committed = True
                    elif isinstance(ev, ManifestReceived):
                        shared = self._acquire(ev.manifest.transfer_id, ev.manifest)
                        plan = shared.plan
                        core.accept(
                            plan.manifest,
                            [dict(fs.have) for fs in plan.files],
                            data_ports=self.data_ports,
                            progress_every=PROGRESS_S,
                            restarted=_indices(plan.manifest, plan.restarted),
                        )
                        m = plan.manifest
                        self.on_event(
                            TransferPlanned(
                                m.transfer_id,
                                len(m.files),
                                m.total_bytes,
                                m.total_chunks,
                                plan.have_bytes(),
                                tuple(plan.restarted),
                            )
                        )
                    elif isinstance(ev, CommitRequested):
                        assert shared is not None
                        writer.wait()
                        self._flush(shared, core, batch)
                        self._send(ch, core)  # the last ACKs, before PROGRESS may go out
                        progress = _Progress(ch, core)
                        try:
                            total = shared.plan.finalize(ev.roots, self.overwrite)
                        finally:
                            progress.stop()
                        summary = {
                            "transfer_id": shared.plan.manifest.transfer_id,
                            "files": len(shared.plan.manifest.files),
                            "bytes": total,
                            "verified": True,
                        }
                        core.done(summary)
                        self._send(ch, core)
                        self.on_event(
                            TransferFinished(
                                {**summary, "seconds": round(time.monotonic() - shared.started, 3)}
                            )
                        )
                        committed = True
                self._send(ch, core)
        except TransferError as exc:
            if self._shutting_down(ch):
                pass  # a closed plan's refusal ("transfer already finished") is not the reason: below
            elif not isinstance(exc, PeerUnreachableError):
                told = True
                core.fail(exc)
                with contextlib.suppress(Exception):
                    self._send(ch, core)
                # not a refusal: a redirect the sender follows; or frames a sender sent after this
                # transfer was committed and DONE went out (a second COMMIT, a late CHUNK): it
                # finished, and "refused a transfer" after "complete and verified" misled (fz)
                # nor is another sender's commit of this very transfer (it finished: the event
                # of that commit says so)
                if not isinstance(exc, ChunkSizeError | FinishedMeanwhileError) and not committed:
                    self._refused(shared, exc)
        except TimeoutError:
            pass  # the sender went quiet; what is durable stays, the sender resumes
        except OSError as exc:
            # Drivers report a lost peer as PeerUnreachableError: an OSError here is this side's
            # disk (a read-only or immutable DEST, EIO, a commit that cannot place a file). Silence
            # would leave the sender retrying and then blaming the network. Running out of
            # descriptors or memory passes, though: the sender's retry is the cure, not a refusal.
            if exc.errno in _TRANSIENT or self._shutting_down(ch):
                return
            told = True
            err = self._disk_error(exc, shared)
            core.fail(err)
            with contextlib.suppress(Exception):
                self._send(ch, core)
            self._refused(shared, err)
        finally:
            with contextlib.suppress(Exception):
                writer.close()  # a write that failed is not journalled; the error was or will be seen
            if authenticated and not committed and not told and self._shutting_down(ch):
                self._say_shut_down(ch, core, shared)
            if committed:
                with self._lock:
                    self.committed += 1
                self.completed.set()
            if shared is not None:
                with contextlib.suppress(TransferError, OSError):
                    self._flush(shared, None, batch)  # keep what arrived, so a resume skips it
                self._release(shared.plan.manifest.transfer_id, shared)
            with contextlib.suppress(Exception):
                ch.close()

    def _shutting_down(self, ch: Channel) -> bool:
        """This receiver, or the listener of `ch`, is being closed (drivers mark the channels
        their close() ends: `shutting_down`, docs/transfer.md)."""
        return self._closing.is_set() or bool(getattr(ch, "shutting_down", False))

    def _say_shut_down(self, ch: Channel, core: ReceiverChannel, shared: _Shared | None) -> None:
        """Tells an authenticated sender that the receiver went away under its transfer (SHUT_DOWN),
        unless that transfer finished (here, or in another process of `rq recv --workers`): a
        data channel lingering after the commit hears nothing more."""
        if shared is not None:
            try:
                if self.store.has_finished(shared.plan.manifest.transfer_id):
                    return
            except (TransferError, OSError, ValueError):
                pass
        core.outbox.clear()
        core.fail(PeerUnreachableError(SHUT_DOWN))
        with contextlib.suppress(Exception):
            self._send(ch, core)

    def _refused(self, shared: _Shared | None, err: TransferError) -> None:
        """TransferFailed, once per transfer and error: its other channels' same refusal (each
        data channel's write hit the full disk) is not another one."""
        if shared is not None:
            with self._lock:
                if err.code in shared.refused:
                    return
                shared.refused.add(err.code)
        self.on_event(TransferFailed(str(err), err.code))

    def _already_complete(self, m: Manifest) -> None:
        summary = {
            "transfer_id": m.transfer_id,
            "files": len(m.files),
            "bytes": m.total_bytes,
            "verified": True,
            "already_complete": True,
        }
        self.on_event(
            TransferPlanned(m.transfer_id, len(m.files), m.total_bytes, m.total_chunks, m.total_bytes)
        )
        self.on_event(TransferFinished({**summary, "seconds": 0.0}))

    def _disk_error(self, exc: OSError, shared: _Shared | None) -> TransferError:
        """The receiver's own OSError as what the sender is told: its strerror and the path
        relative to DEST, a partial file by the name it is for (the receiver's layout is none of
        the sender's business). rq's own state files (a manifest's temp name, a marker) are never
        named: the error is DEST's, and a read-only DEST (or one rq may not write in) says so."""
        where = ""
        internal = False
        if isinstance(exc.filename, str | bytes):
            shown = os.fsdecode(exc.filename)
            key = shown.rsplit(".", 1)[0]
            if shared is not None and shown.endswith((".part", ".journal")):
                names = [f.name for f in shared.plan.manifest.files if f.key == key]
                shown = display_name(names[0]) if names else "its partial files"
            elif _STATE_FILE.match(shown) or shown == STATE_DIR_NAME:
                internal = True
            if os.path.isabs(shown):  # relative names were opened against DEST's descriptor already
                dest = os.path.abspath(self.store.dest)
                inside = shown.startswith(dest + os.sep)
                shown = os.path.relpath(shown, dest) if inside else os.path.basename(shown)
            where = f" {shown!r}" if shown.isprintable() else f" {shown!a}"
            if internal:  # a full disk writing a commit marker's temp name said that name
                where = " its state files"
        reason = exc.strerror or type(exc).__name__
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return no_space(self.store.state_fd, f" writing{where}: {reason}")
        denied = exc.errno in (errno.EACCES, errno.EPERM)
        # "its destination", not DEST's path: the receiver's own paths stay on the receiver
        if exc.errno == errno.EROFS or (denied and (internal or not where)):
            return TransferError(f"receiver cannot write into its destination: not writable ({reason})")
        if internal or not where:
            return TransferError(f"receiver cannot write into its destination: {reason}")
        return TransferError(f"receiver cannot write{where}: {reason}")

    def _completed(self, manifest: Manifest) -> bool:
        with self._lock:
            if not self._plans:
                self.store.reopen_if_removed()
            return self._open_plan(manifest.transfer_id) is None and self.store.completed(manifest)

    def _flush(self, shared: _Shared, core: ReceiverChannel | None, batch: _Batch) -> None:
        pending = batch.pending
        if not pending:
            return
        shared.plan.make_durable(pending)
        if core is not None:
            core.durable([(f, k) for f, k, _ in pending])
        pending.clear()
        batch.cleared()

    @staticmethod
    def _send(ch: Channel, core: ReceiverChannel) -> None:
        if core.outbox:
            out, core.outbox = core.outbox, []
            ch.send(*out)


def _set_frame_limit(ch: Channel, limit: int | None) -> None:
    """Optional driver capability (docs/transfer.md): a cap on the next frames' size."""
    with contextlib.suppress(AttributeError):
        ch.frame_limit = limit  # type: ignore[attr-defined]


def _indices(m: Manifest, names: list[str]) -> list[int]:
    """The manifest indices of these file names (for ACCEPT's restarted list)."""
    wanted = set(names)
    return [i for i, f in enumerate(m.files) if f.name in wanted]
