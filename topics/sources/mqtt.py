"""MQTT as a live-only source (tail) and a sink (produce), with paho-mqtt.

MQTT keeps no history, so there is nothing to seek or replay: offsets are the arrival count of this
subscription (0, 1, 2, ...), timestamps the arrival time, and the key is the message's topic.
`rq tail mqtt://... --record NAME` appends what arrives to the embedded log so it can be replayed.
"""

from __future__ import annotations

import contextlib
import errno
import queue
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from topics.errors import (
    AccessDenied,
    AppendedPartly,
    ConnectionLost,
    ProtocolViolation,
    RecordTooLarge,
    SourceUnreachable,
    SpecError,
    TopicError,
    Unsupported,
)
from topics.record import NO_HEADERS, Headers, Record
from topics.sources.access import Access, hostport, mqtt_access, reason, tls_context, tls_hint
from topics.sources.base import Appended, Pending

_DRAIN = 4096

# What a tail holds of messages received but not yet written out (payload and topic bytes, plus
# _PER_MESSAGE each): past it, paho's network thread waits in on_message, so the socket is not read
# and TCP holds the broker back, as mosquitto_sub's blocking write does. Unbounded, a tail into a
# stalled reader (a pager left open) grew by all a busy broker sent: 190 MB for 600 MB in 10 s.
# One message larger than the bound (up to --max-packet-size) is still taken, alone.
HOLD_BYTES = 64 * 1024 * 1024
_PER_MESSAGE = 128


_REFUSED_AUTH = ("bad user name or password", "not authorized")


# The largest MQTT packet rq takes from a broker (its remaining length, as the packet's fixed
# header declares it): paho buffers whatever is declared, up to MQTT's 256 MiB, before anything
# sees it. Raised with `rq tail --max-packet-size` / RQ_MQTT_MAX_PACKET_SIZE. `rq produce` sends
# none larger (MqttSink).
MAX_PACKET_SIZE = 16 * 1024 * 1024


def too_large(where: str, declared: int, limit: int) -> ProtocolViolation:
    return ProtocolViolation(
        f"MQTT broker at {where} sent a packet of {declared} bytes, more than rq takes ({limit} bytes): "
        "rq closed the connection; raise the limit with --max-packet-size or RQ_MQTT_MAX_PACKET_SIZE "
        "if messages that large are expected"
    )


def _bounded_client(mqtt: Any, where: str, limit: int) -> Any:
    """A paho client that checks a packet's declared length before reading its body: paho would
    allocate and buffer all of it. MQTT 3.1.1 (what rq speaks) has no Maximum Packet Size for the
    broker to honour, so the check is the client's."""
    if not callable(getattr(mqtt.Client, "_sock_recv", None)) or not hasattr(mqtt.Client, "_packet_read"):
        # the check hooks a private method: a paho that renamed it must not skip it silently
        raise TopicError(
            "this paho-mqtt has no Client._sock_recv: rq cannot bound its packets; use paho-mqtt 2.x"
        )

    class Bounded(mqtt.Client):
        rq_broke: ProtocolViolation | None = None

        def _sock_recv(self, bufsize: int) -> bytes:
            packet = self._in_packet
            if packet["have_remaining"] and packet["remaining_length"] > limit:
                if self.rq_broke is None:
                    self.rq_broke = too_large(where, packet["remaining_length"], limit)
                # paho ends the connection on an OSError here (MQTT_ERR_CONN_LOST)
                raise OSError(errno.EMSGSIZE, "packet too large")
            data: bytes = super()._sock_recv(bufsize)
            return data

    return Bounded


def _stop(client: Any) -> None:
    """Ends the client's network thread and closes its sockets: the connection and the socketpair
    loop_start() made. paho closes them only in Client.__del__, and a client is in reference cycles
    (its thread, callbacks), so each one closed kept 2 descriptors until the cyclic garbage collector
    ran: a long-running process with gc tuned down ran out. reinitialise() is paho's public way to
    close them (it then resets the client's state, which nothing uses any more)."""
    with contextlib.suppress(Exception):
        client.loop_stop()
    with contextlib.suppress(Exception):
        client.reinitialise()


