"""S3 through the AWS Common Runtime (awscrt): listing, HEAD and whole-object GETs on one pooled C client.

Why awscrt and not boto3 for data: botocore spends milliseconds of Python CPU per request, and on a
2-core box that, not the network, bounds small-object throughput (see docs/cache.md for numbers).
The CRT does HTTP, SigV4 signing and retries (STANDARD mode: exponential backoff, full jitter) in C
threads; the preloader's own AIMD window backs concurrency off when the store throttles. Big objects'
ranged pieces go through cache.ranged, signed by this client's signing config. Credentials and
endpoint still come from boto3's standard chain: the environment first (exactly as botocore reads
it), else botocore itself resolves profile/SSO/IMDS/… and hands us a static snapshot (refreshable
credentials are re-read per client).
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import queue
import re
import threading
import urllib.parse
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cache.errors import (
    AuthError,
    BadSourceError,
    CacheError,
    ChangedError,
    FileSystemFullError,
    MisbehavingStoreError,
    NotFoundError,
    OriginError,
    UnreachableError,
)
from cache.proxy import Proxy, proxy_for
from cache.tls import TlsCheck, crt_tls_options
from cache.watchdog import SLOWEST_BYTES_PER_S, Ticket, Watchdog

if TYPE_CHECKING:
    from cache.ranged import RangedGets

PART_SIZE = 8 << 20


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None = None
    profile: str | None = None
    region: str | None = None
    # retries of a request after its first attempt; None: max_attempts - 1 where AWS_MAX_ATTEMPTS
    # or the profile's max_attempts says, else DEFAULT_RETRIES (S3(…).settings holds the number)
    max_retries: int | None = None


DEFAULT_RETRIES = 6


@dataclass(frozen=True)
class ResolvedS3Settings(S3Settings):
    """An S3 client's settings with the number of retries decided (S3(…).settings)."""

    max_retries: int = DEFAULT_RETRIES


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None
    region: str
    endpoint_url: str | None
    ca_bundle: str | None = None  # AWS_CA_BUNDLE, the profile's ca_bundle, REQUESTS_CA_BUNDLE
    # credentials that expire (AssumeRole, IRSA's web identity, SSO, an instance or container role,
    # credential_process): botocore's own object, asked again for every request it signs
    refreshable: Any = field(default=None, compare=False, repr=False)
    # where requests go, as a boto3 S3 client would send them (AWS_USE_FIPS_ENDPOINT,
    # AWS_USE_DUALSTACK_ENDPOINT and the profile's use_fips_endpoint, use_dualstack_endpoint,
    # s3 = use_accelerate_endpoint / addressing_style; none of the first three with an endpoint URL)
    fips: bool = False
    dualstack: bool = False
    accelerate: bool = False
    addressing_style: str = "auto"  # auto | virtual | path
    max_attempts: int | None = None  # AWS_MAX_ATTEMPTS / the profile's max_attempts (the first included)
    legacy_global: bool = False  # region aws-global: the global host s3.amazonaws.com (us-east-1 signed)


def resolve_credentials(settings: S3Settings) -> Credentials:
    """boto3's chain, with botocore's rules. `settings.profile` is an explicit choice (--profile,
    boto3.Session(profile_name=…)): it disables the keys in the environment, as botocore does. A
    profile named by AWS_PROFILE / AWS_DEFAULT_PROFILE does not: keys in the environment win, and
    the profile still gives region, endpoint_url (or its `services` section) and ca_bundle.
    Keys in the environment: only botocore's config parser is imported (~13 ms), and only when a
    config or credentials file exists; else botocore's session resolves profile/SSO/IMDS/…"""
    env = os.environ
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if key and secret and not settings.profile:
        full, scoped = _shared_config(env)
        where = _configured(settings, env, full, scoped)
        return Credentials(str(key), str(secret), env.get("AWS_SESSION_TOKEN"), **where)
    import botocore.credentials
    import botocore.exceptions
    import botocore.session

    try:
        session = botocore.session.Session(profile=settings.profile)
        scoped = session.get_scoped_config()
        where = _configured(settings, env, session.full_config, scoped)
        creds = session.get_credentials()
        if creds is None:
            raise AuthError(
                "no AWS credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
            )
        frozen = creds.get_frozen_credentials()
    except CacheError:  # rq's own answers (a bad endpoint URL is a BadSourceError, also a ValueError)
        raise
    except botocore.exceptions.ProfileNotFound as exc:
        raise AuthError(f"AWS profile not found: {exc}") from None
    except botocore.exceptions.BotoCoreError as exc:
        raise AuthError(f"could not load AWS credentials: {exc}") from None
    except botocore.exceptions.ClientError as exc:
        # the service that hands out the credentials refused: STS AssumeRole (AccessDenied), STS
        # AssumeRoleWithWebIdentity (InvalidIdentityToken), SSO GetRoleCredentials (Unauthorized…)
        raise AuthError(_refused_credentials(exc, settings, env)) from None
    except RuntimeError as exc:  # botocore: "…refreshed credentials are still expired."
        raise AuthError(f"the AWS credentials are expired (credential_process, SSO or role): {exc}") from None
    except ValueError as exc:  # a credential_process that printed no JSON (JSONDecodeError), bad dates
        raise AuthError(f"credential_process output invalid (expected its JSON credentials): {exc}") from None
    # (a frozen copy only of what never expires: a training job outlives a 1-12 h role session,
    # and every miss and revalidation after its expiry failed with AuthError)
    expiring = creds if isinstance(creds, botocore.credentials.RefreshableCredentials) else None
    return Credentials(
        str(frozen.access_key), str(frozen.secret_key), frozen.token, **where, refreshable=expiring
    )


def _refused_credentials(exc: Any, settings: S3Settings, env: Any) -> str:
    """One line for a credential service's refusal (a botocore ClientError): the profile, the
    role it assumes where it names one, and the service's code and message."""
    error = getattr(exc, "response", {}).get("Error", {})
    code, message = str(error.get("Code") or "refused"), str(error.get("Message") or "").strip()
    name = settings.profile or env.get("AWS_DEFAULT_PROFILE") or env.get("AWS_PROFILE") or "default"
    role = ""
    try:
        import botocore.session

        role = str(botocore.session.Session(profile=name).get_scoped_config().get("role_arn") or "")
    except Exception:
        pass
    operation = getattr(exc, "operation_name", "") or "the credential request"
    said = f"{code}: {message}" if message else code
    return (
        f"AWS profile {name!r}{f' (role {role})' if role else ''}: {operation} was refused ({said}); "
        "check that the source credentials may assume the role, or log in again (aws sso login)"
    )


