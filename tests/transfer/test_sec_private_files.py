"""Transfer secrets and state are used only when no other user could have read or put them (as ssh's
StrictModes): a token file or private key another user owns or others can read, a certificate
directory or DEST/.rq-partial another user owns or others can write, are refused; what rq makes
(the token file, the certificate, the directories above them) is private whatever the umask; and the
key is never written through a link planted at its temporary name."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from rqtest import run_rq

from rqcli.exitcodes import ExitCode
from transfer.credentials import load_identity, load_token
from transfer.errors import AuthError, UnsafeNameError
from transfer.store import Store

OTHER_UID = 4242  # a uid that is not ours (os.chown to it needs root)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _token_file(tmp_path: Path, mode: int = 0o600) -> Path:
    token = tmp_path / "tok"
    token.write_text("a-token-for-this-test\n")
    token.chmod(mode)
    return token


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token = _token_file(tmp_path, 0o644)
    with pytest.raises(AuthError, match=r"mode 0644.*chmod 600"):
        load_token(token, None, create=True)
    token.chmod(0o600)
    assert load_token(token, None, create=False) == b"a-token-for-this-test"


def test_rq_recv_refuses_a_token_file_others_can_read_with_exit_4(tmp_path: Path) -> None:
    token = _token_file(tmp_path, 0o640)
    res = run_rq(
        "recv",
        str(tmp_path / "dest"),
        "--listen",
        "127.0.0.1:0",
        "--transport",
        "tcp",
        "--token-file",
        str(token),
        "--cert-dir",
        str(tmp_path / "cert"),
        timeout=60,
    )
    assert res.returncode == ExitCode.AUTH, res.stderr
    assert f"token file {token} can be read or written by group or others (mode 0640)".encode() in res.stderr
    assert b"--pin" not in res.stderr, res.stderr  # the line's own fix, not the wrong-token hint
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "dest").exists()


@needs_root
def test_a_token_file_of_another_user_is_refused(tmp_path: Path) -> None:
    token = _token_file(tmp_path)
    os.chown(token, OTHER_UID, OTHER_UID)
    with pytest.raises(AuthError, match=f"belongs to uid {OTHER_UID}"):
        load_token(token, None, create=False)


def test_a_token_file_in_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    token = _token_file(shared)
    shared.chmod(0o777)  # anyone may rename the token file away and put theirs
    with pytest.raises(
        AuthError, match=r"is in .*shared, which can be written by group or others \(mode 0777\)"
    ):
        load_token(token, None, create=False)
    shared.chmod(0o1777)  # sticky, as /tmp: others cannot replace what is ours
    assert load_token(token, None, create=False) == b"a-token-for-this-test"


def test_a_certificate_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    cert_dir = tmp_path / "cert"
    pin = load_identity(cert_dir).fingerprint
    cert_dir.chmod(0o777)
    with pytest.raises(AuthError, match=r"certificate directory .*cert can be written by group or others"):
        load_identity(cert_dir)
    cert_dir.chmod(0o700)
    assert load_identity(cert_dir).fingerprint == pin


def test_a_private_key_others_can_read_is_refused(tmp_path: Path) -> None:
    cert_dir = tmp_path / "cert"
    load_identity(cert_dir)
    (cert_dir / "recv-key.pem").chmod(0o644)
    with pytest.raises(
        AuthError, match=r"private key .*recv-key.pem can be read or written .* \(mode 0644\)"
    ):
        load_identity(cert_dir)


@needs_root
def test_a_certificate_directory_or_key_of_another_user_is_refused(tmp_path: Path) -> None:
    """The reviewer's case: another user's directory holding a key they made; the pin printed was
    theirs."""
    cert_dir = tmp_path / "cert"
    load_identity(cert_dir)
    os.chown(cert_dir / "recv-key.pem", OTHER_UID, OTHER_UID)
    with pytest.raises(AuthError, match=f"private key .* belongs to uid {OTHER_UID}"):
        load_identity(cert_dir)
    os.chown(cert_dir / "recv-key.pem", 0, 0)
    os.chown(cert_dir, OTHER_UID, OTHER_UID)
    with pytest.raises(AuthError, match=f"certificate directory .* belongs to uid {OTHER_UID}"):
        load_identity(cert_dir)


def test_the_key_is_not_written_through_a_link_at_its_temporary_name(tmp_path: Path) -> None:
    cert_dir = tmp_path / "cert"
    cert_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    (cert_dir / f"recv-key.tmp{os.getpid()}").symlink_to(victim)
    identity = load_identity(cert_dir)
    assert victim.read_bytes() == b"precious\n"  # was truncated and held the private key
    assert (cert_dir / "recv-key.pem").read_bytes() == identity.key_pem
    assert not os.path.lexists(cert_dir / f"recv-key.tmp{os.getpid()}")


def test_under_umask_000_what_rq_makes_is_private(tmp_path: Path, umask_000: None) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    load_token(home / ".config" / "rq" / "transfer-token", None, create=True)
    load_identity(home / ".local" / "share" / "rq" / "transfer")
    made = {
        p: _mode(home / p)
        for p in (
            ".config",
            ".config/rq",
            ".local",
            ".local/share",
            ".local/share/rq",
            ".local/share/rq/transfer",
        )
    }
    assert made == dict.fromkeys(made, 0o700)  # each was 0777
    assert _mode(home / ".config/rq/transfer-token") == 0o600
    assert _mode(home / ".local/share/rq/transfer/recv-key.pem") == 0o600
    assert _mode(home) == 0o755  # one that was there is left as it was


def test_a_token_directory_an_older_rq_left_open_is_refused(tmp_path: Path) -> None:
    """An rq before this one made ~/.config/rq 0777 under umask 000: a co-tenant could replace the
    token file in it. Refused, with the chmod that fixes it."""
    conf = tmp_path / "config" / "rq"
    conf.mkdir(parents=True)
    conf.chmod(0o777)
    with pytest.raises(AuthError, match=f"chmod go-w {conf}"):
        load_token(conf / "transfer-token", None, create=True)
    assert not (conf / "transfer-token").exists()


def test_a_state_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / ".rq-partial").mkdir(parents=True)
    (dest / ".rq-partial").chmod(0o777)
    with pytest.raises(
        UnsafeNameError, match=r"\.rq-partial can be written by group or others \(mode 0777\)"
    ):
        Store(dest)
    (dest / ".rq-partial").chmod(0o700)
    Store(dest).close()


@needs_root
def test_a_state_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / ".rq-partial").mkdir(parents=True, mode=0o700)
    os.chown(dest / ".rq-partial", OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeNameError, match=f"belongs to uid {OTHER_UID}"):
        Store(dest)


def test_a_token_file_under_a_file_is_one_auth_line(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("not a directory")
    token = tmp_path / "f" / "tok"
    with pytest.raises(
        AuthError, match=f"token file {token} is in {tmp_path / 'f'}, which is not a directory"
    ):
        load_token(
            token, None, create=False
        )  # was a bare NotADirectoryError: rq send exit 1, no mention of it
