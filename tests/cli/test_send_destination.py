"""`rq send`'s last argument is the destination: a bare word or a local path there is a usage error
(exit 2, one line), not a host to try on the default port for a minute and then "re-run" (exit 6)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rqtest import run_rq

ENV = {"RQ_TOKEN": "t", "RQ_SEND_RETRY_FOR": "0"}


@pytest.mark.parametrize(
    "dest,says",
    [
        ("b.txt", "is a local path"),  # `rq send a.bin b.txt`: the destination forgotten
        ("ckpt", "must look like rq://HOST:PORT"),  # a bare word (no such file)
        ("src/ckpt/b.txt", "must look like rq://HOST:PORT"),
        ("rq://127.0.0.1:9/some/dir", "has a path"),  # was: the path silently dropped
        ("http://127.0.0.1:9", "must look like rq://HOST:PORT"),
        ("rq:///127.0.0.1:9", "has a path"),  # was: 127.0.0.1:7420
        ("rq://127.0.0.1:0", "port 0"),  # was: retried for the whole --retry-for, exit 6
        ("rq://me@127.0.0.1:9", "names a user"),  # was: a DNS error, exit 6
        ("rq://127.0.0.1:9?x=1", "only thing an rq URL may carry"),  # was: ignored
        (f"rq://127.0.0.1:9?pin=sha256:{'a' * 64}", "differ"),  # --pin below says otherwise
        ("rq://", "names no host"),  # `rq://$HOST:7420`, HOST unset: was a send to 127.0.0.1:7420
        ("rq://:9", "names no host"),  # was: 127.0.0.1:9
        (":9", "names no host"),
        ("rq://[]:9", "is not a URL"),  # was: "unexpected ValueError", exit 1
        ("rq://[::1", "is not a URL"),
        ("rq://127.0.0.1:9#x", "#fragment"),  # was: "has a path"
    ],
)
def test_a_destination_that_is_no_rq_url_is_a_usage_error(
    tmp_path: Path, dest: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.bin").write_bytes(b"x")
    (tmp_path / "b.txt").write_bytes(b"y")
    out = run_rq(
        "send", "a.bin", dest, "--transport", "tcp", "--pin", f"sha256:{'b' * 64}", env=ENV, timeout=30
    )
    assert out.returncode == 2, out.stderr
    lines = [x for x in out.stderr.decode().splitlines() if x.strip()]
    assert len(lines) == 1 and says in lines[0], out.stderr


@pytest.mark.parametrize("dest", ["127.0.0.1:9", "RQ://127.0.0.1:9", "rq://127.0.0.1:9/"])
def test_host_port_forms_are_still_accepted(
    tmp_path: Path, dest: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.bin").write_bytes(b"x")
    out = run_rq("send", "a.bin", dest, "--transport", "tcp", env=ENV, timeout=60)
    # nothing listens on port 9: unreachable (6), which means the destination itself was understood
    assert out.returncode == 6, out.stderr


def test_a_listen_port_alone_says_how_to_write_it(tmp_path: Path) -> None:
    out = run_rq("recv", str(tmp_path / "d"), "--listen", "20515", env=ENV, timeout=30)
    assert out.returncode == 2 and b"127.0.0.1:20515" in out.stderr, out.stderr
    assert not (tmp_path / "d").exists()
