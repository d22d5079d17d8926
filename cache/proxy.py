"""The HTTP proxy boto3 would use for the store, for the requests rq makes outside the CRT.

The CRT client (listings, HEADs, objects under 64 MiB) and boto3 take HTTP_PROXY / HTTPS_PROXY /
NO_PROXY from the environment; big objects' pieces (cache.ranged) and the TLS probe (cache.tls)
open their own sockets, and went straight to the endpoint, which behind a corporate proxy often
does not even resolve. They now ask here, and follow botocore's choice exactly:
`botocore.utils.get_environ_proxies(endpoint_url)`, i.e. urllib's `proxy_bypass` on the endpoint's
netloc (NO_PROXY: `*` alone, or comma-separated host names matched whole or as a dot-bounded
suffix, a leading dot ignored, `host:port` entries; no IP ranges), else urllib's `getproxies()`
(`*_proxy` variables, the lowercase form first) picked by the endpoint's scheme, a URL without a
scheme taken as http://, user:password@ sent as `Proxy-Authorization: Basic` (percent-escapes
decoded, as botocore does).
"""

from __future__ import annotations

import base64
import os
import re
import socket
import sys
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from cache.errors import AuthError, BadSourceError, UnreachableError

PROXY_HINT = "check HTTP_PROXY / HTTPS_PROXY and NO_PROXY; re-run the same command to continue"


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    text: str  # scheme://host:port, without the credentials: what messages show
    variable: str  # HTTP_PROXY or HTTPS_PROXY, for messages
    authorization: str | None  # the Proxy-Authorization value, from user:password@ in its URL

    def headers(self) -> dict[str, str]:
        return {"Proxy-Authorization": self.authorization} if self.authorization else {}

    def unreachable(self, endpoint: str, exc: BaseException | str) -> UnreachableError:
        """A connection to the proxy that failed: the proxy's fault, not the endpoint's. `exc`: the
        error, or the CRT's name for it."""
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        error = UnreachableError(
            f"cannot reach the proxy {self.text} ({self.variable}) on the way to {endpoint} ({why})"
        )
        error.hint = PROXY_HINT  # type: ignore[attr-defined]
        return error

    def refused(self, endpoint: str, status: int, reason: str) -> AuthError | UnreachableError:
        """The proxy's own refusal (a CONNECT answered with other than 200, or a 407)."""
        what = f"the proxy {self.text} ({self.variable}) refused the way to {endpoint}: {status} {reason}".rstrip()
        if status == 407:
            auth = AuthError(what)
            auth.hint = (  # type: ignore[attr-defined]
                f"put the proxy's user:password@ in {self.variable}"
                if self.authorization is None
                else f"check the user:password@ in {self.variable}"
            )
            return auth
        error = UnreachableError(what)
        error.hint = PROXY_HINT  # type: ignore[attr-defined]
        return error


def _environment_names_a_proxy() -> bool:
    """Whether urllib's getproxies() could name any proxy here. On Linux it reads only the
    environment's <scheme>_proxy variables, so without one the answer is None with no import of
    urllib.request (~17 ms at start-up, and files to open: under an exhausted open-files limit a
    lazy import in an error path failed, and the error said was that ImportError)."""
    if sys.platform in ("darwin", "win32"):
        return True  # (system proxy settings: urllib asks the OS)
    return any(v and k.lower().endswith("_proxy") and k.lower() != "no_proxy" for k, v in os.environ.items())


def proxy_for(scheme: str, netloc: str) -> Proxy | None:
    """The proxy botocore would send requests to an endpoint `scheme://netloc` through, or None.
    A proxy URL rq cannot use is a BadSourceError (exit 2) naming its variable."""
    if not _environment_names_a_proxy():
        return None
    from urllib.request import getproxies, proxy_bypass

    try:
        if proxy_bypass(netloc):
            return None
    except (TypeError, socket.gaierror):  # (as botocore.utils.should_bypass_proxies)
        pass
    url = getproxies().get(scheme)
    if not url:
        return None
    variable = f"{scheme.upper()}_PROXY"
    given, sep, _ = url.partition("://")
    if sep and given.lower() not in ("http", "https"):
        raise BadSourceError(f"{variable} names a {given}:// proxy: rq speaks to http:// proxies only")
    # botocore's ProxyConfiguration._fix_proxy_url: a URL without a scheme is an http:// one
    if not (url.startswith("http:") or url.startswith("https:")):
        url = ("http:" if url.startswith("//") else "http://") + url
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadSourceError(f"cannot use the proxy URL in {variable}: {exc}") from None
    if not parts.hostname:
        raise BadSourceError(f"cannot use the proxy URL in {variable}: no host name in it (http://HOST:PORT)")
    if parts.scheme == "https":
        # urllib3 speaks TLS to such a proxy, then TLS again inside the tunnel: http.client cannot
        raise BadSourceError(
            f"{variable} names a proxy reached over TLS ({parts.scheme}://{parts.hostname}): rq fetches objects "
            "of 64 MiB and more through http:// proxies only; give the proxy's http:// URL"
        )
    authorization = None
    if parts.username is not None and parts.password is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password)}"
        authorization = "Basic " + base64.b64encode(pair.encode("latin-1", "replace")).decode()
    host = parts.hostname
    port = port or 80
    shown = f"[{host}]" if ":" in host else host
    return Proxy(host, port, f"http://{shown}:{port}", variable, authorization)


_TUNNEL_FAILED = re.compile(r"Tunnel connection failed: (\d{3})\s*(.*)")


def tunnel_refusal(exc: BaseException) -> tuple[int, str] | None:
    """(status, reason) of a CONNECT the proxy refused, from http.client's OSError, or None."""
    if type(exc) is not OSError:
        return None
    found = _TUNNEL_FAILED.match(str(exc))
    return (int(found.group(1)), found.group(2).strip()) if found else None