def _shared_config(env: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """~/.aws/config and ~/.aws/credentials as botocore's session reads them (its own parser; the
    credentials file's profiles merged in) and the active profile's part. Nothing is imported and
    nothing read where neither file exists."""
    config_file = os.path.expanduser(env.get("AWS_CONFIG_FILE") or "~/.aws/config")
    credentials_file = os.path.expanduser(env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials")
    named = env.get("AWS_DEFAULT_PROFILE") or env.get("AWS_PROFILE")  # botocore's order
    name = named or "default"
    # a profile named in the environment must exist, `default` too (botocore's get_scoped_config)
    missing = f"AWS profile not found: The config profile ({name}) could not be found"
    if not os.path.isfile(config_file) and not os.path.isfile(credentials_file):
        if named:
            raise AuthError(missing)
        return {}, {}
    import botocore.configloader
    import botocore.exceptions

    try:
        full = botocore.configloader.load_config(config_file) if os.path.isfile(config_file) else {}
        full.setdefault("profiles", {})
        if os.path.isfile(credentials_file):
            for section, values in botocore.configloader.raw_config_parse(credentials_file).items():
                full["profiles"].setdefault(section, {}).update(values)
    except botocore.exceptions.BotoCoreError as exc:
        raise AuthError(f"could not load AWS config: {exc}") from None
    if named and name not in full["profiles"]:
        raise AuthError(missing)
    return full, dict(full["profiles"].get(name, {}))


def _configured(
    settings: S3Settings, env: Any, full: dict[str, Any], scoped: dict[str, Any]
) -> dict[str, Any]:
    """Region, endpoint URL and CA bundle as a boto3 S3 client resolves them (explicit settings,
    then the environment, then the active profile). The endpoint in botocore's order:
    AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's `services` section's s3 endpoint_url, the
    profile's endpoint_url; none of them under AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true (or the
    profile's ignore_configured_endpoint_urls). A URL with user info is refused (BadSourceError).
    Also FIPS, dual-stack, S3 Accelerate, the addressing style and max_attempts (_routing)."""
    region = settings.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or scoped.get("region")
    ignore = env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
    if ignore is None:
        ignore = scoped.get("ignore_configured_endpoint_urls")
    endpoint = settings.endpoint_url
    if not endpoint and not _true(ignore):
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        if not endpoint and scoped.get("services"):
            section = full.get("services", {}).get(scoped["services"])
            if not section:
                raise AuthError(
                    f'could not load AWS config: the profile names the services section "{scoped["services"]}", '
                    "which does not exist"
                )
            s3 = section.get("s3")
            endpoint = s3.get("endpoint_url") if isinstance(s3, dict) else None
        endpoint = endpoint or scoped.get("endpoint_url") or _profile_endpoint(scoped)
    bundle = env.get("AWS_CA_BUNDLE") or scoped.get("ca_bundle") or env.get("REQUESTS_CA_BUNDLE")
    endpoint = str(endpoint) if endpoint else None
    if endpoint:
        check_endpoint_url(endpoint)
    region = str(region or "us-east-1")
    if not _REGION.fullmatch(region):  # (botocore's validate_region_name)
        raise BadSourceError(f"AWS region {region!r} is not a valid region name (e.g. us-east-1)")
    # botocore's pseudo-regions: fips-REGION / REGION-fips are REGION with FIPS endpoints, and
    # aws-global is us-east-1 signed, at the global host s3.amazonaws.com (rq built
    # s3.fips-us-gov-west-1.amazonaws.com and s3.aws-global.amazonaws.com, and signed for them: dr6)
    fips = region.startswith("fips-") or region.endswith("-fips")
    if fips:
        region = region.removeprefix("fips-").removesuffix("-fips")
    legacy_global = region == "aws-global"
    if legacy_global:
        region = "us-east-1"
    routing = _routing(env, scoped, region, endpoint, fips)
    return {
        "region": region,
        "endpoint_url": endpoint,
        "ca_bundle": str(bundle) if bundle else None,
        **routing,
        **({"legacy_global": True} if legacy_global and "fips" in routing else {}),
    }


_REGION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?")


def _setting(env: Any, variable: str | None, scoped: dict[str, Any], name: str) -> tuple[Any, str]:
    """A setting as botocore's config chain reads it: the environment variable when it is set
    (even empty), else the profile's key; and where it came from, for messages."""
    if variable and variable in env:
        return env[variable], variable
    if "." in name:
        section, _, key = name.partition(".")
        part = scoped.get(section)
        return (part.get(key) if isinstance(part, dict) else None), f"the profile's {section} = {key}"
    return scoped.get(name), f"the profile's {name}"


def _routing(
    env: Any, scoped: dict[str, Any], region: str, endpoint: str | None, fips_region: bool = False
) -> dict[str, Any]:
    """FIPS, dual-stack, S3 Accelerate, addressing style and max_attempts with botocore's sources and
    precedence; combinations botocore refuses are refused (BadSourceError), none silently dropped.
    `fips_region`: the region was named fips-REGION or REGION-fips."""
    fips = fips_region or _true(_setting(env, "AWS_USE_FIPS_ENDPOINT", scoped, "use_fips_endpoint")[0])
    # (botocore: the profile's s3 = use_dualstack_endpoint = true first, then the general setting)
    dualstack = _true(_setting(env, None, scoped, "s3.use_dualstack_endpoint")[0]) or _true(
        _setting(env, "AWS_USE_DUALSTACK_ENDPOINT", scoped, "use_dualstack_endpoint")[0]
    )
    accelerate = _true(_setting(env, None, scoped, "s3.use_accelerate_endpoint")[0])
    style, _ = _setting(env, None, scoped, "s3.addressing_style")
    style = str(style or "auto")
    if style not in ("auto", "virtual", "path"):
        raise BadSourceError(
            f"S3 addressing style {style!r} (the profile's s3 = addressing_style) is not one of auto, virtual, path"
        )
    attempts, source = _setting(env, "AWS_MAX_ATTEMPTS", scoped, "max_attempts")
    max_attempts = None
    if attempts is not None:
        try:
            max_attempts = int(str(attempts).strip())
        except ValueError:
            max_attempts = 0
        if max_attempts < 1:
            raise BadSourceError(
                f"max_attempts must be a whole number from 1 up (from {source}), got {attempts!r}"
            )
    mode, source = _setting(env, "AWS_RETRY_MODE", scoped, "retry_mode")
    if mode is not None and str(mode) not in ("legacy", "standard", "adaptive"):
        raise BadSourceError(f"retry_mode must be legacy, standard or adaptive (from {source}), got {mode!r}")
    if endpoint:
        # an endpoint URL beats FIPS and dual-stack (botocore sets neither); Accelerate it refuses
        if accelerate and not _is_accelerate_url(endpoint):
            raise BadSourceError(
                f"S3 Accelerate (the profile's s3 = use_accelerate_endpoint) cannot be used with an endpoint URL "
                f"({redact_url(endpoint)})"
            )
        return {"addressing_style": style, "max_attempts": max_attempts}
    partition = _partition(region)
    if accelerate and fips:
        raise BadSourceError("S3 Accelerate cannot be used with FIPS endpoints (use_fips_endpoint)")
    if fips and partition == "aws-cn":
        raise BadSourceError(f"FIPS endpoints (use_fips_endpoint) are not available in region {region}")
    if accelerate and partition == "aws-cn":
        raise BadSourceError(f"S3 Accelerate (use_accelerate_endpoint) cannot be used in region {region}")
    return {
        "fips": fips,
        "dualstack": dualstack,
        "accelerate": accelerate,
        "addressing_style": style,
        "max_attempts": max_attempts,
    }


_PARTITIONS: list[tuple[str, str, re.Pattern[str], frozenset[str]]] = []


def _partition(region: str) -> str:
    """The AWS partition of `region` as botocore's endpoint rules find it (botocore's
    data/partitions.json: a listed region, else the first region pattern that matches, else aws)."""
    return _partition_of(region)[0]


def _partition_of(region: str) -> tuple[str, str]:
    """(partition name, DNS suffix) of `region`."""
    if not _PARTITIONS:
        import importlib.util
        import json

        spec = importlib.util.find_spec("botocore")  # (finds the package; imports nothing)
        found: list[tuple[str, str, re.Pattern[str], frozenset[str]]] = []
        for where in (spec.submodule_search_locations or []) if spec else []:
            try:
                with open(os.path.join(where, "data", "partitions.json"), encoding="utf-8") as f:
                    data = json.load(f)
            except OSError:
                continue
            for p in data["partitions"]:
                out = p["outputs"]
                found.append(
                    (out["name"], out["dnsSuffix"], re.compile(p["regionRegex"]), frozenset(p["regions"]))
                )
            break
        _PARTITIONS[:] = found or [("aws", "amazonaws.com", re.compile(r".*"), frozenset())]
    for name, suffix, _, regions in _PARTITIONS:
        if region in regions:
            return name, suffix
    for name, suffix, pattern, _ in _PARTITIONS:
        if pattern.match(region):
            return name, suffix
    return next(((n, s) for n, s, _, _ in _PARTITIONS if n == "aws"), ("aws", "amazonaws.com"))


def _is_accelerate_url(url: str) -> bool:
    """botocore's is_s3_accelerate_url: https?://s3-accelerate[.dualstack].amazonaws.com."""
    parts = urllib.parse.urlsplit(url)
    labels = parts.netloc.split(".")
    features = labels[1:-2]
    return (
        parts.scheme in ("http", "https")
        and parts.netloc.endswith("amazonaws.com")
        and labels[0] == "s3-accelerate"
        and len(features) == len(set(features))
        and all(f in ("dualstack",) for f in features)
    )


def aws_host(region: str, fips: bool = False, dualstack: bool = False, accelerate: bool = False) -> str:
    """The S3 host of `region` (without a bucket) as botocore's endpoint rules build it:
    s3[-fips][.dualstack].REGION.SUFFIX, or s3-accelerate[.dualstack].SUFFIX (always
    virtual-hosted); SUFFIX is the partition's (amazonaws.com, amazonaws.com.cn, …)."""
    suffix = _partition_of(region)[1]
    dual = ".dualstack" if dualstack else ""
    if accelerate:
        return f"s3-accelerate{dual}.{suffix}"
    return f"s3{'-fips' if fips else ''}{dual}.{region}.{suffix}"


_IPV4 = re.compile(r"(?:[0-9]{1,3}\.){3}[0-9]{1,3}")
_HOST_LABEL = re.compile(r"(?!-)[a-zA-Z\d-]{1,63}(?<!-)")


def virtual_hostable(bucket: str, dots: bool = False) -> bool:
    """botocore's aws_is_virtual_hostable_s3_bucket: 3+ characters, lower case, not an IPv4
    address, DNS labels of letters, digits and '-' (one label, or several where `dots`)."""
    if len(bucket) < 3 or bucket.lower() != bucket or _IPV4.fullmatch(bucket):
        return False
    labels = bucket.split(".") if dots else [bucket]
    return all(_HOST_LABEL.fullmatch(label) for label in labels)


def _true(value: Any) -> bool:
    """botocore's ensure_boolean."""
    return value if isinstance(value, bool) else str(value or "").strip().lower() == "true"


def redact_url(text: str) -> str:
    """A URL as it may be shown: user info cut out, through the last '@' (as the NATS/MQTT URLs
    are, topics.sources.access.redact_url; the library layers do not import each other)."""
    scheme, sep, rest = text.partition("://")
    return f"{scheme}://{rest.rpartition('@')[2]}" if sep else text


def masked_url(text: str) -> str:
    """A URL with user info as it may be quoted in the error that refuses it: `***` in its place,
    so the reader sees that something was there and was cut."""
    scheme, sep, rest = text.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}" if sep and "@" in rest else text


def check_endpoint_url(endpoint: str) -> urllib.parse.SplitResult:
    """An S3 endpoint URL's parts, or BadSourceError: http(s)://host[:port][/path], no user info
    (keys belong in the environment or a profile; one in a URL would be echoed in errors and logs)."""
    try:
        parts = urllib.parse.urlsplit(endpoint)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # "http://[bad", a port out of range
        parts, port_ok = urllib.parse.urlsplit(""), False
    if redact_url(endpoint) != endpoint:  # (any '@': a password may hold '/' unencoded)
        # quoted with '***@' where the user info was: the URL without it (redact_url's) read as if
        # the refused URL held none
        raise BadSourceError(
            f"endpoint URL must not hold user info (user:password@); put the keys in "
            f"AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile: got {masked_url(endpoint)!r}"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise BadSourceError(f"endpoint URL must be http(s)://host[:port], got {redact_url(endpoint)!r}")
    if "?" in endpoint or "#" in endpoint:
        # (botocore refuses a query too; rq dropped it, and a fragment, without a word)
        raise BadSourceError(
            f"endpoint URL must not hold a query or fragment ('?…', '#…'): got {redact_url(endpoint)!r}"
        )
    return parts


def credentials_provider(creds: Credentials) -> Any:
    """The CRT provider that signs with `creds`: static keys as they are; expiring ones through a
    delegate that asks botocore's object for every signature (a lock and a clock check, until the
    advisory 15 minutes before expiry, when botocore fetches new ones the way boto3 would)."""
    from awscrt import auth

    if creds.refreshable is None:
        return auth.AwsCredentialsProvider.new_static(creds.access_key, creds.secret_key, creds.token)
    last = [auth.AwsCredentials(creds.access_key, creds.secret_key, creds.token)]

    def current() -> Any:
        try:
            frozen = creds.refreshable.get_frozen_credentials()
        except Exception:
            # the refresh failed (the network, an SSO login that ran out): the last ones are
            # tried, and the store's refusal is the AuthError the caller sees
            return last[0]
        last[0] = auth.AwsCredentials(str(frozen.access_key), str(frozen.secret_key), frozen.token)
        return last[0]

    return auth.AwsCredentialsProvider.new_delegate(current)


def _profile_endpoint(config: dict[str, Any]) -> str | None:
    s3 = config.get("s3")
    if isinstance(s3, dict) and s3.get("endpoint_url"):
        return str(s3["endpoint_url"])
    value = config.get("endpoint_url")
    return str(value) if value else None


def _error_code(body: bytes | None) -> tuple[str, str]:
    if not body:
        return "", ""
    try:
        root = ET.fromstring(body)
    except Exception:  # not XML, or XML naming an encoding Python lacks: classify by status alone
        return "", ""
    return (root.findtext("Code") or ""), (root.findtext("Message") or "")


def _bucket_region(body: bytes | None, headers: list[tuple[str, str]] | None = None) -> str | None:
    """The bucket's region from an S3 redirect or region error: <Region>, else <Endpoint>'s
    b.s3.REGION.amazonaws.com (or the legacy b.s3-REGION…), else the x-amz-bucket-region header,
    which is all a body-less reply (to a HEAD) carries."""
    region = ""
    try:
        root = ET.fromstring(body) if body else None
    except Exception:
        root = None
    if root is not None:
        region = (root.findtext("Region") or "").strip()
        if not region:
            region = _host_region((root.findtext("Endpoint") or "").strip())
    region = region or _header_region(headers)
    return region if re.fullmatch(r"[a-z0-9-]{1,40}", region) else None


def _host_region(host: str) -> str:
    """REGION of an AWS S3 host name or URL (b.s3.REGION.amazonaws.com, b.s3-REGION.amazonaws.com)."""
    found = re.search(r"(?:^|[./])s3[.-]([a-z0-9-]+)\.amazonaws\.com", host)
    return found.group(1) if found and found.group(1) != "external-1" else ""


def _header_region(headers: list[tuple[str, str]] | None) -> str:
    """The bucket's region as a reply's headers give it: x-amz-bucket-region, else a redirect's
    Location on a regional AWS host."""
    named = {n.lower(): v for n, v in headers or ()}
    return named.get("x-amz-bucket-region", "").strip() or _host_region(named.get("location", ""))


# CRT error names of a connection that was up and then went away (not refused, not timed out)
LOST_CONNECTION = ("AWS_IO_SOCKET_CLOSED", "AWS_ERROR_HTTP_CONNECTION_CLOSED")

# refusals of the credentials themselves (400s among them): retrying cannot help
AUTH_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
}
REGION_CODES = {
    "AuthorizationHeaderMalformed",
    "PermanentRedirect",
    "TemporaryRedirect",  # (307: a bucket created moments ago in another region, until DNS catches up)
    "IllegalLocationConstraintException",
}

THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}


