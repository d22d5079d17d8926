"""The shared token and the receiver's TLS identity (self-signed, pinned by fingerprint)."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import secrets
import stat
from pathlib import Path

from transfer.errors import AuthError, UnsafeSecretError
from transfer.private import dir_problem, file_problem, make_private_dirs
from transfer.transport import Identity

TOKEN_BYTES = 32


def load_token(path: Path | None, env_value: str | None, create: bool) -> bytes:
    """The token from `path` (created 0600 with a fresh random token if absent and `create`, its
    missing directories 0700), else env. A token file another user owns, that group or others can
    read or write, or that lies in a directory others can write is refused (AuthError), as ssh
    refuses such a key: whoever could read it can pose as either side, whoever could write it can
    choose it."""
    if path is not None:
        try:
            _check_dir(path.parent, f"token file {path} is in {path.parent}, which", sticky_ok=True)
            text = _read_checked(path, "token file", secret=True).decode().strip()
        except FileNotFoundError:
            if not create:
                raise AuthError(f"token file {path} does not exist; copy it from the receiver") from None
            text = secrets.token_urlsafe(TOKEN_BYTES)
            make_private_dirs(path.parent)
            _check_dir(path.parent, f"token file {path} is in {path.parent}, which", sticky_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text + "\n")
        if not text:
            raise AuthError(f"token file {path} is empty")
        return text.encode()
    if env_value:
        if not env_value.strip():
            # a lookup that returned a newline must not become an empty secret any sender knows
            raise AuthError("RQ_TOKEN is blank (only whitespace); set it to the receiver's token")
        return env_value.strip().encode()
    raise AuthError("no token: pass --token-file FILE or set RQ_TOKEN")


def _check_dir(directory: Path, said: str, sticky_ok: bool) -> None:
    """AuthError when `directory` is another user's or others can write it (`said` begins the line)."""
    try:
        st = os.stat(directory)
    except NotADirectoryError:  # a file on the way to it: said of the path asked for, as below
        raise AuthError(f"{said} lies under a file, not a directory") from None
    if not stat.S_ISDIR(st.st_mode):
        # (as "token file F does not exist": the token cannot be had from where it was asked for)
        raise AuthError(f"{said} is not a directory")
    problem = dir_problem(st, sticky_ok=sticky_ok)
    if problem is not None:
        fix = f"chmod go-w {directory}" if st.st_uid in (os.geteuid(), 0) else "use a directory of your own"
        raise UnsafeSecretError(f"{said} {problem}; refusing it ({fix})")


def _read_checked(path: Path, what: str, secret: bool) -> bytes:
    """The bytes of `path`, checked on the descriptor read (file_problem); raises
    FileNotFoundError as open does, AuthError for a file not to trust."""
    # O_NONBLOCK: a FIFO planted there is refused below, not waited on
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        problem = file_problem(st, secret)
        if problem is not None:
            if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
                fix = f"use a {what} of your own"
            else:
                fix = f"chmod {'600' if secret else 'go-w'} {path}"
            raise UnsafeSecretError(f"{what} {path} {problem}; refusing it ({fix})")
        return fh.read()


def fingerprint(cert_der: bytes) -> str:
    return "sha256:" + hashlib.sha256(cert_der).hexdigest()


def normalise_pin(pin: str) -> str:
    """Accepts "sha256:<hex>", bare hex, or hex with colons; returns "sha256:<hex>"."""
    value = pin.strip().lower()
    value = value.removeprefix("sha256:").replace(":", "")
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise AuthError(f"certificate pin {pin!r} is not a sha256 fingerprint")
    return "sha256:" + value


# RFC 5280 4.1.2.5: the notAfter of a certificate that has no well-defined expiration. The pin
# (the sha256 of the certificate) is the trust, not a CA or the dates, and senders check the pin
# alone: an expiry would only ever change the pin under senders that were given the old one.
NO_EXPIRY = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)


def load_identity(directory: Path) -> Identity:
    """The receiver's certificate, kept in `directory` so the pin survives a restart (and resume):
    one found there is used whatever its dates (an rq before this one made them valid for a year
    and remade them, with a new key and pin, within a day of that). Its missing directories are
    made 0700; a directory another user owns or others can write, a key another user owns or
    others can read, or a certificate others can write is refused (AuthError): whoever could
    put a key there would hold the receiver's identity, its pin printed as the receiver's own."""
    # imported here: only the receiver needs it, and it is a noticeable part of a sender's start-up
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = directory / "recv-cert.pem", directory / "recv-key.pem"
    make_private_dirs(directory)
    _check_dir(directory, f"certificate directory {directory}", sticky_ok=False)
    with contextlib.suppress(FileNotFoundError, ValueError, TypeError):
        key_pem = _read_checked(key_path, "private key", secret=True)
        cert_pem = _read_checked(cert_path, "certificate", secret=False)
        cert = x509.load_pem_x509_certificate(cert_pem)
        key_found = serialization.load_pem_private_key(key_pem, password=None)
        if key_found.public_key() == cert.public_key():  # else a half-written pair: make a new one
            return Identity(cert_pem, key_pem, fingerprint(cert.public_bytes(serialization.Encoding.DER)))
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rq-recv")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(NO_EXPIRY)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("rq-recv")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    for path, data in ((key_path, key_pem), (cert_path, cert_pem)):
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        # never through a link, never into a file that was there: a planted recv-key.tmp<pid>
        # link had the key written into its target
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600)
        except FileExistsError:
            os.unlink(tmp)  # left by an rq that died with this pid (the directory is ours alone)
            fd = os.open(tmp, flags, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    return Identity(cert_pem, key_pem, fingerprint(cert.public_bytes(serialization.Encoding.DER)))
