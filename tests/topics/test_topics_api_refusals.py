"""The topics library refuses, with its own error types, what it cannot store or read back."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rqtest import rq_command, run_rq
from test_jetstream import make_stream, publish


def _js_source(nats_url: str, stream: str) -> Any:
    from topics.sources.jetstream import JetStreamSource
    from topics.sources.open import parse_topic

    return JetStreamSource(parse_topic(f"{nats_url}/{stream}", Path("/nonexistent")))


def test_an_embedded_group_refuses_a_negative_offset(tmp_path: Path) -> None:
    # -3 was stored, and `rq replay --group` then warned that the group's records had aged out
    from topics.embedded.groups import GroupStore
    from topics.errors import SpecError

    store = GroupStore(tmp_path)
    with pytest.raises(SpecError, match="offsets start at 0"):
        store.commit("trainer", -3)
    assert store.committed("trainer") is None
    store.commit("trainer", 0)
    assert store.committed("trainer") == 0


@pytest.mark.integration
def test_a_jetstream_group_refuses_a_negative_offset_or_one_past_the_end(
    nats_url: str, stream_name: str
) -> None:
    from topics.errors import SpecError

    make_stream(nats_url, stream_name)
    publish(nats_url, f"{stream_name}.a", [b"%d" % i for i in range(3)])
    src = _js_source(nats_url, stream_name)
    try:
        with pytest.raises(SpecError, match="offsets start at 0"):
            src.commit("g", -3)
        with pytest.raises(SpecError, match="the stream ends at 4"):
            src.commit("g", 6)
        assert src.committed("g") is None
        src.commit("g", 4)  # the end: every record read
        assert src.committed("g") == 4
        src.commit("g", 2)
        assert src.committed("g") == 2
    finally:
        src.close()


def test_an_embedded_append_refuses_a_header_with_an_empty_name(tmp_path: Path) -> None:
    # stored, `rq tail --format json | rq produce --format json` could not copy it back in
    from topics.embedded.log import LogWriter, TopicLog
    from topics.errors import SpecError

    topic = tmp_path / "t"
    with LogWriter(topic) as w:
        w.append([(None, None, (("a", b"1"),), b"first")])
        with pytest.raises(SpecError, match="empty name"):
            w.append([(None, None, (("b", b"2"),), b"ok"), (None, None, (("", b"x"),), b"bad")])
        w.append([(None, None, (), b"after")])
    assert [r[4] for batch in TopicLog(topic).reader(0, None) for r in batch] == [b"first", b"after"]


@pytest.mark.integration
def test_a_jetstream_append_refuses_a_header_with_an_empty_name(nats_url: str, stream_name: str) -> None:
    from topics.errors import SpecError
    from topics.sources.open import open_sink, parse_topic

    make_stream(nats_url, stream_name)
    sink = open_sink(parse_topic(f"{nats_url}/{stream_name}/{stream_name}.a", Path("/nonexistent")))
    try:
        with pytest.raises(SpecError, match="empty name"):
            sink.append([(None, None, (("", b"x"),), b"bad")])
    finally:
        sink.close()


@pytest.mark.parametrize("where", ["file", "proc"])
def test_a_topic_path_that_cannot_be_a_directory_is_a_topic_error(tmp_path: Path, where: str) -> None:
    # these were a raw NotADirectoryError / FileNotFoundError (rq produce: exit 1 "Not a directory")
    from topics.embedded.log import LogWriter
    from topics.errors import SpecError

    (tmp_path / "afile").write_bytes(b"x")
    path = tmp_path / "afile" / "t" if where == "file" else Path("/proc/no-such-pid/t")
    with pytest.raises(SpecError, match="cannot make topic"):
        LogWriter(path)


def test_a_replay_spec_that_is_a_directory_is_a_spec_error(tmp_path: Path) -> None:
    from topics.errors import SpecError
    from topics.savedspec import ReplaySpec

    with pytest.raises(SpecError, match="is a directory"):
        ReplaySpec.load(tmp_path)


def test_produce_into_a_path_through_a_file_is_exit_2_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "afile").write_bytes(b"x")
    res = run_rq("produce", str(tmp_path / "afile" / "t"), input=b"x\n")
    assert res.returncode == 2, res.stderr
    err = res.stderr.decode()
    assert "cannot make topic" in err and len(err.strip().splitlines()) == 1


@contextlib.contextmanager
def _unwritable(directory: Path) -> Iterator[None]:
    """A directory this process may not write in, also as root (whom mode bits do not stop): an
    immutable flag then (chattr +i, EPERM), else mode 0555 (EACCES); skipped where neither holds."""
    directory.mkdir(exist_ok=True)
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True, check=False).returncode != 0:
        pytest.skip("running as root and chattr +i does not work here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


def test_a_topic_rq_may_not_write_is_permission_denied_in_one_line(tmp_path: Path) -> None:
    # a raw PermissionError came out of LogWriter (and GroupStore.commit), with its traceback
    from topics.embedded.groups import GroupStore
    from topics.embedded.log import LogWriter
    from topics.errors import AccessDenied, PermissionDenied

    with LogWriter(tmp_path / "t") as w:
        w.append([(None, None, (), b"x")])
    with _unwritable(tmp_path / "locked"):
        with pytest.raises(
            PermissionDenied, match=r"cannot write topic .*locked/t: .*; run as a user"
        ) as caught:
            LogWriter(tmp_path / "locked" / "t")
        assert isinstance(caught.value, AccessDenied) and "\n" not in str(caught.value)
    with (
        _unwritable(tmp_path / "t" / "groups"),
        pytest.raises(PermissionDenied, match="the offset of group g"),
    ):
        GroupStore(tmp_path / "t").commit("g", 1)
    assert GroupStore(tmp_path / "t").committed("g") is None


def _without_root_rights() -> list[str]:
    """A command prefix that takes root's file-permission override away (so mode bits apply)."""
    if os.geteuid() != 0:
        return []
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner,-linux_immutable"]
    if shutil.which("setpriv") is None or subprocess.run([*drop, "true"], check=False).returncode != 0:
        pytest.skip("running as root and setpriv cannot drop the file-permission capabilities")
    return drop


