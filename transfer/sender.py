"""The sending glue: plans with the receiver, spreads missing chunks over channels, commits.

Every attempt starts from what the receiver says it has (ACCEPT), so reconnecting after a
transient failure and re-running after a kill are the same code path: only missing chunks move
and nothing already verified is read or hashed again.
"""

from __future__ import annotations

import collections
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from transfer import codec
from transfer.errors import (
    FINISHED_MEANWHILE,
    AuthError,
    BusyError,
    ChunkSizeError,
    PeerUnreachableError,
    ProtocolError,
    StalledError,
    TransferError,
    UnresolvedError,
    VerifyError,
)
from transfer.events import (
    ChunkMoved,
    ChunkResent,
    ChunkSizeAdopted,
    DatagramNarrowed,
    Event,
    EventCallback,
    Retrying,
    SendProgress,
    SourceSkipped,
    TransferFinished,
    TransferPlanned,
    ignore,
)
from transfer.frames import ChunkHeader, Frame, FrameType, chunk_frame_header, header
from transfer.manifest import DEFAULT_CHUNK, MAX_CHUNK, MIN_CHUNK, Manifest
from transfer.session import CONTROL, DATA, Accepted, Acked, Done, Nacked, Ready, SenderChannel, SenderEvent
from transfer.source import Reader, Skipped, SourceFile, check_unchanged, scan
from transfer.transport import Channel, Connection, ConnectOptions, Transport

Pair = tuple[int, int]
# Errors worth reconnecting for; anything else (auth, limits, names, exists, verify) is final.
TRANSIENT: tuple[type[BaseException], ...] = (PeerUnreachableError, ConnectionError, TimeoutError, OSError)
# ...and a receiver busy with another transfer of the same file, which may be a dead one (send()).
RETRIED: tuple[type[BaseException], ...] = (*TRANSIENT, BusyError)
MAX_RESENDS_PER_CHUNK = 8
DEFAULT_WINDOW = 8  # unacknowledged chunks per channel where the transport names none
# A full window this long without an ACK makes the sender send FLUSH: a rescue for a receiver whose
# ACK cadence is longer than this window (a library caller's small window), not a pace-setter. Not at
# once: on QUIC, where ACKs come every 2 chunks against a window of 8, an immediate FLUSH meant an
# extra fdatasync for nearly every chunk; and not after 50 ms either, which a disk slower than
# ~640 MB/s takes for TCP's 32 MiB ACK batches, so FLUSHes would double its fdatasyncs.
STALL_S = 0.25
# Seconds to keep trying a receiver that has never answered (less when --timeout is shorter).
FIRST_CONNECT_GRACE = 10.0
# How long a COMMIT may wait for DONE at least (--timeout may raise it): placing files costs the
# receiver a link and an fsync each, which for many files takes a while on a slow disk.
COMMIT_WAIT = 120.0
# A receiver that announced PROGRESS frames (ACCEPT "progress": its interval) is given this many of
# its intervals of silence after COMMIT (at most the COMMIT wait above), then taken for stalled and
# retried; each PROGRESS starts the wait again, so a long placement that keeps reporting goes on.
PROGRESS_SILENCE = 3.0


@dataclass
class SendOptions:
    connections: int = 1
    streams: int = 2
    chunk_size: int = DEFAULT_CHUNK
    compress: codec.CompressMode = "auto"
    window: int | None = None  # unacknowledged chunks per channel; None: the transport's send_window
    retry_for: float = 60.0  # give up after this long without progress
    # how long to keep trying a receiver that has never answered; None: retry_for, at most
    # FIRST_CONNECT_GRACE and at most ack_timeout, so a wrong address does not hang for a minute
    # (nor 10 s for a caller who said 2). A caller that means to start the sender before the
    # receiver is up (CI, a pod not yet scheduled) sets it
    first_connect_for: float | None = None
    # A connection over which nothing moves for this long while chunks wait on the receiver (no
    # byte of theirs reaches it and it confirms nothing) is dropped and retried like a lost one: a
    # stopped or hung receiver, or one whose disk stalled; TCP would otherwise block in sendall on a
    # zero window for ever. Bytes still draining to the receiver count as movement, so a slow link
    # is not taken for a stalled one (a fixed ACK deadline was: one ACK batch of 8 × 64 MiB chunks
    # takes minutes at 1.5 MB/s). Time spent reading the source is not counted. 0: off.
    # Below ConnectOptions.timeout it also bounds each connect and the wait for the receiver's
    # first answer (a dead address fails within it, as curl --connect-timeout / ssh ConnectTimeout).
    ack_timeout: float = 120.0
    # follow every symlink to a file out of a directory SOURCE, also those someone else made
    # (transfer.source._outside; rq send --follow-symlinks)
    follow_symlinks: bool = False


