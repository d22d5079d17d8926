"""The CRT's callback threads keep one Python thread state (cache.s3.keep_thread_state), against the real SeaweedFS."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from cache.s3 import S3, S3Settings

OBJECTS = 12


def test_a_crt_thread_keeps_its_thread_local_state_between_objects(
    aws_env: dict[str, str], s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    # a foreign thread that got a fresh Python thread state per callback would lose its
    # threading.local() data (and CPython's frame stack with it) after every object
    for i in range(OBJECTS):
        s3_client.put_object(Bucket=bucket, Key=f"k/{i}", Body=b"x" * 1000)
    client = S3(S3Settings(endpoint_url=s3_client.meta.endpoint_url))
    local = threading.local()
    seen: list[tuple[int, bool]] = []  # (thread, whether this thread had been here before)
    done = threading.Semaphore(0)
    errors: list[BaseException] = []

    def on_headers(headers: list[tuple[str, str]]) -> None:
        seen.append((threading.get_ident(), getattr(local, "been_here", False)))
        local.been_here = True

    def on_done(err: BaseException | None) -> None:
        if err is not None:
            errors.append(err)
        done.release()

    for i in range(OBJECTS):  # one at a time: every callback runs on the client's event loop thread
        client.get(
            bucket, f"k/{i}", on_headers=on_headers, on_done=on_done, recv_filepath=str(tmp_path / str(i))
        )
        assert done.acquire(timeout=30)
    assert not errors
    assert len(seen) == OBJECTS
    first_seen: set[int] = set()
    for ident, been_here in seen:
        assert been_here == (ident in first_seen), "a CRT thread lost its Python thread state"
        first_seen.add(ident)
    assert all((tmp_path / str(i)).read_bytes() == b"x" * 1000 for i in range(OBJECTS))


def test_the_interpreter_exits_cleanly_with_kept_thread_states(
    aws_env: dict[str, str], s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    """Normal interpreter shutdown (not rq's os._exit) while the CRT threads hold kept states."""
    s3_client.put_object(Bucket=bucket, Key="k", Body=b"y" * 100)
    script = f"""
import threading
from cache.s3 import S3, S3Settings
client = S3(S3Settings(endpoint_url={s3_client.meta.endpoint_url!r}))
done = threading.Event()
for i in range(3):
    done.clear()
    client.get({bucket!r}, "k", on_headers=lambda h: None, on_done=lambda e: done.set(),
               recv_filepath={str(tmp_path)!r} + f"/{{i}}")
    assert done.wait(30)
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **aws_env},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