def map_error(
    what: str,
    error: BaseException | None,
    status: int | None,
    body: bytes | None,
    endpoint: str,
    headers: list[tuple[str, str]] | None = None,
    signed_region: str | None = None,
) -> CacheError:
    """One exception type per way a caller must react, with a message that names the thing.
    `headers`: the reply's (a HEAD's refusal has no body, only its status and headers);
    `signed_region`: the region the request was signed for, when known."""
    code, message = _error_code(body)
    if code in ("NoSuchBucket",):
        return NotFoundError(f"bucket not found: {what}")
    if code in ("NoSuchKey",) or status == 404:
        return NotFoundError(f"not found: {what}")
    if _plain_redirect(code, status, body, headers):
        # an http endpoint that a proxy sends to https, a load balancer's move: not S3's region
        # redirect (no S3 code, no region), and not cured by a re-run or by AWS_REGION
        location = {n.lower(): v for n, v in headers or ()}.get("location", "")
        # without its query: of no use to the hint, and an '@' in it (a token) made redact_url,
        # which cuts through the last '@' to be safe, show the wrong host
        location = location.split("?", 1)[0].split("#", 1)[0]
        moved = MisbehavingStoreError(
            f"{what}: the endpoint answered HTTP {status}, a redirect to {redact_url(location)}, not an S3 reply"
        )
        moved.hint = "rq does not follow redirects: point --endpoint-url at the address it redirects to"
        return moved
    if code in REGION_CODES or status == 301 or _redirected_by_header(code, status, headers, signed_region):
        # signed for one region, the bucket lives in another: every retry fails the same way
        region = _bucket_region(body, headers)
        where = f" ({region})" if region else ""
        return AuthError(
            f"{code or f'HTTP {status}'} for {what}: the bucket is in another region{where}: "
            f"set AWS_REGION{f'={region}' if region else ''} (or region in the AWS profile)"
        )
    if status == 407:
        # the proxy's refusal (the CRT talks to it for us): not the store's, and not cured by a re-run
        proxy = _proxy_of(endpoint)
        if proxy is not None:
            return proxy.refused(endpoint, 407, "Proxy Authentication Required")
        return AuthError(f"{what}: HTTP 407, a proxy on the way wants a user and password")
    if code in AUTH_CODES or status in (401, 403):
        return AuthError(f"{code or 'access denied'} for {what}: {message or 'check the AWS credentials'}")
    if code == "PreconditionFailed" or status == 412:
        return ChangedError(f"{what} changed while it was being read")
    if status is not None:
        err = OriginError(f"{what}: HTTP {status} {code} {message}".strip())
        err.throttled = code in THROTTLE_CODES or status in (429, 503)  # type: ignore[attr-defined]
        err.status = status  # type: ignore[attr-defined]  # (Cache.open serves stale on 5xx, not 4xx)
        return err
    name = getattr(error, "name", "") or type(error).__name__
    if "NO_SPACE" in name:
        # the CRT writes a body straight to its file: ENOSPC comes back as one of its errors.
        # A full disk stops the run (exit 7); retrying each object only fails again, slowly
        return FileSystemFullError(f"no space left on the file system writing {what} ({name})")
    if "MAX_FDS" in name:
        # AWS_ERROR_MAX_FDS_EXCEEDED: the CRT could not open a socket or a file for lack of
        # descriptors. Said as the EMFILE it is, so the fetcher narrows its window and the CLI
        # names the open-files limit, instead of failing object after object with the CRT's words
        err = OriginError(f"{what}: the process ran out of open files ({name})")
        err.__cause__ = OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return err
    unusable = _unusable_proxy(endpoint)
    if unusable is not None:
        # a proxy URL rq cannot use (socks5://, https://, a port that is no number): the CRT failed
        # on it its own way ("cannot reach ENDPOINT — check --endpoint-url", a malformed string).
        # After the two errors no proxy causes: out of descriptors, even the look at the proxy
        # settings could fail (its lazy import of urllib.request opens files)
        return unusable
    if "SLOW_DOWN" in name or "THROTTL" in name:
        err = OriginError(f"{what}: throttled by the store ({name})")
        err.throttled = True  # type: ignore[attr-defined]
        return err
    if any(s in name for s in LOST_CONNECTION):
        # the store answered, then a connection dropped (a reset, a proxy recycling it) after the
        # CRT's own retries: one object's trouble, retried by the fetcher; a store that refuses or
        # never answers, or whose connections keep dropping (fetcher.LOST_IN_A_ROW), stops the run
        err = OriginError(f"{what}: connection lost ({name})")
        err.throttled = False  # type: ignore[attr-defined]
        # (the fetcher counts these in a row)
        err.lost_connection = True  # type: ignore[attr-defined]
        return err
    if any(s in name for s in ("SOCKET", "DNS", "CONNECTION", "TIMEOUT", "HOST", "CLOSED", "TLS")):
        proxy = _proxy_of(endpoint)
        if proxy is not None:
            # the CRT's socket is the proxy's: "check --endpoint-url" pointed at the wrong thing
            return proxy.unreachable(endpoint, name)
        return UnreachableError(f"cannot reach {endpoint} ({name})")
    text = str(error or "").strip()
    if "INTERNAL_ERROR" in name:
        # the CRT's own retries of 5xx ran out; its text repeats its name ("X X: …")
        return OriginError(f"{what}: the store kept answering with an internal error (5xx, {name})")
    return OriginError(f"{what}: {text if text.startswith(name) else f'{name} {text}'.strip()}")


