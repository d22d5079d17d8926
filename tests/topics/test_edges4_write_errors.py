"""Small files the topics library writes (a group's offset, a replay spec, topic.json) on a full
or read-only file system:

- write_atomic let the OSError of its fsync or write go out as it came, naming no file: `rq
  offsets reset` on a full disk said `rq: error: No space left on device` (which file?); a
  failed open or rename named the temp file (`groups/.g.json.14182.5f569073123d.tmp`), a name
  nobody asked for. Both now name the file being written.
- `rq replay --save-spec` found a directory it may not write in only after the replay: the
  records were out, the group committed, and the spec lost (exit 1). It is now refused before
  anything is read, written out or committed.

The failures are injected (os.fsync / os.open raising), so no root or full disk is needed."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from rqtest import popen_rq_with, run_rq

import topics.embedded.files as files
from rqcli.exitcodes import ExitCode
from topics.embedded.groups import GroupStore
from topics.errors import TopicError


def _no_space(_fd: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_names_the_file_being_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "groups").mkdir()
    monkeypatch.setattr(files.os, "fsync", _no_space)
    with pytest.raises(OSError) as caught:
        GroupStore(tmp_path).commit("g", 5)
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename == str(tmp_path / "groups" / "g.json")  # was None
    assert os.listdir(tmp_path / "groups") == []  # no temp file left behind


def test_a_read_only_file_system_names_the_file_not_its_temp_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "groups").mkdir()
    real_open = os.open

    def read_only(path: object, *args: object, **kw: object) -> int:
        if str(path).endswith(".tmp"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(files.os, "open", read_only)
    with pytest.raises(TopicError) as caught:
        GroupStore(tmp_path).commit("g", 5)
    line = str(caught.value)
    assert f"{tmp_path / 'groups' / 'g.json'}: read-only file system" in line, line
    assert ".tmp" not in line, line  # was '…/groups/.g.json.<pid>.<hex>.tmp: read-only file system'


_SPEC_DIR_READ_ONLY = """
import errno, os
real_open = os.open
def read_only(path, *args, **kw):
    if os.path.basename(str(path)).startswith(".s.json."):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
    return real_open(path, *args, **kw)
os.open = read_only
"""


def test_a_save_spec_rq_cannot_write_is_refused_before_the_replay(tmp_path: Path) -> None:
    env = {"RQ_TOPICS_DIR": str(tmp_path / "t")}
    assert run_rq("produce", "ev", input=b"a\nb\nc\n", env=env).returncode == 0
    spec = tmp_path / "s.json"
    proc = popen_rq_with(
        _SPEC_DIR_READ_ONLY,
        "replay", "ev", "--group", "g", "--commit", "--format", "raw", "--save-spec", str(spec),
        env=env,
    )  # fmt: skip
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.FAILURE, err  # a read-only file system, as for a topic
    assert err.decode().strip() == (
        f"rq: error: cannot write the replay spec {spec}: read-only file system; name another path"
    ), err
    assert out == b""  # old code: a\nb\nc\n written out, then the spec failed
    offsets = run_rq("--json", "offsets", "ev", env=env)
    assert b'"g"' not in offsets.stdout, offsets.stdout  # old code: group g committed at 3
    assert not spec.exists()
    assert json.loads(offsets.stdout.splitlines()[0])  # the topic is still read fine