@dataclass
class Stats:
    raw: int = 0
    wire: int = 0
    resent: int = 0
    chunks: int = 0
    acked: int = 0  # chunks the receiver confirmed durable (each once per attempt)
    had_bytes: int = 0  # bytes the receiver already held when it last accepted the manifest
    had_chunks: int = 0  # chunks it already held then
    acked_at_plan: int = 0  # `acked` when it last accepted the manifest
    # what the receiver held when it first accepted the manifest in this run: an earlier run's
    # (None: it never accepted it); the summary's resumed_bytes
    resumed_bytes: int | None = None
    already_complete: bool = False  # an earlier run had finished it: nothing was moved
    # files the receiver restarted because their source changed since an earlier attempt: their
    # names (at most RESTARTED_LISTED) and how many in all
    restarted: tuple[str, ...] = ()
    restarted_count: int = 0
    # The most chunks the receiver ever held durable as far as this run knows (what its ACCEPT
    # listed plus what it acknowledged since): the progress --retry-for measures. A receiver that
    # forgets what it acknowledged and acknowledges it again has not moved the transfer on.
    durable_best: int = 0
    connected: bool = False  # the receiver accepted a manifest at least once
    sent: set[tuple[int, int]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, raw: int, wire: int, pair: tuple[int, int]) -> bool:
        """Counts one chunk on the wire; True if it had been sent before (NACK, or lost with a connection)."""
        with self.lock:
            self.raw += raw
            self.wire += wire
            self.chunks += 1
            again = pair in self.sent
            if again:
                self.resent += 1
            else:
                self.sent.add(pair)
            return again

    def add_acked(self, n: int) -> None:
        with self.lock:
            self.acked += n


class Work:
    """The chunks still to move in this attempt, shared by every channel (work stealing)."""

    def __init__(self, todo: list[Pair], on_acked: Callable[[int], None] | None = None):
        self._todo: collections.deque[Pair] = collections.deque(todo)
        self._on_acked = on_acked
        self._outstanding = set(todo)
        self._tries: dict[Pair, int] = {}
        self.cond = threading.Condition()
        self.failure: BaseException | None = None

    def take(self) -> Pair | None:
        with self.cond:
            return self._todo.popleft() if self._todo else None

    def done(self, pairs: list[Pair]) -> None:
        with self.cond:
            new = sum(1 for p in pairs if p in self._outstanding)
            self._outstanding.difference_update(pairs)
            self.cond.notify_all()
        if new and self._on_acked is not None:
            self._on_acked(new)

    def again(self, pairs: list[Pair], count: bool) -> None:
        with self.cond:
            for p in pairs:
                if p in self._outstanding:
                    if count:
                        self._tries[p] = self._tries.get(p, 0) + 1
                        if self._tries[p] > MAX_RESENDS_PER_CHUNK:
                            self.fail(
                                VerifyError(f"chunk {p[0]}/{p[1]} failed verification {self._tries[p]} times")
                            )
                    self._todo.appendleft(p)
            self.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.failure is None:
                self.failure = exc
            self.cond.notify_all()

    @property
    def finished(self) -> bool:
        return not self._outstanding


