"""A slow but healthy link is not a stalled receiver, with either QUIC library.

The link is a veth pair into a network namespace whose outer end is shaped by tbf (the kernel here
may lack sch_netem; tbf is enough to make a link slow). At 16 Mbit/s a 4 MiB chunk on each of two
streams takes about 4 s to arrive, longer than the `--timeout` given, so only the bytes moving on
the wire can tell the sender that the receiver is alive."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from rqtest import VethLink, veth_namespace
from xfer_kit import quic_recv_in_namespace, send, summary

pytestmark = [pytest.mark.integration, pytest.mark.netns]

RATE = "16mbit"


@pytest.fixture
def slow_link() -> Iterator[VethLink]:
    with veth_namespace("rqs") as link:
        shape = ["tc", "qdisc", "add", "dev", link.outer, "root", "tbf", "rate", RATE]
        done = subprocess.run([*shape, "burst", "32kb", "latency", "400ms"], capture_output=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"tc tbf unavailable: {done.stderr.decode().strip()}")
        yield link


@pytest.mark.parametrize("backend", ["qh3", "aioquic"])
def test_slow_link_outlasting_the_timeout_per_chunk_completes(
    tmp_path: Path, slow_link: VethLink, backend: str
) -> None:
    if backend == "qh3":
        pytest.importorskip("qh3")
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(12 << 20))
    recv = quic_recv_in_namespace(tmp_path, slow_link.ns, slow_link.there, backend)
    try:
        proc = send([src], recv, "--quic-backend", backend, "--timeout", "2", "--retry-for", "20", timeout=90)
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        recv.stop()
    done = summary(proc)
    # one connection from start to end: a dropped one would be retried and still complete
    assert done["attempts"] == 1, done
    assert done["complete"] is True and done["verified"] is True
    got = hashlib.sha256((tmp_path / "dst" / "model.bin").read_bytes()).hexdigest()
    assert got == hashlib.sha256(src.read_bytes()).hexdigest()
