"""Who rq is and what it trusts on a topic server: credentials and TLS for NATS and MQTT.

Credentials come from the URL (`nats://user:pass@host`, `nats://TOKEN@host`, `mqtt://user:pass@host`)
or, better, from the environment, where `ps` does not show them. NATS reads the variables natscli
reads (NATS_USER, "user or token"; NATS_PASSWORD; NATS_CA, NATS_CERT, NATS_KEY), so a shell set up
for the `nats` CLI works unchanged. MQTT has no common convention; rq reads RQ_MQTT_USERNAME,
RQ_MQTT_PASSWORD, RQ_MQTT_CA, RQ_MQTT_CERT and RQ_MQTT_KEY. What the URL says wins.

TLS is asked for by the scheme (`tls://` for NATS, as natscli and nats-py spell it; `mqtts://`) or
by naming a CA or a client certificate. Once asked for, it is never given up: rq would rather fail
than send a password in the clear.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from topics.errors import SpecError

NATS_ENV = ("NATS_USER", "NATS_PASSWORD", "NATS_CA", "NATS_CERT", "NATS_KEY")
MQTT_ENV = ("RQ_MQTT_USERNAME", "RQ_MQTT_PASSWORD", "RQ_MQTT_CA", "RQ_MQTT_CERT", "RQ_MQTT_KEY")


@dataclass(frozen=True)
class Access:
    # a NATS token travels as the user: neither is shown in a repr
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)  # NATS: a user without a password is a token
    tls: bool = False
    ca: str | None = None  # PEM file of the CAs to trust instead of the system's
    cert: str | None = None  # client certificate and key (mutual TLS)
    key: str | None = None
    names: tuple[str, ...] = NATS_ENV  # where each came from, for messages: user, password, ca, cert, key

    def who(self) -> str:
        """How rq presented itself, for an error message; never the secret itself."""
        if self.user is None:
            return "without credentials"
        if self.password is None and self.names is NATS_ENV:
            return "with a token"
        return f"as user {self.user!r}"


def _access(
    url_user: str | None, url_password: str | None, tls: bool, env: Mapping[str, str], names: tuple[str, ...]
) -> Access:
    user_var, password_var, ca_var, cert_var, key_var = names
    user: str | None
    password: str | None
    if url_user is not None:
        user, password = url_user, url_password
    else:
        user, password = env.get(user_var) or None, env.get(password_var) or None
        if user is None and password is not None:
            raise SpecError(f"{password_var} is set but {user_var} is not: set both")
    ca, cert, key = (env.get(v) or None for v in (ca_var, cert_var, key_var))
    if (cert is None) != (key is None):
        raise SpecError(f"a client certificate needs both {cert_var} and {key_var}")
    return Access(user, password, tls or any((ca, cert)), ca, cert, key, names)


def nats_access(
    url_user: str | None, url_password: str | None, tls: bool, env: Mapping[str, str] | None = None
) -> Access:
    return _access(url_user, url_password, tls, os.environ if env is None else env, NATS_ENV)


def mqtt_access(
    url_user: str | None, url_password: str | None, tls: bool, env: Mapping[str, str] | None = None
) -> Access:
    return _access(url_user, url_password, tls, os.environ if env is None else env, MQTT_ENV)


def tls_context(access: Access) -> ssl.SSLContext | None:
    """The client context for `access`, or None where it asks for no TLS. The system's CAs unless a
    CA file is named; host names are checked (a certificate for another name is refused)."""
    if not access.tls:
        return None
    _, _, ca_var, cert_var, _ = access.names
    try:
        ctx = ssl.create_default_context(cafile=access.ca)
    except (OSError, ssl.SSLError) as exc:
        raise SpecError(f"cannot use {ca_var}={access.ca}: {reason(exc)}") from None
    if access.cert is not None:
        try:
            ctx.load_cert_chain(access.cert, access.key)
        except (OSError, ssl.SSLError) as exc:
            raise SpecError(
                f"cannot use the client certificate {cert_var}={access.cert}: {reason(exc)}"
            ) from None
    return ctx


def reason(exc: BaseException) -> str:
    """Why, in words, for an error line: never empty (asyncio's and socket's timeouts, and some
    library errors, have an empty str)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).strip() or type(exc).__name__


def tls_hint(exc: ssl.SSLError, ca_var: str) -> str:
    """What to do about a refused server certificate, as the cache's S3 TLS errors say it."""
    code = getattr(exc, "verify_code", None)
    if code in (62, 64):
        return "connect by the host name the server's certificate was issued for"
    if code in (2, 18, 19, 20, 21):
        return f"set {ca_var} to the CA bundle that signed the server's certificate"
    return "check the server's certificate (expired or not valid for this use?)"


def redact_url(text: str) -> str:
    """A URL as it may be shown: user info (a password or token) cut out. Cut through the last '@',
    wherever it is: a password may hold '/', '?' or '#' unencoded, which end the host part for
    urlsplit, so where the user info ends cannot be told for sure; showing too little is the safe side."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    return f"{scheme}://{rest.rpartition('@')[2]}"


def hostport(host: str, port: int) -> str:
    """HOST:PORT as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
