"""Without a device (or pyverbs) `--transport rdma` fails at once: one line, exit 10, says what to use."""

from __future__ import annotations

from pathlib import Path

import pytest
from rdma_probe import device_listed
from rqtest import run_rq

from rqcli.exitcodes import ExitCode

pytestmark = pytest.mark.skipif(device_listed(), reason="this machine has an RDMA device")


def _one_line_unsupported(stderr: bytes) -> str:
    lines = [ln for ln in stderr.decode().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    assert "RDMA" in lines[0] and "--transport tcp or quic" in lines[0]
    return lines[0]


def test_send_over_rdma_without_a_device(tmp_path: Path) -> None:
    src = tmp_path / "ckpt.bin"
    src.write_bytes(b"weights")
    out = run_rq(
        "send", str(src), "rq://127.0.0.1:9", "--transport", "rdma", "--pin", "sha256:" + "0" * 64,
        env={"RQ_TOKEN": "test-token"}, timeout=60,
    )  # fmt: skip
    assert out.returncode == ExitCode.UNSUPPORTED, out.stderr
    _one_line_unsupported(out.stderr)


def test_recv_over_rdma_without_a_device(tmp_path: Path) -> None:
    out = run_rq(
        "recv", str(tmp_path / "dest"), "--transport", "rdma", "--listen", "127.0.0.1:0", "--once",
        env={"RQ_TOKEN": "test-token"}, timeout=60,
    )  # fmt: skip
    assert out.returncode == ExitCode.UNSUPPORTED, out.stderr
    _one_line_unsupported(out.stderr)
    assert not (tmp_path / "dest" / ".rq-partial").exists()  # nothing was set up
