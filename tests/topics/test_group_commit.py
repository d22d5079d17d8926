"""Storing a JetStream consumer group's position never loses it (real nats-server).

A commit used to delete the durable consumer and add it back: a process killed in between left no
group at all, and the next `rq replay --group` started over from the stream's start; two commits at
once ended in `ServerError ... start sequence can not be updated` (exit 1).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from rqtest import js_call
from test_jetstream import make_stream, publish

pytestmark = pytest.mark.integration


class Killed(BaseException):
    """Stands for SIGKILL at one point of a commit: nothing after it runs, no cleanup either."""


def _source(nats_url: str, stream: str) -> Any:
    from topics.sources.jetstream import JetStreamSource
    from topics.sources.open import parse_topic

    return JetStreamSource(parse_topic(f"{nats_url}/{stream}", Path("/nonexistent")))


def _group_at(nats_url: str, stream: str, group: str, start: int) -> None:
    """A group made by an earlier rq (or an application): bound to a start sequence."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    cfg = ConsumerConfig(
        durable_name=group,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=start,
    )
    js_call(nats_url, lambda js: js.add_consumer(stream, cfg))


def _committed(nats_url: str, stream: str, group: str) -> int | None:
    src = _source(nats_url, stream)
    try:
        return src.committed(group)
    finally:
        src.close()


@pytest.mark.parametrize("target", [7, 3], ids=["forward", "below-its-start"])
def test_a_commit_killed_after_the_group_is_deleted_keeps_a_position(
    nats_url: str, stream_name: str, target: int
) -> None:
    make_stream(nats_url, stream_name)
    publish(nats_url, f"{stream_name}.a", [b"%d" % i for i in range(10)])
    _group_at(nats_url, stream_name, "kg", 5)
    src = _source(nats_url, stream_name)
    deleted: list[str] = []
    real_delete, real_add = src.conn.js.delete_consumer, src.conn.js.add_consumer

    async def delete(stream: str, name: str, *a: Any, **kw: Any) -> Any:
        result = await real_delete(stream, name, *a, **kw)
        deleted.append(name)
        return result

    async def add(stream: str, config: Any = None, *a: Any, **kw: Any) -> Any:
        if config is not None and config.durable_name == "kg" and "kg" in deleted:
            raise Killed  # the process dies with the group deleted and not yet added back
        return await real_add(stream, config, *a, **kw)

    src.conn.js.delete_consumer, src.conn.js.add_consumer = delete, add
    try:
        with pytest.raises(Killed):
            src.commit("kg", target)
            raise Killed  # the commit never needed to delete the group: as good as killed after it
    finally:
        src.conn.js.delete_consumer, src.conn.js.add_consumer = real_delete, real_add
        src.close()
    # The next run finds the group at the old position or at the new one, never gone.
    assert _committed(nats_url, stream_name, "kg") in (5, target)
    names = [i.name for i in js_call(nats_url, lambda js: js.consumers_info(stream_name))]
    assert names == ["kg"]  # the marker of the interrupted move is gone once it was used


def test_a_move_killed_before_it_deleted_the_group_keeps_the_old_position(
    nats_url: str, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import topics.sources.jetstream as jetstream

    make_stream(nats_url, stream_name)
    publish(nats_url, f"{stream_name}.a", [b"%d" % i for i in range(10)])
    _group_at(nats_url, stream_name, "kg", 5)

    def crash(where: str) -> None:
        if where == "marker written":
            raise Killed

    monkeypatch.setattr(jetstream, "_crash_point", crash)
    src = _source(nats_url, stream_name)
    with pytest.raises(Killed):
        src.commit("kg", 2)
    src.close()
    monkeypatch.undo()
    assert _committed(nats_url, stream_name, "kg") == 5
    # The stale marker is no group, and the next commit goes through.
    src = _source(nats_url, stream_name)
    assert src.groups() == ["kg"]
    src.commit("kg", 2)
    src.close()
    assert _committed(nats_url, stream_name, "kg") == 2
    names = [i.name for i in js_call(nats_url, lambda js: js.consumers_info(stream_name))]
    assert names == ["kg"]


def test_concurrent_commits_end_with_one_of_their_positions(nats_url: str, stream_name: str) -> None:
    make_stream(nats_url, stream_name)
    publish(nats_url, f"{stream_name}.a", [b"%d" % i for i in range(20)])
    # "high" is bound to a start above every target: each commit to it re-creates it.
    _group_at(nats_url, stream_name, "high", 15)
    sources = [_source(nats_url, stream_name) for _ in range(2)]
    try:
        for group in ("kg", "high"):
            for n in range(10):
                targets = (1 + n % 7, 8 + n % 5)
                start = threading.Barrier(2)
                errors: list[BaseException] = []

                threads = [
                    threading.Thread(target=_commit, args=(src, group, to, start, errors))
                    for src, to in zip(sources, targets, strict=True)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(60)
                assert not errors, (group, targets, errors)
                assert _committed(nats_url, stream_name, group) in targets
                if group == "high":
                    _group_at_again(nats_url, stream_name, group, 15)
    finally:
        for src in sources:
            src.close()
    names = sorted(i.name for i in js_call(nats_url, lambda js: js.consumers_info(stream_name)))
    assert names == ["high", "kg"]  # no marker left behind


def _commit(src: Any, group: str, to: int, start: threading.Barrier, errors: list[BaseException]) -> None:
    start.wait()
    try:
        src.commit(group, to)
    except BaseException as exc:
        errors.append(exc)


def _group_at_again(nats_url: str, stream: str, group: str, start: int) -> None:
    js_call(nats_url, lambda js: js.delete_consumer(stream, group))
    _group_at(nats_url, stream, group, start)