def test_produce_into_a_directory_rq_may_not_write_is_exit_4_in_one_line(tmp_path: Path) -> None:
    """EACCES: exit 4 (a permission refused, as for a server's), one line naming the path."""
    prefix = _without_root_rights()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    res = subprocess.run(
        [*prefix, *rq_command(), "produce", str(locked / "t")],
        input=b"x\n",
        capture_output=True,
        env={**os.environ, "CI": "1"},
        timeout=60,
        check=False,
    )
    err = res.stderr.decode()
    assert res.returncode == 4, err
    assert len(err.strip().splitlines()) == 1 and f"cannot write topic {locked}/t" in err, err
    assert "Permission denied" in err and not (locked / "t").exists(), err


@pytest.mark.integration
def test_a_closed_jetstream_source_says_so_without_a_warning(nats_url: str, stream_name: str) -> None:
    """end_offset() after close() said 'lost the connection' (SourceUnreachable: exit 6, as if the
    server had gone) and left a coroutine never awaited (RuntimeWarning); a second close() too."""
    from topics.errors import SourceUnreachable, TopicError

    make_stream(nats_url, stream_name)
    publish(nats_url, f"{stream_name}.a", [b"x"])
    src = _js_source(nats_url, stream_name)
    assert src.end_offset() == 2
    gc.collect()  # garbage of earlier tests in this process (a worker runs many) warns elsewhere
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        src.close()
        for call in (
            src.end_offset,
            src.first_offset,
            lambda: src.commit("g", 1),
            lambda: list(src.read(1, 2, False)),
        ):
            with pytest.raises(TopicError, match="was closed by close") as refused:
                call()
            assert not isinstance(refused.value, SourceUnreachable)
        src.close()  # again: nothing
        gc.collect()  # an unawaited coroutine warns when it is collected
    # what this source leaves: a coroutine never awaited (RuntimeWarning) or an unclosed resource of
    # its own; another test's object collected meanwhile (a QUIC test's UDP transport) is not ours
    assert [str(w.message) for w in caught if "Datagram" not in str(w.message)] == []