def _proxy_of(endpoint: str) -> Proxy | None:
    """The proxy the CRT sends requests to `endpoint` through (the environment's, as botocore
    picks it), or None; a proxy URL rq cannot use is left to the code that uses it."""
    parts = urllib.parse.urlsplit(endpoint)
    try:
        return proxy_for(parts.scheme or "https", parts.netloc)
    except CacheError:
        return None


def _unusable_proxy(endpoint: str) -> CacheError | None:
    """The BadSourceError (exit 2, naming its variable) of a proxy URL for `endpoint` that
    cache.proxy cannot use, else None."""
    parts = urllib.parse.urlsplit(endpoint)
    try:
        proxy_for(parts.scheme or "https", parts.netloc)
    except CacheError as exc:
        return exc
    return None


def _refused_at_start(exc: BaseException, what: str, endpoint: str) -> BaseException:
    """What to raise for a request the CRT would not start (make_request raised): its own errors
    (AWS_ERROR_MAX_FDS_EXCEEDED opening the file to write, …) mapped as its callbacks' are; the rest
    (an interrupt) as they came."""
    if getattr(exc, "name", "") and type(exc).__name__ == "AwsCrtError":
        return map_error(what, exc, None, None, endpoint)
    # the binding raises RuntimeError("45 (AWS_ERROR_MAX_FDS_EXCEEDED): …")
    said = _CRT_RUNTIME.match(str(exc)) if isinstance(exc, RuntimeError) else None
    if said is not None:
        from awscrt.exceptions import AwsCrtError

        return map_error(what, AwsCrtError(int(said[1]), said[2], said[3]), None, None, endpoint)
    return exc


_CRT_RUNTIME = re.compile(r"(\d+) \((AWS_\w+)\): (.*)", re.S)


def _plain_redirect(
    code: str, status: int | None, body: bytes | None, headers: list[tuple[str, str]] | None
) -> bool:
    """A 3xx that is not S3's: a Location to go to, and no S3 error code or region in its body or
    headers (a bare 301 that says nothing is read as AWS's region redirect, as before)."""
    return (
        status is not None
        and 300 <= status < 400
        and status != 304
        and not code
        and any(n.lower() == "location" for n, _ in headers or ())
        and not _bucket_region(body, headers)
    )


def _redirected_by_header(
    code: str, status: int | None, headers: list[tuple[str, str]] | None, signed_region: str | None
) -> bool:
    """A reply without an S3 error code (a HEAD's, which has no body) that AWS marks as a region
    mismatch only by its headers (x-amz-bucket-region, a Location on a regional host): a 307
    redirect, or the 400 a HEAD signed for the wrong region gets. A header naming the very region
    signed for is no mismatch."""
    region = _header_region(headers)
    return not code and status in (307, 400) and bool(region) and region != signed_region


def _content_length(headers: list[tuple[str, str]]) -> int:
    for name, value in headers:
        if name.lower() == "content-length":
            return int(value) if value.isdigit() else 0
    return 0