def handshake(
    ch: Channel, core: SenderChannel, timeout: float, answer_within: float | None = None
) -> SenderEvent:
    """HELLO to ACCEPT/READY; the receiver's first answer (its CHALLENGE) within `answer_within`
    (default `timeout`), the rest (ACCEPT: the receiver plans the transfer) within `timeout`."""
    core.start()
    first = True
    while True:
        if core.outbox:
            out, core.outbox = core.outbox, []
            ch.send(*out)
        frame = ch.recv(timeout=answer_within if first and answer_within is not None else timeout)
        first = False
        if frame is None:
            raise PeerUnreachableError("receiver closed the connection during the handshake")
        try:
            events = core.handle(frame)
        except AuthError:
            # the receiver failed its proof of the token: tell its side why (an older rq recv's
            # user reads "upgrade"), then hang up; nothing else was or will be sent
            if core.outbox:
                with contextlib.suppress(Exception):
                    ch.send(*core.outbox)
                core.outbox.clear()
            with contextlib.suppress(Exception):
                ch.close()
            raise
        for ev in events:
            if isinstance(ev, Accepted | Ready):
                if core.outbox:
                    out, core.outbox = core.outbox, []
                    ch.send(*out)
                return ev


class ChannelSender:
    """Moves chunks from `work` over one data channel; a reader thread takes ACK/NACK."""

    def __init__(
        self,
        ch: Channel,
        core: SenderChannel,
        work: Work,
        reader: Reader,
        opts: SendOptions,
        digests: list[dict[int, bytes]],
        stats: Stats,
        on_event: EventCallback,
        elem: list[int],
    ):
        self.ch, self.core, self.work, self.reader, self.opts = ch, core, work, reader, opts
        self.digests, self.stats, self.on_event, self.elem = digests, stats, on_event, elem
        self.inflight: set[Pair] = set()
        self.error: BaseException | None = None
        self.window = opts.window or DEFAULT_WINDOW
        self._moved = 0  # chunks handed to the channel and ACK/NACK frames heard: the watchdog's signal
        self._reading = False  # reading the source: time the receiver is not to blame for
        self._ended = threading.Event()

    def _fail(self, exc: BaseException) -> None:
        with self.work.cond:
            if self.error is None:  # the first cause wins over what closing the channel caused
                self.error = exc
            self.work.cond.notify_all()

    def _read_replies(self) -> None:
        try:
            while True:
                frame = self.ch.recv(timeout=None)
                if frame is None:
                    raise PeerUnreachableError("receiver closed the channel")
                self._moved += 1
                self._on_frame(frame)
        except BaseException as exc:
            self._fail(exc)

    def _watch(self, limit: float) -> None:
        """Drops the channel when nothing has moved for `limit` seconds while chunks wait on the
        receiver: neither an ACK or NACK heard, nor a chunk handed over, nor (where the channel can
        tell: TcpChannel.progress) a byte of one reaching the receiver."""
        progress: Callable[[], int] | None = getattr(self.ch, "progress", None)
        last: tuple[int, int] | None = None
        since = time.monotonic()
        while not self._ended.wait(min(1.0, limit / 4)):
            seen = (self._moved, progress() if progress is not None else 0)
            with self.work.cond:
                waiting = bool(self.inflight) and not self._reading and self.error is None
            now = time.monotonic()
            if not waiting or seen != last:
                last, since = seen, now
            elif now - since >= limit:
                self._fail(
                    StalledError(
                        f"nothing reached the receiver and it confirmed nothing for {limit:g} s "
                        "(stopped, hung, or its disk stalled)"
                    )
                )
                self.ch.close()  # unblocks a send stuck on a full socket buffer, and the reader
                return

    def _on_frame(self, frame: Frame) -> None:
        for ev in self.core.handle(frame):
            if isinstance(ev, Acked):
                with self.work.cond:
                    self.inflight.difference_update(ev.pairs)
                self.work.done(ev.pairs)
            elif isinstance(ev, Nacked):
                with self.work.cond:
                    self.inflight.difference_update(ev.pairs)
                self.work.again(ev.pairs, count=True)  # counted as resent when they go out again

    def _stalled(self, window: int) -> bool:
        """Waits up to STALL_S for an ACK to open the window; True if none came."""
        with self.work.cond:
            return not self.work.cond.wait_for(
                lambda: (
                    len(self.inflight) < window or self.error is not None or self.work.failure is not None
                ),
                timeout=STALL_S,
            )

    def run(self) -> None:
        replies = threading.Thread(target=self._read_replies, daemon=True)
        replies.start()
        if self.opts.ack_timeout > 0:
            threading.Thread(target=self._watch, args=(self.opts.ack_timeout,), daemon=True).start()
        try:
            self._run(replies)
        finally:
            self._ended.set()

    def _run(self, replies: threading.Thread) -> None:
        flushed = True
        m = self.core.manifest
        window = self.window
        try:
            while True:
                if not flushed and len(self.inflight) >= window and self._stalled(window):
                    # the window stayed full: ask for ACKs rather than wait for a receiver whose
                    # cadence (ack_every) may be longer than this window
                    self.ch.send(header(FrameType.FLUSH, 0))
                    flushed = True
                with self.work.cond:
                    while len(self.inflight) >= window and self.error is None and self.work.failure is None:
                        self.work.cond.wait(0.5)
                    if self.error is not None:
                        raise self.error
                    if self.work.failure is not None:
                        return
                    item = self.work.take()
                    if item is None:
                        if self.work.finished:
                            return
                        if not self.inflight:
                            self.work.cond.wait(0.2)  # others may still get NACKs to redo
                            continue
                if item is None:
                    if not flushed:
                        self.ch.send(header(FrameType.FLUSH, 0))
                        flushed = True
                    with self.work.cond:
                        self.work.cond.wait(0.2)
                    continue
                f, k = item
                with self.work.cond:
                    self.inflight.add(item)
                self._send_chunk(m, f, k)
                flushed = False
        except BaseException as exc:
            self.work.again(sorted(self.inflight), count=False)
            if isinstance(exc, PeerUnreachableError):
                # The receiver usually says why before it hangs up (disk full, refused): prefer
                # that, and the reader's own verdict on a stalled receiver to the broken send after
                replies.join(1.0)
                if isinstance(self.error, StalledError) or (
                    isinstance(self.error, TransferError) and not isinstance(self.error, PeerUnreachableError)
                ):
                    raise self.error from None
            raise

    def _send_chunk(self, m: Manifest, f: int, k: int) -> None:
        length = m.files[f].chunk_len(k, m.chunk_size)
        self._reading = True
        try:
            data = self.reader.read(f, k, length)
            dig = codec.digest(data)
            self.digests[f][k] = dig
            kind, payload = codec.encode(data, self.opts.compress, self.elem[f])
        finally:
            self._reading = False
        head = chunk_frame_header(ChunkHeader(f, k, length, kind, dig), len(payload))
        if self.reader.mapped and kind == codec.Codec.RAW:
            # the payload is the source file mapped: it goes out only while the read lease holds
            self.ch.send(head, payload, steady=self.reader.steady)  # type: ignore[call-arg]
        else:
            self.ch.send(head, payload)
        if k == m.files[f].chunks(m.chunk_size) - 1:
            self.reader.finished(f)  # its last chunk is out: a writer need not wait for the acks
        self._moved += 1
        if self.stats.add(length, len(payload) + 37, (f, k)):
            self.on_event(ChunkResent("sent again"))
        self.on_event(ChunkMoved(length, len(payload) + 37, f, k))


