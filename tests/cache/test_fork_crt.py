"""Forked DataLoader-style workers of a parent that used S3 (its CRT client has native threads).

A training process has many threads when its DataLoader forks workers (pin-memory, logging, the
test runner's own under pytest-xdist). glibc hands their stacks to the child's new threads, and a
child that freed the parent's CRT client ran its teardown there: every child died of SIGSEGV.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cachekit import seed_objects

import cache.tls

REPO = Path(__file__).resolve().parents[2]

# The parent: uses S3 through a Cache, keeps idle threads, forks `kids` workers per round that each
# open objects (a miss and a revalidated hit) and exit, by sys.exit (the interpreter's exit) or
# os._exit (as multiprocessing's workers do); then a fork Pool as a DataLoader makes one. Prints
# the children's exit statuses; it stops at the first round with a bad one.
PARENT = r"""
import json, multiprocessing, os, signal, sys, threading
from cache import Cache

bucket, root, rounds, kids = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
urls = [f"s3://{bucket}/f/{i:05d}.bin" for i in range(6)]
cache = Cache(root + "/c", ram_dir=root + "/ram", max_age=0)
with cache.open(urls[0]) as fh:
    fh.read()
idle = threading.Event()
for _ in range(8):
    threading.Thread(target=idle.wait, daemon=True).start()

def work(k):
    signal.alarm(30)  # a hung child ends (SIGALRM) rather than the test
    for url in (urls[k % len(urls)], urls[0]):
        with cache.open(url) as fh:
            fh.read()
    return True

codes = {}
for r in range(rounds):
    pids = []
    for k in range(kids):
        pid = os.fork()
        if pid == 0:
            work(k)
            if r % 2:
                os._exit(0)
            sys.exit(0)
        pids.append(pid)
    for pid in pids:
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        codes[code] = codes.get(code, 0) + 1
    if set(codes) != {0}:
        break
else:
    with multiprocessing.get_context("fork").Pool(3) as pool:
        try:
            codes["pool"] = all(pool.map_async(work, range(6)).get(60))
        except multiprocessing.TimeoutError:  # a worker died in the middle of its task
            codes["pool"] = "hung"
idle.set()
print(json.dumps(codes))
"""


def test_forked_workers_of_a_busy_parent_open_s3_objects_and_exit_cleanly(
    s3_client: Any, bucket: str, aws_env: dict[str, str], tmp_path: Path
) -> None:
    seed_objects(s3_client, bucket, "f/", 6, 16 * 1024)
    env = {**os.environ, **aws_env, "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PARENT, bucket, str(tmp_path), "4", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # exit codes as JSON keys: every child 0 (-11 was SIGSEGV), and the pool's workers all done
    assert json.loads(out.stdout.splitlines()[-1]) == {"0": 12, "pool": True}, out.stderr[-3000:]
    assert "Segmentation fault" not in out.stderr


def test_a_forked_child_leaves_the_parents_tls_probe_alone() -> None:
    """At exit a child stopped the probes it inherited: it shut down the socket it shares with
    the parent, which cut the parent's handshake short (and could wait on a parent's lock).
    The parent's own stop() cuts it short: it shut down a detached socket, i.e. nothing, and
    waited out the handshake."""
    server = socket.create_server(("127.0.0.1", 0))  # accepts, and never answers the handshake
    port = server.getsockname()[1]
    # a handshake timeout far longer than the test: only a stop (the child's or ours) can end it
    probe = cache.tls.TlsCheck("127.0.0.1", port, None, f"https://127.0.0.1:{port}", 120.0)
    conn, _ = server.accept()
    try:
        deadline = time.monotonic() + 30
        while probe._sock is None:  # in the handshake now
            assert time.monotonic() < deadline, "the probe never reached its handshake"
            time.sleep(0.01)
        pid = os.fork()
        if pid == 0:
            try:
                cache.tls._stop_probes()  # what the child's interpreter runs at exit (atexit)
            finally:
                os._exit(0)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        time.sleep(0.2)
        assert probe._thread.is_alive(), "the child ended the parent's handshake"
        probe.stop(30.0)  # (returns as soon as the thread left; waiting out the handshake: 120 s)
        assert not probe._thread.is_alive(), "stop() left the handshake waiting"
    finally:
        probe.stop(30.0)
        conn.close()
        server.close()
