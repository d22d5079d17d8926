"""TOPIC strings -> sources and sinks: a name under the topics dir, a path, nats:// (tls://), mqtt://
(mqtts://)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from topics.embedded.log import TopicConfig, check_topic_name
from topics.errors import SpecError, TopicNotFound
from topics.sources.access import hostport, redact_url
from topics.sources.base import Sink, Source
from topics.sources.subjects import check_publish_subject, check_subject


@dataclass(frozen=True)
class TopicRef:
    kind: str  # embedded | jetstream | mqtt
    path: Path | None = None
    host: str = ""
    port: int = 0
    stream: str = ""  # JetStream stream
    subject: str = ""  # JetStream subject filter or MQTT topic filter
    tls: bool = False  # asked for by the scheme: tls:// (NATS) or mqtts://
    # credentials given in the URL: never part of the topic's identity, its repr or `url`
    user: str | None = field(default=None, compare=False, repr=False)
    password: str | None = field(default=None, compare=False, repr=False)

    @property
    def url(self) -> str:
        """The topic's URL as rq shows and saves it: without credentials."""
        if self.kind == "embedded":
            return str(self.path)
        if self.kind == "jetstream":
            scheme = "tls" if self.tls else "nats"
        else:
            scheme = "mqtts" if self.tls else "mqtt"
        tail = f"/{self.stream}" if self.kind == "jetstream" else ""
        if self.subject:
            tail += f"/{self.subject}"
        return f"{scheme}://{hostport(self.host, self.port)}{tail}"


_STREAM = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_SCHEMES = ("nats://", "tls://", "mqtt://", "mqtts://")
_PORTS = {"nats": 4222, "tls": 4222, "mqtt": 1883, "mqtts": 8883}


def parse_topic(text: str, topics_dir: Path) -> TopicRef:
    scheme, sep, rest = text.partition("://")
    if sep and f"{scheme.lower()}://" in _SCHEMES:
        # schemes are case-insensitive (RFC 3986 3.1): NATS:// is nats://
        return _parse_url(f"{scheme.lower()}://{rest}")
    if "://" in text:
        raise SpecError(
            f"unknown topic scheme in {redact_url(text)!r}: use a name, a path, nats:// (tls://) or mqtt:// (mqtts://)"
        )
    # Absolute: a path kept in a saved spec (or compared with another) must not depend on the
    # working directory, nor read back as a topic name ("./events" is not "events").
    if os.sep in text or text.startswith((".", "~")):
        return TopicRef("embedded", Path(text).expanduser().absolute())
    return TopicRef("embedded", (topics_dir / check_topic_name(text)).expanduser().absolute())


# A bare host name (one label, no port) followed by a path whose '@' comes before a host[:port]:
# `mqtt://tok/en@broker/t` is user info `tok/en` cut at its '/', not host `tok` and topic `en@broker/t`.
_BARE_HOST = re.compile(r"^[A-Za-z0-9-]+$")
_AT_HOST = re.compile(r"@[A-Za-z0-9.-]+(:\d+)?(/|$)")


def _unencoded_user_info(text: str) -> SpecError:
    mqtt = text.startswith(("mqtt://", "mqtts://"))
    env = "RQ_MQTT_USERNAME/RQ_MQTT_PASSWORD" if mqtt else "NATS_USER/NATS_PASSWORD"
    topic_at = " (an '@' in an MQTT topic is written %40)" if mqtt else ""
    return SpecError(
        f"bad URL {redact_url(text)!r}: a '/', '?' or '#' in its user:password@ part must be "
        f"percent-encoded (%2F, %3F, %23), or set {env} instead{topic_at}"
    )


def _parse_url(text: str) -> TopicRef:
    try:
        netloc, path = urlsplit(text)[1:3]
    except ValueError:
        netloc, path = "", ""
    if (
        text.startswith(("mqtt://", "mqtts://"))
        and _BARE_HOST.match(netloc)
        and netloc.lower() != "localhost"
        and _AT_HOST.search(path)
    ):
        # MQTT topics may hold '@', so this parses; but a one-label host is the usual shape of a
        # token or user name cut at its '/': refused rather than connect to a host named after it.
        raise _unencoded_user_info(text)
    try:
        return _split_url(text)
    except SpecError:
        # An unencoded '/', '?' or '#' in a password or token ends the host part early, so the
        # rest of the user info reads as a port, a stream or a path, and the error names the wrong
        # thing: an '@' past the host part says what went wrong (without the secret).
        if "@" in text.partition("://")[2] and "@" not in netloc and (netloc or path):
            raise _unencoded_user_info(text) from None
        raise