def run_connection(
    conn: Connection,
    channels: int,
    token: bytes,
    manifest: Manifest,
    files: list[SourceFile],
    work: Work,
    opts: SendOptions,
    digests: list[dict[int, bytes]],
    stats: Stats,
    on_event: EventCallback,
    timeout: float,
) -> None:
    """Runs `channels` data channels on one connection until `work` is finished or one fails."""
    senders = []
    for _ in range(channels):
        ch = conn.open_channel()
        core = SenderChannel(token, DATA, manifest, os.urandom(16))
        handshake(ch, core, timeout)
        elem = [f.elem for f in manifest.files]
        reader = Reader(files, manifest.chunk_size, mapped=getattr(ch, "map_safe", False))
        senders.append(ChannelSender(ch, core, work, reader, opts, digests, stats, on_event, elem))
    errors: list[BaseException] = []

    def _run(s: ChannelSender) -> None:
        try:
            s.run()
        except BaseException as exc:
            errors.append(exc)
            work.fail(exc)
        finally:
            s.reader.close()

    threads = [threading.Thread(target=_run, args=(s,), daemon=True) for s in senders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in senders:
        with contextlib.suppress(Exception):
            s.ch.close()
    if errors:
        raise errors[0]
    if work.failure is not None:
        raise work.failure


def send(
    sources: list[Path],
    transport: Transport,
    copts: ConnectOptions,
    token: bytes,
    opts: SendOptions | None = None,
    on_event: EventCallback = ignore,
) -> dict[str, Any]:
    """Sends `sources` to the receiver; retries transient failures; returns the --json summary."""
    opts = opts or SendOptions()
    if opts.window is None:
        opts = replace(opts, window=getattr(transport, "send_window", DEFAULT_WINDOW))
    skipped: list[Skipped] = []
    manifest, files = scan(sources, opts.chunk_size, skipped, opts.follow_symlinks)
    for sk in skipped:
        on_event(SourceSkipped(str(sk.path), sk.reason))
    run = _Run(manifest, files, opts)
    on_event = _Progress(on_event)
    started = time.monotonic()
    try:
        _resolve(copts.host, copts.port)
        done = _send_retrying(sources, transport, copts, token, run, on_event)
    except BaseException as exc:
        # what was done before it stopped: the CLI still ends its --json output with a summary
        exc.partial_summary = _summary(run, started, skipped, {})  # type: ignore[attr-defined]
        raise
    summary = _summary(run, started, skipped, done)
    on_event(TransferFinished(summary))
    return summary


class _Progress:
    """Passes every event on, and after each TransferPlanned and ChunkMoved a SendProgress that
    never goes down: what the receiver held at the last plan plus each chunk sent since, once."""

    def __init__(self, on_event: EventCallback):
        self._on_event = on_event
        self._lock = threading.Lock()
        self._sent: set[Pair] = set()  # since the last plan (a NACKed chunk goes out again)
        self._now = 0  # the bytes held at the last plan plus those sent since
        self._shown = -1
        self._total = 0

    def __call__(self, ev: Event) -> None:
        self._on_event(ev)
        with self._lock:
            if isinstance(ev, TransferPlanned):
                self._sent.clear()
                self._now, self._total = ev.have_bytes, ev.total_bytes
            elif isinstance(ev, ChunkMoved) and (ev.file, ev.index) not in self._sent:
                self._sent.add((ev.file, ev.index))
                self._now += ev.raw_bytes
            else:
                return
            if self._now <= self._shown:
                return  # a reconnect: held still until the transfer passes where it was
            self._shown = self._now
            self._on_event(SendProgress(self._now, self._total))  # under the lock: in order


def _resolve(host: str, port: int) -> None:
    """Refuses a host name that does not resolve before any attempt: retried, it was blamed on
    the receiver after 10 s ("is `rq recv` running there?"). Later attempts resolve it again, and
    a failure then is retried like any other (a name that resolved once may come back)."""
    try:
        socket.getaddrinfo(host, port)
    except socket.gaierror as exc:
        raise UnresolvedError(f"cannot resolve {host}: {exc.strerror or exc}") from None


@dataclass
class _Run:
    """One `send` across its attempts: what it sends (re-planned if the receiver's chunk size is
    adopted) and what happened so far."""

    manifest: Manifest
    files: list[SourceFile]
    opts: SendOptions
    stats: Stats = field(default_factory=Stats)
    attempts: int = 0
    # what every later connection adds to ConnectOptions.extra: the datagram size a QUIC
    # connection fell back to (DatagramNarrowed), so it is found once, not per connection
    learned: dict[str, Any] = field(default_factory=dict)


def _summary(run: _Run, started: float, skipped: list[Skipped], done: dict[str, Any]) -> dict[str, Any]:
    """The --json summary; `done` is empty when the send stopped before the end."""
    manifest, stats = run.manifest, run.stats
    seconds = time.monotonic() - started
    with stats.lock:
        acked = stats.acked
    return {
        "transfer_id": manifest.transfer_id,
        "files": len(manifest.files),
        "dirs": len(manifest.dirs),
        "bytes_total": manifest.total_bytes,
        "bytes_raw": stats.raw,
        "bytes_on_wire": stats.wire,
        "ratio": round(stats.wire / stats.raw, 4) if stats.raw else 1.0,
        "seconds": round(seconds, 3),
        "mb_per_s": round(stats.raw / seconds / 1e6, 1) if seconds > 0 else 0.0,
        "chunks_sent": stats.chunks,
        "chunks_resent": stats.resent,
        "chunks_acked": acked,
        "attempts": run.attempts,
        "verified": bool(done.get("verified")),
        "complete": bool(done),
        "skipped": len(skipped),
        "chunk_size": run.opts.chunk_size,
        # the receiver holds part of it (this run's acknowledged chunks or an earlier run's): a re-run resumes
        "resumable": not done and (acked > 0 or stats.had_bytes > 0),
        # bytes the receiver held from an earlier run when this one began (not moved again)
        "resumed_bytes": stats.resumed_bytes or 0,
        "already_complete": stats.already_complete,
        # chunks the receiver holds durable as far as this run knows, of chunks_total
        "chunks_held": min(stats.had_chunks + acked - stats.acked_at_plan, manifest.total_chunks),
        "chunks_total": manifest.total_chunks,
        # files whose source changed since an earlier attempt: the receiver sent them again whole
        "restarted": list(stats.restarted),
        "restarted_count": stats.restarted_count,
    }


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and not isinstance(exc, TransferError):
        return "no answer from the receiver within the timeout"  # (a socket's own text: "timed out")
    return str(exc) or type(exc).__name__


def _send_retrying(
    sources: list[Path],
    transport: Transport,
    copts: ConnectOptions,
    token: bytes,
    run: _Run,
    on_event: EventCallback,
) -> dict[str, Any]:
    stats = run.stats
    attempt = 0
    last_progress = time.monotonic()
    adopted = False
    stall_forgiven = False
    finished_meanwhile = 0  # retries made past --retry-for because another sender committed it
    while True:
        # Progress is what the receiver acknowledged: chunks merely sent may be lost with the
        # connection, and counting those let a send that could never finish retry forever. Nor
        # do chunks acknowledged again count (a receiver that never answers COMMIT and forgets
        # what it had acknowledged made a send re-send, re-commit and retry forever): only a
        # receiver holding more durable chunks than ever before has moved the transfer on.
        before = stats.acked
        run.attempts += 1
        limit = _patience(run.opts, stats.connected)
        # a connect and the receiver's first answer: at most --timeout, and for a receiver that
        # never answered at most what is left of its wait (a dead address fails within it)
        within = _answer_within(copts, run.opts)
        if not stats.connected:
            within = min(within, max(0.1, limit - (time.monotonic() - last_progress)))
        try:
            return _attempt(
                run.manifest,
                run.files,
                transport,
                copts,
                token,
                run.opts,
                stats,
                on_event,
                run.learned,
                within,
            )
        except ChunkSizeError as exc:
            # The receiver holds verified chunks of these very files at another chunk size (an
            # interrupted run with another --chunk-size): re-plan at its size, once, and keep them.
            if adopted or not MIN_CHUNK <= exc.chunk_size <= MAX_CHUNK:
                raise
            adopted = True
            on_event(ChunkSizeAdopted(exc.chunk_size, run.opts.chunk_size))
            run.opts = replace(run.opts, chunk_size=exc.chunk_size)
            run.manifest, run.files = scan(sources, run.opts.chunk_size, [], run.opts.follow_symlinks)
        except RETRIED as exc:
            busy = isinstance(exc, BusyError)
            if isinstance(exc, TransferError) and not isinstance(exc, PeerUnreachableError | BusyError):
                raise
            # Busy: another transfer on the receiver is writing one of our files. It may be a
            # sender killed a moment ago whose connection the receiver has not yet timed out
            # (QUIC: 10 s), so wait for it within --retry-for, then give up with the refusal.
            stats.connected = stats.connected or busy
            if _moved_on(stats, before):
                last_progress = time.monotonic()
                attempt = 0  # it was moving: retry quickly
                stall_forgiven = False
            elif isinstance(exc, StalledError) and not stall_forgiven:
                # The stall detector waits --timeout (120 s), longer than --retry-for (60 s): a
                # path that died before this connection's first ACK (a partition, the sender's
                # address changed) was given up at once, never reconnected, though it had come
                # back (np). One reconnect after a stall, once per stretch without progress: a
                # receiver that accepts and then confirms nothing still ends the send.
                last_progress = time.monotonic()
                stall_forgiven = True
            limit = _patience(run.opts, stats.connected)
            waited = time.monotonic() - last_progress
            if busy and FINISHED_MEANWHILE in str(exc) and finished_meanwhile < 3:
                # another sender of this transfer committed it: a retry hears "complete", so it is
                # made whatever --retry-for says (dr4: --retry-for 0 failed 'busy' on a transfer done)
                finished_meanwhile += 1
                waited = 0.0
            if waited > limit:
                if busy:
                    raise
                raise PeerUnreachableError(
                    f"gave up after {waited:.0f}s without progress: {_reason(exc)}"
                ) from None
            attempt += 1
            delay = min(2.0, 0.1 * 2**attempt)
            if not stats.connected:
                delay = min(delay, max(0.0, limit - waited))  # the last try at the end of the wait
            on_event(Retrying(attempt, _reason(exc), delay))
            time.sleep(delay)


def _patience(opts: SendOptions, connected: bool) -> float:
    """How long the send keeps retrying without progress. Until the receiver has answered once, a
    wrong address should not hang for a minute: FIRST_CONNECT_GRACE, or --timeout where that is
    shorter (a user who says 2 s means it for a dead address too), or first_connect_for (a given
    --retry-for: a receiver not up yet is waited for that long)."""
    if connected:
        return opts.retry_for
    if opts.first_connect_for is not None:
        return opts.first_connect_for
    grace = min(opts.retry_for, FIRST_CONNECT_GRACE)
    return min(grace, opts.ack_timeout) if opts.ack_timeout > 0 else grace


def _answer_within(copts: ConnectOptions, opts: SendOptions) -> float:
    """How long a connect and the receiver's first answer may take: ConnectOptions' own bound,
    less where --timeout (ack_timeout: nothing moves for this long) is shorter."""
    within = copts.connect_within
    return min(within, opts.ack_timeout) if opts.ack_timeout > 0 else within


def _moved_on(stats: Stats, acked_before: int) -> bool:
    """Whether the attempt that started with `acked_before` acknowledgements left the receiver
    holding more durable chunks than any attempt before it."""
    acked = stats.acked - acked_before
    if acked <= 0:
        return False
    durable = stats.had_chunks + acked
    if durable <= stats.durable_best:
        return False
    stats.durable_best = durable
    return True


def _attempt(
    manifest: Manifest,
    files: list[SourceFile],
    transport: Transport,
    copts: ConnectOptions,
    token: bytes,
    opts: SendOptions,
    stats: Stats,
    on_event: EventCallback,
    learned: dict[str, Any],
    within: float | None = None,
) -> dict[str, Any]:
    """One plan-and-move; `within`: how long the connect and the receiver's first answer may take."""
    if learned:
        copts = replace(copts, extra={**copts.extra, **learned})
    conn = transport.connect(copts if within is None else replace(copts, connect_timeout=within))
    narrowed = getattr(conn, "datagram_fallback", None)
    if narrowed is not None:
        learned["datagram_size"] = narrowed[1]
        copts = replace(copts, extra={**copts.extra, **learned})
        on_event(DatagramNarrowed(*narrowed))
    try:
        ctl = conn.open_channel()
        core = SenderChannel(token, CONTROL, manifest, os.urandom(16))
        accepted = handshake(ctl, core, copts.timeout, within)
        assert isinstance(accepted, Accepted)
        stats.connected = True
        if accepted.restarted_count and not stats.restarted_count:
            stats.restarted = tuple(manifest.files[i].name for i in accepted.restarted)
            stats.restarted_count = accepted.restarted_count
        if accepted.complete:  # an earlier run finished; it just never heard DONE
            if stats.resumed_bytes is None:
                stats.resumed_bytes = manifest.total_bytes
                stats.already_complete = True
            with stats.lock:
                stats.had_bytes, stats.had_chunks = manifest.total_bytes, manifest.total_chunks
                stats.acked_at_plan = stats.acked
            on_event(
                TransferPlanned(
                    manifest.transfer_id,
                    len(manifest.files),
                    manifest.total_bytes,
                    manifest.total_chunks,
                    manifest.total_bytes,
                )
            )
            return {"verified": True, "already_complete": True}
        have = accepted.have
        cs = manifest.chunk_size
        todo = [(f, k) for f, e in enumerate(manifest.files) for k in range(e.chunks(cs)) if k not in have[f]]
        have_bytes = manifest.total_bytes - sum(manifest.files[f].chunk_len(k, cs) for f, k in todo)
        with stats.lock:
            stats.had_bytes = have_bytes
            stats.had_chunks = manifest.total_chunks - len(todo)
            stats.acked_at_plan = stats.acked
        if stats.resumed_bytes is None:
            stats.resumed_bytes = have_bytes
        stats.durable_best = max(stats.durable_best, stats.had_chunks)
        on_event(
            TransferPlanned(
                manifest.transfer_id,
                len(manifest.files),
                manifest.total_bytes,
                manifest.total_chunks,
                have_bytes,
                tuple(manifest.files[i].name for i in accepted.restarted),
                accepted.restarted_count,
            )
        )
        digests = [dict(h) for h in have]
        if todo:
            ports = list(accepted.data_ports)
            _move(todo, conn, transport, copts, token, manifest, files, opts, digests, stats, on_event, ports)
        check_unchanged(files)
        roots = []
        for f, e in enumerate(manifest.files):
            try:
                roots.append(codec.root_digest([digests[f][k] for k in range(e.chunks(cs))]).hex())
            except KeyError:
                raise ProtocolError("internal: a chunk was acknowledged without a digest") from None
        core.commit(roots)
        ctl.send(*core.outbox)
        core.outbox.clear()
        wait = max(opts.ack_timeout, COMMIT_WAIT) if opts.ack_timeout > 0 else None
        if wait is not None and accepted.progress_every is not None:
            wait = min(wait, PROGRESS_SILENCE * accepted.progress_every)
        while True:
            frame = ctl.recv(timeout=wait)
            if frame is None:
                raise PeerUnreachableError("receiver closed the connection before confirming the commit")
            for ev in core.handle(frame):
                if isinstance(ev, Done):
                    return ev.summary
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def _move(
    todo: list[Pair],
    conn: Connection,
    transport: Transport,
    copts: ConnectOptions,
    token: bytes,
    manifest: Manifest,
    files: list[SourceFile],
    opts: SendOptions,
    digests: list[dict[int, bytes]],
    stats: Stats,
    on_event: EventCallback,
    data_ports: list[int] | None = None,
) -> None:
    if transport.connection_per_process and opts.connections > 1:
        from transfer.procs import move_in_processes

        move_in_processes(
            todo, transport, copts, token, manifest, files, opts, digests, stats, on_event, data_ports or []
        )
        return
    work = Work(todo, stats.add_acked)
    conns = [conn] + [transport.connect(copts) for _ in range(opts.connections - 1)]
    errors: list[BaseException] = []

    def _run(c: Connection) -> None:
        try:
            run_connection(
                c, opts.streams, token, manifest, files, work, opts, digests, stats, on_event, copts.timeout
            )
        except BaseException as exc:
            errors.append(exc)
            work.fail(exc)

    threads = [threading.Thread(target=_run, args=(c,), daemon=True) for c in conns]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        # also when the join is interrupted (KeyboardInterrupt in a process using rq as a library):
        # the extra connections went unclosed, their loop threads and channel readers with them
        for c in conns[1:]:
            with contextlib.suppress(Exception):
                c.close()
    if errors:
        # prefer the error that says most: a refusal beats the connection loss it caused
        errors.sort(key=lambda e: isinstance(e, PeerUnreachableError | OSError))
        raise errors[0]
    if work.failure is not None:
        raise work.failure  # e.g. a chunk that kept failing verification
    if not work.finished:
        raise PeerUnreachableError("channels ended before every chunk was acknowledged")
