"""th: a JetStream sink or source shared by threads. Two threads appending through one sink shared
its Publisher's wire and answers: 28 appends in 3 s were told overlapping sequences, then both
failed with a false ConnectionLost for records the stream had stored (1005 stored, 995
acknowledged). Steps of a shared source ran two at once on its one loop: RuntimeError "This event
loop is already running". Appends and steps are now taken one at a time."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from jskit import made_streams

from topics.sources.open import open_sink, open_source, parse_topic

THREADS = 3
APPENDS = 40


def _in_threads(work: Any) -> list[BaseException]:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_one_sink_appending_from_threads(nats_url: str, tmp_path: Path) -> None:
    with made_streams(nats_url, "lead-threads") as make:
        name = make()
        ref = parse_topic(f"{nats_url}/{name}/{name}.x", tmp_path)
        sink = open_sink(ref)
        ranges: list[tuple[int, int]] = []

        def append(i: int) -> None:
            for n in range(APPENDS):
                done = sink.append([(None, None, (), b"%d-%d-%d" % (i, n, k)) for k in range(5)])
                assert done.first is not None and done.last is not None
                ranges.append((done.first, done.last))

        try:
            errors = _in_threads(append)
        finally:
            sink.close()
        assert errors == []  # (old: ConnectionLost "no answer from the NATS server ...")
        seqs = sorted(s for first, last in ranges for s in range(first, last + 1))
        assert seqs == list(range(1, THREADS * APPENDS * 5 + 1))  # each told its own, none twice
        source = open_source(ref)
        try:
            assert source.end_offset() == THREADS * APPENDS * 5 + 1
        finally:
            source.close()


def test_one_source_asked_from_threads(nats_url: str, tmp_path: Path) -> None:
    with made_streams(nats_url, "lead-threads") as make:
        name = make()
        ref = parse_topic(f"{nats_url}/{name}/{name}.x", tmp_path)
        sink = open_sink(ref)
        sink.append([(None, None, (), b"x")] * 10)
        sink.close()
        source = open_source(ref)

        def ask(i: int) -> None:
            for n in range(30):
                assert source.end_offset() == 11 and source.first_offset() == 1
                source.commit(f"g{i}", 1 + n % 10)
                assert source.committed(f"g{i}") == 1 + n % 10

        try:
            errors = _in_threads(ask)  # (old: RuntimeError "This event loop is already running")
        finally:
            source.close()
        assert errors == []
