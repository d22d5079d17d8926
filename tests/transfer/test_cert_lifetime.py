"""`rq recv`'s certificate keeps its pin: it does not expire, and one that an older rq made with a
year's validity is used as it is past its date, never silently remade (a new key, a new pin, and
every sender holding the old --pin refused)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
from xfer_kit import Recv, send, summary

from transfer.credentials import load_identity


def _resign(cert_dir: Path, not_after: datetime.datetime) -> str:
    """Rewrites the certificate in `cert_dir` with the same key but other dates, as an older rq
    left it; returns its pin."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    from transfer.credentials import fingerprint

    key = serialization.load_pem_private_key((cert_dir / "recv-key.pem").read_bytes(), password=None)
    old = x509.load_pem_x509_certificate((cert_dir / "recv-cert.pem").read_bytes())
    cert = (
        x509.CertificateBuilder()
        .subject_name(old.subject)
        .issuer_name(old.issuer)
        .public_key(old.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_after - datetime.timedelta(days=365))
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())  # type: ignore[arg-type]
    )
    (cert_dir / "recv-cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return fingerprint(cert.public_bytes(serialization.Encoding.DER))


def test_a_new_certificate_does_not_expire(tmp_path: Path) -> None:
    from cryptography import x509

    ident = load_identity(tmp_path)
    cert = x509.load_pem_x509_certificate(ident.cert_pem)
    assert cert.not_valid_after_utc.year == 9999
    assert load_identity(tmp_path).fingerprint == ident.fingerprint


@pytest.mark.parametrize("days", [0.5, -30], ids=["expires-in-12h", "expired-a-month-ago"])
def test_a_certificate_near_or_past_its_date_keeps_its_pin(tmp_path: Path, days: float) -> None:
    load_identity(tmp_path)
    pin = _resign(tmp_path, datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=days))
    assert load_identity(tmp_path).fingerprint == pin


def test_a_key_that_does_not_match_its_certificate_is_remade(tmp_path: Path) -> None:
    first = load_identity(tmp_path)
    (tmp_path / "recv-key.pem").unlink()
    other = load_identity(tmp_path / "other")
    (tmp_path / "recv-key.pem").write_bytes(other.key_pem)  # a pair torn by a crash mid-write
    (tmp_path / "recv-key.pem").chmod(0o600)  # as rq writes it (a key others can read is refused)
    again = load_identity(tmp_path)
    assert again.fingerprint not in (first.fingerprint, other.fingerprint)


@pytest.mark.parametrize(("transport", "extra"), [("tcp", ("--tls",)), ("quic", ())])
def test_senders_with_the_old_pin_still_reach_a_receiver_whose_certificate_expired(
    tmp_path: Path, transport: str, extra: tuple[str, ...]
) -> None:
    cert_dir = tmp_path / "cert"
    load_identity(cert_dir)
    pin = _resign(cert_dir, datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=3))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(100_000))
    recv = Recv(tmp_path / "dst", cert_dir, transport, "--once", *extra).start()
    try:
        assert recv.pin == pin
        proc = send([src], recv)
    finally:
        recv.wait(30)
    assert proc.returncode == 0, proc.stderr.decode()
    assert summary(proc)["verified"] is True