def _silent(what: str, endpoint: str, ticket: Ticket, kind: type[CacheError]) -> CacheError:
    """The error of a request the watchdog cancelled: a lost connection (retried per object) for
    a body, the store unreachable for a request someone waits on."""
    if ticket.body_bytes:
        # a whole-object GET: the CRT hands its headers and body over only once all of it came,
        # so whether the store answered at all, or sent part of the body, cannot be told here
        text = (
            f"{endpoint} did not send {what} ({ticket.body_bytes} bytes) within {ticket.allowance:.0f} s: "
            f"no reply, or a body that stopped or came slower than {SLOWEST_BYTES_PER_S >> 10} KiB/s "
            "(a stalled store or proxy)"
        )
    else:
        text = (
            f"{endpoint} accepted the connection but sent nothing for {ticket.allowance:.0f} s ({what}): "
            "a stalled store or proxy"
        )
    err = kind(text)
    err.lost_connection = True  # type: ignore[attr-defined]
    err.stalled = True  # type: ignore[attr-defined]  # (30 s an attempt: retried fewer times)
    err.throttled = False  # type: ignore[attr-defined]
    return err


def no_etag(method: str, what: str, endpoint: str, status: int, content_type: str | None) -> CacheError:
    """A 2xx reply to an object's GET or HEAD without an ETag: not an S3 object."""
    kind = f", Content-Type {content_type}" if content_type else ""
    err = MisbehavingStoreError(
        f"{endpoint} answered the {method} of {what} with HTTP {status}{kind} and no ETag, which S3 "
        "always sends: not the object (an error page of a proxy in front of the store?); nothing cached"
    )
    # an answer, not silence: Cache.open must not serve a stale copy in its place (nor retry it
    # as a lost connection)
    err.status = status  # type: ignore[attr-defined]
    return err


def map_error_safely(
    operation: str,
    what: str,
    error: BaseException,
    status: int | None,
    done: dict[str, Any],
    endpoint: str,
    signed_region: str | None = None,
) -> CacheError:
    """map_error for a CRT callback, which must always hand an error on: an exception raised there
    is swallowed by the CRT and whoever waits for the request would wait for ever. `done`: the
    CRT's other on_done arguments (error_body, error_headers)."""
    try:
        return map_error(
            what, error, status, done.get("error_body"), endpoint, done.get("error_headers"), signed_region
        )
    except Exception:
        return OriginError(f"{what}: {operation} failed ({error})")


_kept: set[int] = set()  # CRT threads whose Python thread state lives as long as they do


def immortal(holder: list[Any]) -> list[Any]:
    """`holder`, with one reference that is never given back: neither it nor what it holds is ever
    freed, not even when the interpreter clears the modules at exit."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(holder))
    return holder


# Every S3 client of this process (weakly), and those a forked child inherited from its parents,
# which it must never free. Releasing the last reference to a CRT client starts its teardown:
# `EvntLoopCleanup` threads that pthread_join the event-loop threads of the parent, which do not
# exist in the child. glibc has put those threads' stacks in its cache, so new threads of the child
# run on them: the cleanup threads joined each other, or a thread of the child (the watchdog, a
# DataLoader worker's own threads) and then tore down the parent's event loops under it. Each
# forked worker died of SIGSEGV, on a CRT thread or at exit (measured: every child of a parent with
# 8 idle threads, tests/cache/test_fork_crt.py). The teardown also takes the client's locks, which
# a parent's CRT thread may have held at the fork.
_made: weakref.WeakSet[S3] = weakref.WeakSet()
_inherited: list[Any] = immortal([])


def _after_fork_in_child() -> None:
    global _made, _shared_lock
    _kept.clear()
    _inherited.extend(_made)  # the parent's clients: kept, never used, never freed here
    _made = weakref.WeakSet()
    _shared.clear()
    _shared_lock = threading.Lock()  # a parent thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def keep_thread_state() -> None:
    """Called from a CRT callback: keeps this foreign thread's Python thread state for good.

    The CRT calls into Python through PyGILState_Ensure/Release. A thread that holds no state of its
    own gets a new one for every callback and loses it after, and with it a 16 KiB frame stack that
    CPython mmaps and munmaps each time: ~5,700 munmaps (3.5% of the CPU) for 2,000 small objects
    (strace, perf). One extra Ensure, never released, makes the state outlive the callback; it is
    freed with the interpreter, like a daemon thread's. Shutdown stays safe: awscrt checks
    Py_IsInitialized() before it calls Ensure, and finalisation clears that flag first."""
    ident = threading.get_ident()
    if ident not in _kept:
        _kept.add(ident)
        ctypes.pythonapi.PyGILState_Ensure()


@dataclass(frozen=True)
class Route:
    """Where an S3 client's requests go (route())."""

    scheme: str
    netloc: str  # host[:port] of the endpoint, without a bucket
    base_path: str
    custom_endpoint: bool
    addressing: Addressing
    host: str
    port: int | None
    endpoint_text: str  # the endpoint as messages name it

    def url(self, bucket: str, key: str) -> str:
        """The URL of an object's requests (tests compare it with boto3's)."""
        host, path = target(self.netloc, self.base_path, self.custom_endpoint, bucket, key, self.addressing)
        return f"{self.scheme}://{host}{path}"


def route(creds: Credentials) -> Route:
    """The endpoint of `creds` as botocore's S3 endpoint rules pick it: the endpoint URL where one
    is configured (FIPS and dual-stack do not apply then), else the AWS host of the region with
    FIPS, dual-stack or S3 Accelerate as configured (aws_host)."""
    endpoint = creds.endpoint_url
    if endpoint:
        parts = check_endpoint_url(endpoint)
        host = str(parts.hostname)
        addressing = Addressing(
            creds.addressing_style,
            False,
            _is_accelerate_url(endpoint),
            parts.scheme,
            _IPV4.fullmatch(host) is not None or ":" in host,
        )
        return Route(
            parts.scheme, parts.netloc, parts.path.rstrip("/"), True, addressing, host, parts.port, endpoint
        )
    netloc = aws_host(creds.region, creds.fips, creds.dualstack, creds.accelerate)
    if creds.legacy_global and not (creds.fips or creds.dualstack or creds.accelerate):
        netloc = "s3.amazonaws.com"
    addressing = Addressing(creds.addressing_style, creds.accelerate, False, "https")
    return Route("https", netloc, "", False, addressing, netloc, None, f"https://{netloc}")


