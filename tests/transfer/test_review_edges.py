"""From the open items of earlier reviews (2026-11-24): what `rq -q recv` kept from a script, and
how a directory send treated names and refusals."""

from __future__ import annotations

import select
import subprocess
import sys
from pathlib import Path

from xfer_kit import REPO, rq_cmd, rq_env

from rqcli.exitcodes import ExitCode


def test_quiet_recv_still_prints_the_line_to_paste(tmp_path: Path) -> None:
    """With `--listen :0` that line is the only way a script learns the port; -q printed nothing."""
    env = rq_env()
    recv = subprocess.Popen(
        [sys.executable, "-m", "rqcli", "-q", "recv", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
         "--transport", "tcp", "--once", "--cert-dir", str(tmp_path / "cert")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO,
    )
    try:
        assert recv.stdout is not None
        ready, _, _ = select.select([recv.stdout], [], [], 30)
        assert ready, "rq -q recv printed nothing to learn its port from"
        line = recv.stdout.readline().decode()
        words = line.split()
        assert words[:3] == ["rq", "send", "SOURCE"] and words[3].startswith("rq://127.0.0.1:"), line
        assert not words[3].endswith(":0")
        (tmp_path / "f").write_bytes(b"payload")
        sent = subprocess.run(
            rq_cmd("send", str(tmp_path / "f"), *words[3:]), env=env, capture_output=True, timeout=60
        )
        assert sent.returncode == ExitCode.OK, sent.stderr
        out, err = recv.communicate(timeout=30)
        assert recv.returncode == ExitCode.OK, err
        assert out == b"" and err == b""  # nothing else: -q
        assert (tmp_path / "d" / "f").read_bytes() == b"payload"
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