def _unescape(text: str, shown: str) -> str:
    """%-escapes decoded as UTF-8; one that is not UTF-8 is refused (it became U+FFFD silently)."""
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise SpecError(f"bad URL {shown!r}: a %-escape that is not UTF-8") from None


def _split_url(text: str) -> TopicRef:
    shown = redact_url(text)
    if any(c in text for c in "\t\r\n"):  # urlsplit would silently drop them
        raise SpecError(f"bad URL {shown!r}: it contains a tab or a line break")
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # e.g. an unclosed '[' of an IPv6 address
        raise SpecError(f"bad URL {shown!r}: {exc}") from None
    scheme = parts.scheme
    try:
        port = parts.port  # None where the URL names none, or only a ':' (RFC 3986 3.2.3)
    except ValueError:  # not a number, or past 65535
        port = 0
    if port == 0:
        # a port of 0 was taken for "none" and the scheme's own used in its place
        raise SpecError(
            f"bad port in {shown!r}: use a number from 1 to 65535, or leave it out ({_PORTS[scheme]})"
        )
    port = port or _PORTS[scheme]
    host = parts.hostname or "127.0.0.1"
    # the path is all the text after the host part, as typed: urlsplit would take a '?' for a
    # query and a '#' (MQTT's wildcard) for a fragment and drop them, and an MQTT filter may start
    # with an empty level (//a/b is the filter /a/b)
    raw = text.partition("://")[2][len(parts.netloc) :]
    if raw.startswith("?"):
        raise SpecError(f"bad URL {shown!r}: a '?' right after the host (the topic goes after a '/')")
    path = raw[1:] if raw.startswith("/") else raw  # (mqtt://h# is the filter #, as before)
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    tls = scheme in ("tls", "mqtts")
    if scheme in ("nats", "tls"):
        stream, _, subject = path.partition("/")
        if not stream or not _STREAM.match(stream):
            raise SpecError(f"bad JetStream URL {shown!r}: use nats://HOST:PORT/STREAM[/SUBJECT]")
        subject = _unescape(subject, shown)
        check_subject(subject, shown)
        return TopicRef(
            "jetstream",
            host=host,
            port=port,
            stream=stream,
            subject=subject,
            tls=tls,
            user=user,
            password=password,
        )
    subject = _unescape(path, shown)
    if not subject:
        raise SpecError(f"bad MQTT URL {shown!r}: use mqtt://HOST:PORT/TOPIC-FILTER (e.g. sensors/#)")
    return TopicRef("mqtt", host=host, port=port, subject=subject, tls=tls, user=user, password=password)


def open_source(ref: TopicRef, **options: Any) -> Source:
    if ref.kind == "embedded":
        from topics.sources.embedded import EmbeddedSource

        assert ref.path is not None
        if not ref.path.is_dir():
            raise TopicNotFound(f"topic {ref.path} does not exist")
        return EmbeddedSource(ref.path, options.get("idle_timeout"))
    if ref.kind == "jetstream":
        from topics.sources.jetstream import JetStreamSource

        return JetStreamSource(ref, **options)
    from topics.sources.mqtt import MqttSource

    return MqttSource(ref, **options)


def check_writable(ref: TopicRef) -> None:
    """What can be told about a topic to write to before connecting: one NATS subject or MQTT
    topic, not a filter (a NATS publish to `a.*` would be stored under that literal name)."""
    if ref.kind == "jetstream":
        check_publish_subject(ref.subject or ref.stream, ref.url)
    elif ref.kind == "mqtt" and any(c in ref.subject for c in "+#"):
        raise SpecError(f"cannot publish to a topic filter {ref.subject!r}: name one topic")


def open_sink(ref: TopicRef, config: TopicConfig | None = None, **options: Any) -> Sink:
    check_writable(ref)
    if ref.kind == "embedded":
        from topics.sources.embedded import EmbeddedSink

        assert ref.path is not None
        return EmbeddedSink(ref.path, config)
    if ref.kind == "jetstream":
        from topics.sources.jetstream import JetStreamSink

        return JetStreamSink(ref, **options)
    from topics.sources.mqtt import MqttSink

    return MqttSink(ref, **options)