class S3:
    """One CRT S3 client for this process (recreated after fork: CRT threads do not survive it)."""

    def __init__(self, settings: S3Settings, throughput_gbps: float = 20.0, memory_limit: int = 256 << 20):
        from awscrt import s3

        self.creds = resolve_credentials(settings)
        creds = self.creds
        where = route(creds)
        self.custom_endpoint = where.custom_endpoint
        self.scheme, self.netloc, self.base_path = where.scheme, where.netloc, where.base_path
        self.addressing = where.addressing  # how target() addresses a bucket
        host, port = where.host, where.port
        self.endpoint_text = where.endpoint_text
        if settings.max_retries is not None:
            retries = settings.max_retries
        else:
            retries = DEFAULT_RETRIES if creds.max_attempts is None else creds.max_attempts - 1
        fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(S3Settings)}
        # (cache.ranged retries its pieces as often)
        self.settings = ResolvedS3Settings(**{**fields, "max_retries": retries})
        max_retries = retries
        tls_options = (
            crt_tls_options(self.creds.ca_bundle) if self.scheme == "https" and self.creds.ca_bundle else None
        )
        provider = credentials_provider(self.creds)
        signing = s3.create_default_s3_signing_config(region=self.creds.region, credential_provider=provider)
        self.signing = signing  # also signs the ranged GETs of cache.ranged
        retry = s3.S3RetryConfig(
            # (0 is the CRT's default of 5: max_attempts = 1, no retry, is retry mode NONE)
            max_retries=max(1, max_retries),
            backoff_scale_factor_ms=50,
            max_backoff_secs=4,
            # STANDARD: exponential backoff, full jitter, a retry token bucket. (ADAPTIVE's client rate
            # limiter took 83 s instead of 2.4 s to finish 80 objects behind 25% SlowDown; measured.)
            # Concurrency backs off in our own AIMD window instead (cache/fetcher.py).
            retry_mode=s3.S3RetryMode.STANDARD if max_retries else s3.S3RetryMode.NONE,
        )
        # Our own event loop group rather than the CRT's process-wide default: a DataLoader worker
        # forked after the parent used S3 inherits a default whose threads did not survive the fork.
        from awscrt import io as crt_io

        elg = crt_io.EventLoopGroup()
        bootstrap = crt_io.ClientBootstrap(elg, crt_io.DefaultHostResolver(elg))
        self.client = s3.S3Client(
            bootstrap=bootstrap,
            region=self.creds.region,
            signing_config=signing,
            tls_mode=s3.S3RequestTlsMode.DISABLED if self.scheme == "http" else s3.S3RequestTlsMode.ENABLED,
            part_size=PART_SIZE,
            throughput_target_gbps=throughput_gbps,
            memory_limit=memory_limit,
            retry_config=retry,
            connect_timeout_ms=3000,
            tls_connection_options=tls_options,
        )
        # https: one handshake of our own beside the first request (cache.tls says why)
        self.tls: TlsCheck | None = None
        if self.scheme == "https":
            self.tls = TlsCheck(str(host), port or 443, self.creds.ca_bundle, self.endpoint_text, 10.0)
        self.pid = os.getpid()
        self._listings: dict[tuple[str, str], Listing] = {}
        self._listings_lock = threading.Lock()
        self._ranged: RangedGets | None = None
        self._ranged_lock = threading.Lock()
        self.watchdog = Watchdog()
        _made.add(self)  # a forked child keeps it (_after_fork_in_child)

    @property
    def ranged(self) -> RangedGets:
        """Big objects' pieces (cache.ranged), started on first use."""
        with self._ranged_lock:
            if self._ranged is None:
                from cache.ranged import RangedGets

                self._ranged = RangedGets(self)
            return self._ranged

    # --- request plumbing ----------------------------------------------------------------------

    def _target(self, bucket: str, key: str) -> tuple[str, str]:
        return target(self.netloc, self.base_path, self.custom_endpoint, bucket, key, self.addressing)

    def _request(self, method: str, host: str, path: str, headers: list[tuple[str, str]]) -> Any:
        from awscrt import http

        return http.HttpRequest(method, path, http.HttpHeaders([("Host", host), *headers]))

    def _send(
        self,
        operation: str,
        method: str,
        bucket: str,
        key: str,
        on_result: Callable[[int, list, bytes, CacheError | None], None],
        query: str = "",
        checksum_mode: bool = False,
    ) -> None:
        """A small request; `on_result(status, headers, body, mapped error or None)` runs on a CRT thread."""
        from awscrt import s3

        host, path = self._target(bucket, key)
        if query:
            path = f"{path}?{query}"
        body = bytearray()
        got: dict[str, Any] = {}
        what = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
        endpoint, region = self.endpoint_text, self.creds.region

        tls = self.tls
        ticket = self.watchdog.watch()

        def on_headers(status_code: int, headers: list, **_: Any) -> None:
            ticket.alive()
            if tls is not None:
                tls.passed()  # an answer is coming over TLS
            got["headers"] = headers

        def on_body(chunk: bytes, offset: int, **_: Any) -> None:
            ticket.alive()
            body.extend(chunk)

        def on_done(error: BaseException | None = None, status_code: int | None = None, **kw: Any) -> None:
            ticket.close()
            mapped = None
            if tls is not None and status_code:
                tls.passed()  # an answer came over TLS
            if error is not None and ticket.timed_out:  # (an answer that beat the cancel stands)
                mapped = _silent(what, endpoint, ticket, UnreachableError)
            elif error is not None:
                mapped = map_error_safely(operation, what, error, status_code, kw, endpoint, region)
            on_result(int(status_code or 0), got.get("headers", []), bytes(body), mapped)

        try:
            request = self.client.make_request(
                type=s3.S3RequestType.DEFAULT,
                operation_name=operation,
                request=self._request(
                    method, host, path, [("x-amz-checksum-mode", "ENABLED")] if checksum_mode else []
                ),
                on_headers=on_headers,
                on_body=on_body,
                on_done=on_done,
            )
        except BaseException as exc:
            ticket.close()  # never started: nothing to watch
            mapped = _refused_at_start(exc, what, endpoint)
            if mapped is exc:
                raise
            # (no `from exc`: that would replace the OSError(EMFILE) cause map_error gave it, by
            # which the fetcher knows to narrow its window, dr3; the CRT's error stays its context)
            raise mapped  # noqa: B904
        ticket.hold(request)

    def _call(
        self, operation: str, method: str, bucket: str, key: str, query: str = "", checksum_mode: bool = False
    ) -> tuple[int, list, bytes]:
        """A small request, waited for: returns (status, headers, body) or raises a mapped error."""
        result: list[tuple[int, list, bytes, CacheError | None]] = []
        done = threading.Event()

        def on_result(status: int, headers: list, body: bytes, error: CacheError | None) -> None:
            result.append((status, headers, body, error))
            done.set()

        if self.tls is not None and (failure := self.tls.failure()) is not None:
            raise failure  # known untrusted: send nothing (the CRT would retry it for minutes)
        self._send(operation, method, bucket, key, on_result, query, checksum_mode)
        if self.tls is not None:
            self.tls.on_failure(lambda error: on_result(0, [], b"", error))
        done.wait()
        status, headers, body, error = result[0]
        if error is not None:
            raise error
        return status, headers, body

    # --- operations ----------------------------------------------------------------------------

    def start_listing(self, bucket: str, prefix: str) -> None:
        """Begins listing bucket/prefix now; the next list_objects() of the same pair takes it over.
        `rq preload` calls this before it imports and opens the cache, which then takes as long as
        the listing itself (~40 ms for 2,000 keys) and so no longer comes on top of it."""
        with self._listings_lock:
            if (bucket, prefix) not in self._listings:
                self._listings[(bucket, prefix)] = Listing(self, bucket, prefix)

    def first_listing_page(self, bucket: str, prefix: str) -> tuple[list[Item], CacheError | None, bool]:
        """Waits for the first page of bucket/prefix's listing (starting it if need be) and leaves
        it for list_objects() to take over: (its items, the listing's error, whether it is the last
        page). `rq preload` asks before it makes a new cache, so a missing bucket, an empty prefix
        or filters that match nothing on a listing of one page create nothing."""
        self.start_listing(bucket, prefix)
        with self._listings_lock:
            listing = self._listings.get((bucket, prefix))
        if listing is None:  # already taken by a reader: nothing left to tell
            return [], None, False
        return listing.first_page()

    def list_objects(self, bucket: str, prefix: str) -> Iterator[tuple[str, int, str, str | None]]:
        """(key, size, etag, version) for every object under prefix (ListObjectsV2, url-encoded keys)."""
        return iter(self.listing(bucket, prefix))

    def listing(self, bucket: str, prefix: str) -> Listing:
        """The listing of bucket/prefix: the one started for it, else a new one."""
        with self._listings_lock:
            listing = self._listings.pop((bucket, prefix), None)
        return listing or Listing(self, bucket, prefix)

    def head(self, bucket: str, key: str) -> tuple[int, str, str | None, list[tuple[str, str]]]:
        """(size, etag, version id, all headers incl. x-amz-checksum-* for the whole object)."""
        status, headers, _ = self._call("HeadObject", "HEAD", bucket, key, checksum_mode=True)
        h = {k.lower(): v for k, v in headers}
        etag = h.get("etag", "").strip('"')
        if not etag:
            raise no_etag("HEAD", f"s3://{bucket}/{key}", self.endpoint_text, status, h.get("content-type"))
        size = int(h.get("content-length", 0))
        return size, etag, h.get("x-amz-version-id"), headers

    def get(
        self,
        bucket: str,
        key: str,
        *,
        on_headers: Callable[[list[tuple[str, str]]], None],
        on_done: Callable[[BaseException | None], None],
        recv_filepath: str,
        on_progress: Callable[[int], None] | None = None,
        size: int = 0,
    ) -> Any:
        """Starts a plain GET of a whole object that the CRT writes into `recv_filepath` (the
        response carries the object's checksum headers); callbacks run on CRT threads. `on_done`
        gets None or a mapped CacheError. Big objects' ranged pieces go through cache.ranged."""
        from awscrt import s3

        if self.tls is not None and (failure := self.tls.failure()) is not None:
            on_done(failure)  # the CRT would take minutes to say so (cache.tls)
            return None
        host, path = self._target(bucket, key)
        what = f"s3://{bucket}/{key}"
        endpoint, region = self.endpoint_text, self.creds.region
        tls = self.tls

        ticket = self.watchdog.watch()
        # the CRT hands the headers over only with the whole body: the time the body may take
        # (the listed size at the slowest rate allowed) is given now, or a slow but moving body
        # was cancelled after 30 s
        ticket.expect(size)
        answer: list[tuple[int, str | None]] = []  # (status, Content-Type) of a 2xx without an ETag

        def _progress(progress: int, **_: Any) -> None:
            ticket.alive()
            if on_progress is not None:
                on_progress(progress)

        def _headers(status_code: int, headers: list, **_: Any) -> None:
            keep_thread_state()
            ticket.alive(_content_length(headers))
            if tls is not None:
                tls.passed()  # an answer is coming over TLS
            if status_code < 300:
                if not any(n.lower() == "etag" and v.strip('"') for n, v in headers):
                    kind = next((v for n, v in headers if n.lower() == "content-type"), None)
                    answer.append((status_code, kind))
                on_headers(headers)

        def _done(error: BaseException | None = None, status_code: int | None = None, **kw: Any) -> None:
            ticket.close()
            if tls is not None and status_code:
                tls.passed()  # an answer came over TLS
            if error is not None and ticket.timed_out:
                on_done(_silent(what, endpoint, ticket, OriginError))  # retried, like a lost connection
                return
            if error is None:
                # S3 sends an ETag with every object; a 200 without one is someone else's page
                # (a proxy's HTML error, a captive portal) and must not be cached as the object
                on_done(no_etag("GET", what, endpoint, *answer[0]) if answer else None)
                return
            on_done(map_error_safely("GetObject", what, error, status_code, kw, endpoint, region))

        try:
            request = self.client.make_request(
                type=s3.S3RequestType.DEFAULT,
                operation_name="GetObject",
                request=self._request("GET", host, path, [("x-amz-checksum-mode", "ENABLED")]),
                on_headers=_headers,
                recv_filepath=recv_filepath,
                on_done=_done,
                on_progress=_progress if on_progress else None,
            )
        except BaseException as exc:
            ticket.close()  # never started: nothing to watch
            mapped = _refused_at_start(exc, what, endpoint)
            if mapped is exc:
                raise
            # (no `from exc`: that would replace the OSError(EMFILE) cause map_error gave it, by
            # which the fetcher knows to narrow its window, dr3; the CRT's error stays its context)
            raise mapped  # noqa: B904
        ticket.hold(request)
        return request