def _client(ref: Any, timeout: float, max_packet_size: int = MAX_PACKET_SIZE) -> Any:
    import paho.mqtt.client as mqtt

    host, port = ref.host, ref.port
    where = hostport(host, port)
    access = mqtt_access(ref.user, ref.password, ref.tls)
    ctx = tls_context(access)
    bounded = _bounded_client(mqtt, where, max_packet_size)
    client = bounded(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311, clean_session=True)
    if access.user is not None:
        client.username_pw_set(access.user, access.password)
    if ctx is not None:
        client.tls_set_context(ctx)
    answered = threading.Event()
    result: list[Any] = []
    errors: list[str] = []  # paho reports why a socket failed only to its log

    def on_connect(_c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
        result.append(reason)
        answered.set()

    def on_disconnect(*_: Any) -> None:  # closed before CONNACK (paho would retry: we do not)
        answered.set()

    def on_log(_c: Any, _u: Any, level: int, text: str) -> None:
        # paho logs a reply that is not MQTT (a wrong port: HTTP, NATS's INFO line) only at DEBUG
        if level == mqtt.MQTT_LOG_ERR or text.startswith("Received malformed packet"):
            errors.append(text)

    client.on_connect, client.on_disconnect, client.on_log = on_connect, on_disconnect, on_log
    try:
        client.connect(host, port, keepalive=30)
    except ssl.SSLCertVerificationError as exc:
        raise AccessDenied(
            f"MQTT broker at {where}: its certificate was refused ({exc.verify_message}); "
            f"{tls_hint(exc, 'RQ_MQTT_CA')}",
            credentials=False,
            server="mqtt",
        ) from None
    except ssl.SSLError as exc:
        raise SourceUnreachable(f"TLS with the MQTT broker at {where} failed: {reason(exc)}") from None
    except OSError as exc:
        raise SourceUnreachable(f"cannot reach MQTT broker at {where}: {reason(exc)}") from None
    client.loop_start()
    if not answered.wait(timeout):
        _stop(client)
        raise SourceUnreachable(f"MQTT broker at {where} did not answer CONNECT in {timeout:.0f} s")
    client.on_disconnect = client.on_log = None  # on_log would run for every message from here on
    if client.rq_broke is not None:
        _stop(client)
        raise client.rq_broke
    if not result:
        _stop(client)
        raise _closed_before_connack(where, access, errors[0] if errors else "connection closed")
    if getattr(result[0], "is_failure", False):
        _stop(client)
        if str(result[0]).lower() in _REFUSED_AUTH:
            raise AccessDenied(
                f"MQTT broker at {where} refused rq {access.who()}: {result[0]}", server="mqtt"
            )
        raise SourceUnreachable(f"MQTT broker at {where} refused the connection: {result[0]}")
    return client


def _closed_before_connack(where: str, access: Access, why: str) -> TopicError:
    """A TLS broker that wants a client certificate closes the connection right after the handshake
    (TLS 1.3 sends its alert after the client thinks the handshake is done)."""
    if access.tls and any(a in why for a in ("CERTIFICATE_REQUIRED", "UNKNOWN_CA", "BAD_CERTIFICATE")):
        what = "refused rq's client certificate" if access.cert else "requires a client certificate"
        return AccessDenied(
            f"MQTT broker at {where} {what} ({why}): set RQ_MQTT_CERT and RQ_MQTT_KEY",
            credentials=False,
            server="mqtt",
        )
    if access.tls and access.cert is None:
        return AccessDenied(
            f"MQTT broker at {where} closed the TLS connection before answering CONNECT ({why}); "
            "if it requires a client certificate, set RQ_MQTT_CERT and RQ_MQTT_KEY",
            credentials=False,
            server="mqtt",
        )
    if why.startswith("Received malformed packet"):
        return SourceUnreachable(
            f"the server at {where} answered CONNECT with something that is not MQTT ({why[9:]})"
        )
    return SourceUnreachable(f"MQTT broker at {where} closed the connection before answering CONNECT: {why}")


def lost_why(reason: Any) -> str:
    """Why a connection that was up ended, in words: paho names a socket closed or reset under
    MQTT 3.1.1 (which has no DISCONNECT from the broker) "Unspecified error"."""
    text = str(reason)
    if text == "Unspecified error":
        return "the broker closed the connection (or it was reset)"
    if text == "Keep alive timeout":
        return "no answer to a keep-alive PING"
    return text


def check_filter(topic_filter: str) -> None:
    """What MQTT forbids in a filter that paho lets through: the broker would close the connection
    on it (MQTT 3.1.1 1.5.3, 4.7.3)."""
    if "\0" in topic_filter:
        raise SpecError(f"bad MQTT topic filter {topic_filter!r}: MQTT forbids the character U+0000")
    if len(topic_filter.encode("utf-8")) > 65535:
        raise SpecError("bad MQTT topic filter: longer than MQTT's 65535 bytes")


# The mark of a retained message (a value the broker kept and sent on subscribing, maybe long
# stale), as a header: MQTT 3.1.1 has none of its own, and a header reaches --json, templates,
# --where ($headers.retained) and a --record capture alike.
RETAINED: Headers = (("retained", b"true"),)


class MqttSource:
    kind = "mqtt"
    live_only = True
    monotonic_time = True

    def __init__(
        self,
        ref: Any,
        idle_timeout: float | None = None,
        connect_timeout: float = 5.0,
        qos: int = 1,
        retained: bool = True,
        max_packet_size: int = MAX_PACKET_SIZE,
    ):
        """retained=False drops the retained messages the broker sends on subscribing (stale
        values kept from before: mosquitto_sub -R); kept, they carry the RETAINED header."""
        self.url = ref.url
        self.filter: str = ref.subject
        self.idle_timeout = idle_timeout
        self.queue: queue.SimpleQueue[tuple[int, str, bytes, bool]] = queue.SimpleQueue()
        self.where = hostport(ref.host, ref.port)
        self.lost: list[str] = []  # why the broker connection dropped, once it has
        self.closing = False
        self.room = threading.Condition()
        self.held = 0  # bytes of what is queued (HOLD_BYTES)
        check_filter(self.filter)
        self.client = _client(ref, connect_timeout, max_packet_size)
        subscribed = threading.Event()
        granted: list[Any] = []

        def on_disconnect(_c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
            # paho would reconnect, but a clean session comes back without our subscription: the
            # tail would wait forever for messages the broker no longer sends us. Say so instead.
            if not self.closing:
                self.lost.append(lost_why(reason))
                subscribed.set()  # a broker closes the connection on a SUBSCRIBE it will not take
                if self.client.rq_broke is not None:
                    # paho would connect again and the broker send the same packet: stop here
                    threading.Thread(target=self.client.disconnect, daemon=True).start()

        self.client.on_disconnect = on_disconnect

        def on_message(_c: Any, _u: Any, msg: Any) -> None:
            # A broker sets RETAIN only on what it kept from before the subscription; a message
            # forwarded live arrives without it (MQTT 3.1.1 3.3.1.3, 5.0 without retain-as-published).
            if msg.retain and not retained:
                return
            size = len(msg.payload) + len(msg.topic) + _PER_MESSAGE
            with self.room:
                while self.held and self.held + size > HOLD_BYTES and not self.closing:
                    self.room.wait(0.1)  # close() sets closing: loop_stop() must not wait on us
                self.held += size
            self.queue.put((time.time_ns() // 1_000_000, msg.topic, msg.payload, bool(msg.retain)))

        def on_subscribe(_c: Any, _u: Any, _mid: Any, codes: Any, _props: Any) -> None:
            granted.extend(codes)
            subscribed.set()

        self.client.on_message = on_message
        self.client.on_subscribe = on_subscribe
        try:
            self.client.subscribe(self.filter, qos=qos)
        except ValueError as exc:
            self.close()
            raise SpecError(f"bad MQTT topic filter {self.filter!r}: {exc}") from None
        # Wait for SUBACK so that whatever is published after this returns is seen.
        # A connection lost after the SUBACK is read()'s to tell, once what came before is out.
        answered = subscribed.wait(connect_timeout)
        if not granted or any(getattr(c, "is_failure", False) for c in granted):
            self.close()
            if self.client.rq_broke is not None:
                raise self.client.rq_broke
            if self.lost and not granted:
                raise ConnectionLost(
                    f"MQTT broker at {self.where} closed the connection on the subscription to "
                    f"{self.filter!r}: {self.lost[0]}"
                )
            if not answered:
                raise SourceUnreachable(
                    f"MQTT broker at {self.where} did not answer the subscription to {self.filter!r} "
                    f"in {connect_timeout:.0f} s"
                )
            # SUBACK 0x80 (MQTT 3.1.1 has no other failure code): the broker will not let this
            # client read the filter, an authorization matter (exit 4), not an unreachable broker
            who = mqtt_access(ref.user, ref.password, ref.tls).who()
            raise AccessDenied(
                f"MQTT broker at {self.where} refused the subscription to {self.filter!r} "
                f"(SUBACK failure): rq, connected {who}, may not read it",
                credentials=False,
                server="mqtt",
            )

    def first_offset(self) -> int:
        return 0

    def end_offset(self) -> int:
        return 0

    def offset_for_time(self, ts_ms: int) -> int:
        raise Unsupported("MQTT keeps no history: there is nothing to seek in")

    def offset_before_end(self, n: int) -> int:
        return 0

    def read(
        self,
        start: int,
        stop: int | None,
        follow: bool,
        skip_corrupt: bool = False,
        on_skip: Callable[[int, int, str], None] | None = None,
        on_gap: Callable[[int, int], None] | None = None,
    ) -> Iterator[list[Record]]:
        n = 0
        idle_since = time.monotonic()
        while True:
            try:
                first = self.queue.get(timeout=0.05)
            except queue.Empty:
                if self.client.rq_broke is not None:
                    raise self.client.rq_broke from None
                if self.lost:  # only once what arrived before the loss is all out
                    raise ConnectionLost(
                        f"lost the connection to the MQTT broker at {self.where}: {self.lost[0]}"
                    ) from None
                if self.idle_timeout is not None and time.monotonic() - idle_since > self.idle_timeout:
                    return
                yield []  # nothing yet: the caller may stop (its reader gone, --to @t passed)
                continue
            items = [first]
            with contextlib.suppress(queue.Empty):
                while len(items) < _DRAIN:
                    items.append(self.queue.get_nowait())
            batch: list[Record] = []
            freed = 0
            for ts, topic, payload, stale in items:
                batch.append((n, ts, topic.encode("utf-8"), RETAINED if stale else NO_HEADERS, payload))
                freed += len(payload) + len(topic) + _PER_MESSAGE
                n += 1
            idle_since = time.monotonic()
            with self.room:
                self.held -= freed
                self.room.notify_all()
            yield batch
            if stop is not None and n >= stop:
                return

    def committed(self, group: str) -> int | None:
        raise Unsupported("MQTT topics have no offsets to commit (live only)")

    def commit(self, group: str, offset: int) -> None:
        raise Unsupported("MQTT topics have no offsets to commit (live only)")

    def groups(self) -> list[str]:
        return []

    def close(self) -> None:
        with self.room:
            self.closing = True
            self.room.notify_all()
        with contextlib.suppress(Exception):
            self.client.disconnect()
        _stop(self.client)


class PacketTooLarge(RecordTooLarge):
    """A record whose PUBLISH would be over the sink's `max_packet_size`, refused before any record
    of its batch went out. `index` is its place in the append's batch (0-based); `str()` names it
    so, `describe` with the caller's name for it (its place in the input, its offset)."""

    def __init__(self, index: int, size: int, limit: int):
        self.index, self.size, self.limit = index, size, limit
        super().__init__(self.describe(lambda i: f"record {i + 1} of the batch"))

    def describe(self, name: Callable[[int], str]) -> str:
        return (
            f"{name(self.index)} is an MQTT packet of {self.size} bytes (topic and value), more than rq "
            f"sends ({self.limit} bytes): raise --max-packet-size or RQ_MQTT_MAX_PACKET_SIZE if the "
            "broker takes packets that large"
        )


class AcknowledgedPartly(AppendedPartly):
    """An append whose connection was lost (or whose broker went silent) after the broker had
    acknowledged the batch's first `stored` records (maybe none): those are the broker's, in order,
    and `error` (a ConnectionLost) says what stopped the rest. MQTT has no offsets: `first` and
    `last` are None."""

    def __init__(self, url: str, stored: int, error: ConnectionLost):
        super().__init__(url, None, None, stored, error)  # MQTT messages have no offsets
        self.args = (
            f"{url}: the broker acknowledged the first {stored} record(s) of the batch, then: {error}",
        )


# The smallest packet the "over the broker's size limit" guess is offered for: no broker in use
# limits packets below a few hundred bytes (mosquitto, EMQX, HiveMQ: unlimited to 1 MiB by default;
# AWS IoT 128 KiB), while a lost connection with small publishes in flight is an outage.
_HINT_FLOOR = 1024


class MqttSink:
    """Publishes each record to the URL's topic (QoS 1); an append returns when all are acknowledged.

    A record whose PUBLISH would be over `max_packet_size` (its remaining length: topic, packet id
    and value; the bound `rq tail` takes packets up to) is refused before any record of its batch
    goes out (PacketTooLarge): MQTT 3.1.1 tells a client no limit, and a broker closes the
    connection on a packet over its own (mosquitto's max_packet_size), which was a 30 s wait for
    PUBACKs that never came. A connection closed while publishes await their PUBACK ends the append
    at once, saying so; that, or a broker silent for ACK_WAIT_S, raises AcknowledgedPartly with
    the count of the batch's records acknowledged before (the first ones, in order)."""

    ACK_WAIT_S = 30.0

    def __init__(
        self, ref: Any, connect_timeout: float = 5.0, max_packet_size: int = MAX_PACKET_SIZE, **_: Any
    ):
        if any(c in ref.subject for c in "+#"):
            raise SpecError(f"cannot publish to a topic filter {ref.subject!r}: name one topic")
        self.url = ref.url
        self.topic: str = ref.subject
        self.where = hostport(ref.host, ref.port)
        self.max_packet_size = max_packet_size
        self.client = _client(ref, connect_timeout, max_packet_size)
        self.gone: list[str] = []  # why the broker closed the connection, once it has
        self.closed = False  # close() was called (from another thread, while an append waits)
        self.largest_acked = 0  # the largest PUBLISH the broker acknowledged on this connection

        def on_disconnect(_c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
            self.gone.append(lost_why(reason))

        self.client.on_disconnect = on_disconnect

    def append(self, records: Sequence[Pending]) -> Appended:
        # remaining length of a QoS 1 PUBLISH: topic (2-byte length + UTF-8), packet id, payload
        head = 2 + len(self.topic.encode()) + 2
        if self.closed:
            raise TopicError(f"the MQTT sink for {self.url} is closed")
        sizes = [head + len(value) for _, _, _, value in records]
        for i, size in enumerate(sizes):
            if size > self.max_packet_size:
                raise PacketTooLarge(i, size, self.max_packet_size)
        # paho takes a publish while it is not connected (rc NO_CONN), and its info then raises
        # RuntimeError when asked: the wait below tells that as the lost connection it is
        infos = [self.client.publish(self.topic, value, qos=1) for _, _, _, value in records]
        deadline = time.monotonic() + self.ACK_WAIT_S
        for n, info in enumerate(infos):
            while True:
                # read before the PUBACK: paho handles every packet before the close that follows
                # it, so a publish seen unacknowledged after a loss seen here never was
                lost = bool(self.gone) or not self.client.is_connected()
                try:
                    if info.is_published():
                        break
                    failed = None
                except (RuntimeError, ValueError) as exc:  # paho: not connected, queue full
                    failed = reason(exc)
                # (read after the connection: close() sets it before it disconnects, so a
                # disconnect seen here that close() made is always seen as close()'s)
                if self.closed:
                    # not the broker: blaming a packet-size limit sent the caller the wrong way
                    raise TopicError(
                        f"the MQTT sink for {self.url} was closed (close() called) with "
                        f"{len(infos) - n} publish(es) to {self.topic} unacknowledged"
                    )
                if lost or failed is not None:
                    raise AcknowledgedPartly(self.url, n, self._lost(len(infos) - n, max(sizes[n:]), failed))
                if time.monotonic() > deadline:
                    raise AcknowledgedPartly(
                        self.url,
                        n,
                        ConnectionLost(
                            f"the MQTT broker at {self.where} did not acknowledge a publish to "
                            f"{self.topic} within {self.ACK_WAIT_S:g} s: {len(infos) - n} publish(es) "
                            "unacknowledged; the broker is stalled or the network to it is down"
                        ),
                    )
                with contextlib.suppress(RuntimeError, ValueError):  # asked again above
                    info.wait_for_publish(timeout=0.05)
            self.largest_acked = max(self.largest_acked, sizes[n])
        # A published message gets no offset (MQTT has none): stored, but nowhere to name.
        return Appended(None, None, len(records))

    def _lost(self, unacked: int, largest: int, failed: str | None) -> ConnectionLost:
        """The lost connection, in words; the broker's packet size limit is named only where it may
        be why: the largest publish unacknowledged is not small and larger than any the broker took
        on this connection (MQTT 3.1.1, which rq speaks, has no Maximum Packet Size in its CONNACK)."""
        why = self.gone[0] if self.gone else (failed or "the connection was lost")
        line = (
            f"lost the connection to the MQTT broker at {self.where} ({why}) with {unacked} "
            f"publish(es) to {self.topic} unacknowledged"
        )
        if largest > max(_HINT_FLOOR, self.largest_acked):
            line += (
                f", the largest {largest} bytes: a broker closes it on a packet over its size limit "
                "(its max_packet_size; give rq that limit with --max-packet-size to have such "
                "records refused before they are sent)"
            )
        return ConnectionLost(line)

    def close(self) -> None:
        self.closed = True  # first: an append waiting for PUBACKs tells the caller why it ended
        with contextlib.suppress(Exception):
            self.client.disconnect()
        _stop(self.client)
