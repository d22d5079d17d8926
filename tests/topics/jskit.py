"""JetStream streams made for one test on a real nats-server (the lead's, or one a test starts),
deleted after it; and the --to-topic follow copy the self-feed guard tests drive."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rqtest import freeze as freeze
from rqtest import js_call, run_rq

MakeStream = Callable[..., str]


@contextmanager
def made_streams(nats_url: str, prefix: str) -> Iterator[MakeStream]:
    """Yields make(subjects=None, **config): adds a stream named PREFIX-<random> with `subjects`
    (each formatted with name=the stream's name; default ["{name}.x"]) and the other StreamConfig
    fields given, and returns its name. Every stream made is deleted at the end, those that
    source others first."""
    made: list[str] = []

    def make(subjects: list[str] | None = None, **config: Any) -> str:
        from nats.js.api import StreamConfig

        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        taken = [s.format(name=name) for s in (["{name}.x"] if subjects is None else subjects)]

        async def add(js: Any) -> None:
            await js.add_stream(StreamConfig(name=name, subjects=taken or None, **config))

        js_call(nats_url, add)
        made.append(name)
        return name

    try:
        yield make
    finally:

        async def drop(js: Any) -> None:
            for name in reversed(made):
                try:
                    await js.delete_stream(name)
                except Exception:
                    pass

        js_call(nats_url, drop)


def follow_copy(source: str, target: str, tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    """A follow copying `source` into `target`; a loop ends at --count 20, else the quiet ends it."""
    return run_rq(
        "replay", source, "--from", "start", "-f", "--to-topic", target, "--count", "20", "--timeout", "2",
        "-q", env={"RQ_TOPICS_DIR": str(tmp_path)}, timeout=30,
    )  # fmt: skip


def refused_as_loop(r: subprocess.CompletedProcess[bytes]) -> bool:
    err = r.stderr.decode()
    return r.returncode == 2 and "feeds what is being followed back into it" in err and err.count("\n") == 1


def values(url: str) -> list[bytes]:
    r = run_rq("replay", url, "--from", "start", "--format", "raw")
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def republish(nats_url: str, name: str, src: str, dest: str, headers_only: bool = False) -> None:
    """Gives stream `name` a republish of `src` to `dest` (added after the stream: its subjects hold
    its name), as the user in `nats_url`."""
    from nats.js.api import RePublish

    async def update(js: Any) -> None:
        info = await js.stream_info(name)
        await js.update_stream(
            info.config.evolve(republish=RePublish(src=src, dest=dest, headers_only=headers_only or None))
        )

    js_call(nats_url, update)


def produce(url: str, data: bytes) -> None:
    r = run_rq("produce", url, input=data)
    assert r.returncode == 0, r.stderr


def wait_for_port(port: int) -> None:
    """Until something listens on 127.0.0.1:port (a server just started), 10 s at most."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@contextmanager
def own_nats_server(store: Path, ports: range, config: str = "", jetstream: bool = True) -> Iterator[str]:
    """A nats-server of the test's own (with JetStream, stored under `store`, unless told) on the
    first free port of `ports` (the caller's range); `config` is more of its config file (accounts,
    ...). Yields nats://127.0.0.1:PORT."""
    with own_nats_process(store, ports, config, jetstream) as (url, _proc):
        yield url


@contextmanager
def own_nats_process(
    store: Path, ports: range, config: str = "", jetstream: bool = True
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """own_nats_server, yielding its process too (to stop, freeze or kill it); a frozen one
    (SIGSTOP) is let go on at the end before it is stopped."""
    binary = shutil.which("nats-server") or str(Path(__file__).parents[2] / ".venv/bin/nats-server")
    port = next(p for p in ports if _free(p))
    conf = store / "nats.conf"
    js = f'jetstream {{ store_dir: "{store / "js"}" }}\n' if jetstream else ""
    conf.write_text(f"listen: 127.0.0.1:{port}\n{js}{config}")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield f"nats://127.0.0.1:{port}", proc
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)