Item = tuple[str, int, str, str | None]  # (key, size, etag, version id)


class Listing:
    """ListObjectsV2 of one prefix, page after page: each page asks for the next as soon as it has
    arrived and been parsed (on the CRT thread), while the caller is still busy with the one before."""

    page_size = 1000  # ListObjectsV2's own maximum
    # pages listed ahead of the reader: a prefix of millions of objects lists far faster than it
    # is fetched, and must not end up in memory whole (issue 3: memory stays bounded)
    ahead = 4

    def __init__(self, s3: S3, bucket: str, prefix: str):
        self._s3, self._bucket, self._prefix = s3, bucket, prefix
        self._tokens: set[str] = set()  # a store that hands back a token twice would list forever
        self._closed = False  # the reader left: ask for no more pages
        self._lock = threading.Lock()
        self._unread = 0  # pages queued and not yet taken by the reader
        self._paused: str | None = None  # the next page's token, while `ahead` pages wait unread
        self._head: tuple[list[Item], CacheError | None, bool] | None = None  # seen by first_page()
        # (items, error, last page)
        self._pages: queue.SimpleQueue[tuple[list[Item], CacheError | None, bool]] = queue.SimpleQueue()
        if s3.tls is not None and (failure := s3.tls.failure()) is not None:
            self._pages.put(([], failure, True))  # known untrusted: ask nothing
            return
        self._ask(None)
        if s3.tls is not None:
            s3.tls.on_failure(lambda error: self._pages.put(([], error, True)))

    def _ask(self, token: str | None) -> None:
        params = {
            "list-type": "2",
            "prefix": self._prefix,
            "encoding-type": "url",
            "max-keys": str(self.page_size),
        }
        if token:
            params["continuation-token"] = token
        query = urllib.parse.urlencode(params, quote_via=urllib.parse.quote)
        try:
            self._s3._send("ListObjectsV2", "GET", self._bucket, "", self._on_page, query)
        except CacheError as exc:  # a bucket S3 Accelerate cannot address, …: said as it is
            self._pages.put(([], exc, True))
        except Exception as exc:  # the client could not even start the request
            self._pages.put(([], OriginError(f"s3://{self._bucket}: listing failed: {exc}"), True))

    def _on_page(self, status: int, headers: list, body: bytes, error: CacheError | None) -> None:
        if error is not None:
            self._pages.put(([], error, True))
            return
        try:
            items, token = parse_list_page(body)
        except Exception as exc:  # (on a CRT thread: the reader must hear back, not wait forever)
            # a listing that cannot be read stops the run (exit 6): ending it there would cache
            # part of the prefix and report success
            error = OriginError(f"s3://{self._bucket}/{self._prefix}: unreadable listing ({exc})")
            self._pages.put(([], error, True))
            return
        if token in self._tokens:
            error = MisbehavingStoreError(
                f"s3://{self._bucket}/{self._prefix}: the store is misbehaving: its listing repeats "
                "itself (a continuation token it gave before), so a re-run would list the same pages"
            )
            self._pages.put((items, error, True))
            return
        # this page is queued before the next is asked for, so the pages stay in order whichever
        # thread the next reply arrives on
        with self._lock:
            self._pages.put((items, None, token is None))
            self._unread += 1
            if not token or self._closed:
                return
            self._tokens.add(token)
            if self._unread >= self.ahead:
                self._paused = token  # the reader asks for it when it takes a page
                return
        self._ask(token)

    def _took_page(self) -> None:
        with self._lock:
            self._unread -= 1
            token, self._paused = self._paused, None
        if token is not None:
            self._ask(token)

    def first_page(self) -> tuple[list[Item], CacheError | None, bool]:
        """Waits for the first page, keeping it for the reader: (its items, its error, last page)."""
        if self._head is None:
            self._head = self._pages.get()
        return self._head

    def __iter__(self) -> Iterator[Item]:
        return (item for item in self.marked() if item is not None)

    def marked(self) -> Iterator[Item | None]:
        """The items, with None after each page but the last: a reader that groups items (the
        preloader, a thousand at a time) hands on what a page gave without waiting for more
        pages, which a sparse --include or a store sending empty pages may hold back for long."""
        try:
            while True:
                if self._head is not None:
                    (items, error, last), self._head = self._head, None
                else:
                    items, error, last = self._pages.get()
                self._took_page()
                if error is not None:
                    raise error
                yield from items
                if last:
                    return
                yield None
        finally:
            # a reader that stops early (a preload that failed, a caller that broke off) ends the
            # chain: a long-lived process must not go on listing a huge prefix into memory
            self._closed = True


def parse_list_page(body: bytes) -> tuple[list[Item], str | None]:
    """One ListObjectsV2 reply: its objects, and the token of the next page (None on the last)."""
    root = ET.fromstring(body)
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    if root.tag[len(ns) :] != "ListBucketResult":
        # a proxy's or gateway's HTML error page with 200 is well-formed XML too: taken as a page,
        # it listed nothing and ended the listing (a prefix cached in part, exit 0)
        raise ValueError(f"a <{root.tag[len(ns) :][:40]}> document, not a ListBucketResult")
    # keys are url-encoded only when the reply says so (as botocore decodes them): a store that
    # ignores encoding-type=url sends them raw, and decoding those made `a+b` and `a b` one key,
    # and `pct%41` a request for `pctA`
    encoded = (root.findtext(f"{ns}EncodingType") or "").strip().lower() == "url"
    unquote = urllib.parse.unquote_plus if encoded else str
    items: list[Item] = [
        (
            unquote(item.findtext(f"{ns}Key") or ""),
            int(item.findtext(f"{ns}Size") or 0),
            (item.findtext(f"{ns}ETag") or "").strip('"'),
            None,
        )
        for item in root.iter(f"{ns}Contents")
    ]
    if (root.findtext(f"{ns}IsTruncated") or "false").lower() != "true":
        return items, None
    token = root.findtext(f"{ns}NextContinuationToken")
    if not token:
        # more to come and no way to ask for it: taken as the last page, the rest of the prefix
        # was silently left out
        raise ValueError("IsTruncated is true but there is no NextContinuationToken")
    return items, token


@dataclass(frozen=True)
class Addressing:
    """How target() addresses a bucket, botocore's rules: the profile's s3 = addressing_style
    (auto | virtual | path), S3 Accelerate, whether the endpoint URL is an Accelerate one, its
    scheme, and whether its host is an IP address."""

    style: str = "auto"
    accelerate: bool = False
    accelerate_url: bool = False
    scheme: str = "https"
    ip_host: bool = False


_DEFAULT_ADDRESSING = Addressing()
_virtual_cache: dict[tuple[str, bool], bool] = {}


def target(
    netloc: str,
    base_path: str,
    custom_endpoint: bool,
    bucket: str,
    key: str,
    addressing: Addressing = _DEFAULT_ADDRESSING,
) -> tuple[str, str]:
    """(Host header, path), as botocore's S3 endpoint rules address a bucket. On AWS: virtual-hosted
    (BUCKET.s3.REGION…) where the bucket name is a lower-case DNS label of 3-63 characters, else
    path-style (a bucket with a dot: AWS's certificate, *.s3.REGION.amazonaws.com, does not cover
    a.b.s3…; `My_Legacy_Bucket`: not a host name); addressing_style = path: path-style; S3
    Accelerate: always virtual-hosted (a bucket that cannot be is refused). On an endpoint URL
    (MinIO, SeaweedFS, …): path-style, unless addressing_style = virtual, and then only for a bucket
    that is a host name (dots allowed over http) and a host that is not an IP address."""
    quoted = urllib.parse.quote(key, safe="/~")
    style = addressing.style
    if addressing.accelerate:
        if not _virtual(bucket, False):
            raise BadSourceError(
                f"bucket {bucket!r} cannot be used with S3 Accelerate (use_accelerate_endpoint): its name "
                "is not a DNS label (lower case, no dots, 3-63 characters)"
            )
        return f"{bucket}.{netloc}", f"/{quoted}"
    if custom_endpoint:
        path_style = style == "path" if addressing.accelerate_url else style != "virtual"
        virtual = not path_style and not addressing.ip_host and _virtual(bucket, addressing.scheme == "http")
    else:
        virtual = style != "path" and _virtual(bucket, False)
    if virtual:
        return f"{bucket}.{netloc}", f"{base_path}/{quoted}"
    return netloc, f"{base_path}/{urllib.parse.quote(bucket, safe='')}/{quoted}"


def _virtual(bucket: str, dots: bool) -> bool:
    """virtual_hostable, remembered per bucket (it is asked for every request)."""
    known = _virtual_cache.get((bucket, dots))
    if known is None:
        if len(_virtual_cache) > 4096:
            _virtual_cache.clear()
        known = _virtual_cache[(bucket, dots)] = virtual_hostable(bucket, dots)
    return known


def split_s3_url(url: str) -> tuple[str, str]:
    rest = url[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise BadSourceError(f"no bucket in {url!r} (use s3://bucket/prefix/)")
    return bucket, key


_GLOB_CHAR = re.compile(r"[*?[]")


def list_prefix(prefix: str, include: Iterable[str]) -> str:
    """The key prefix to list for an S3 source's `prefix` under --include, as s5cmd and aws narrow
    ListObjectsV2's Prefix: the source's prefix and the longest literal start (before the first
    `*`, `?` or `[`) that every include pattern shares. A pattern matches the whole key relative to
    the source, so a key it selects starts with that literal part: the narrowed listing holds every
    key the filter would select. --exclude never narrows; a pattern that starts with a glob, or a
    source that names an object (`s3://b/name`: its own key is matched by its base name), lists
    the source's whole prefix."""
    inc = [g.lstrip("/") for g in include]  # (a leading `/` anchors at the source: keys already are)
    if not inc or (prefix and not prefix.endswith("/")):
        return prefix
    # (characters, not path components: `shard-00*` narrows to `shard-00`)
    narrowed = prefix + os.path.commonprefix([_GLOB_CHAR.split(g, 1)[0] for g in inc])  # noqa: RUF071
    # (no narrowing across `//`: SeaweedFS lists `d/x` for `d//` but `d//x` for `d//x`, so the
    # narrowed listing would name the same object by another key than the source's listing does)
    return prefix if "//" in narrowed else narrowed


def start_listings(settings: S3Settings, sources: list[str], include: Iterable[str] = ()) -> None:
    """Starts listing every s3:// source on the shared client (narrowed by --include: list_prefix),
    for the planner to take over; any error is left for the planner's own listing to raise, with
    its usual message. (Here, not in cache.preload: `rq preload` calls it before it pays for
    importing the rest of the cache.)"""
    inc = list(include)
    for source in sources:
        if not source.startswith("s3://"):
            continue
        try:
            bucket, prefix = split_s3_url(source)
            shared_client(settings).start_listing(bucket, list_prefix(prefix, inc))
        except CacheError:
            return


_shared: dict[S3Settings, S3] = {}
_shared_lock = threading.Lock()


def canonical_endpoint(endpoint: str) -> str:
    """`endpoint` as the cache records and compares it: scheme and host in lower case, the
    scheme's default port and a trailing slash dropped (`HTTP://H:80/` and `http://h` are one
    store; spelled apart, two processes re-recorded an entry back and forth, a HEAD each time)."""
    parts = urllib.parse.urlsplit(endpoint)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        return endpoint
    default = {"http": 80, "https": 443}.get(scheme)
    netloc = host if port is None or port == default else f"{host}:{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


def endpoint_for(settings: S3Settings) -> str | None:
    """The endpoint URL an S3 client for `settings` sends requests to (S3.endpoint_text): this
    process's client's, else resolved as that client would resolve it (--endpoint-url,
    AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, the profile's, FIPS / dual-stack / Accelerate), without
    asking for credentials: a fresh cache hit needs none. None where the AWS config cannot be read."""
    client = _shared.get(settings)
    if client is not None and client.pid == os.getpid():
        return canonical_endpoint(client.endpoint_text)
    env = os.environ
    try:
        if settings.profile:
            import botocore.session

            session = botocore.session.Session(profile=settings.profile)
            full, scoped = session.full_config, session.get_scoped_config()
        else:
            full, scoped = _shared_config(env)
        where = _configured(settings, env, full, scoped)
        return canonical_endpoint(route(Credentials("", "", None, **where)).endpoint_text)
    except Exception:  # (a profile not found, a config botocore cannot parse: no endpoint to name)
        return None


def shared_client(settings: S3Settings) -> S3:
    """One client per settings per process; a forked child (DataLoader worker) builds its own."""
    with _shared_lock:
        client = _shared.get(settings)
        if client is None or client.pid != os.getpid():
            client = S3(settings)
            _shared[settings] = client
        return client
