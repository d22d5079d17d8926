"""Pins on the wire format, the resume journal and name checks that mutation testing found loose:
each of these mutants passed every test before (a renumbered frame type, a CHUNK cap swapped with
the control cap, a dropped wire-version check, a journal append that no longer fsyncs, a leaked
descriptor per journal, the 4096-byte name limit moved by one)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from transfer import frames, journal, names
from transfer.errors import NameTooLongError, ProtocolError, UnsafeNameError
from transfer.frames import FrameDecoder, FrameType

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def test_frame_types_and_header_are_the_documented_wire() -> None:
    """Both ends share the enum, so a renumbering passes every round trip and breaks every older peer:
    the numbers are the table in docs/protocol.md."""
    rows = re.findall(r"^\| (\d+) \| ([A-Z]+) \|", DOC.read_text(), re.MULTILINE)
    assert rows, "docs/protocol.md's frame table not found"
    assert {t.name: t.value for t in FrameType} == {name: int(n) for n, name in rows}
    assert frames.WIRE_VERSION == 1
    assert frames.header(FrameType.HELLO, 3) == b"RQ\x01\x01\x00\x00\x00\x03"
    assert frames.CHUNK.size == 29  # "29-byte chunk header" in the table
    assert frames.PAIR.size == 8
    assert (frames.CONTROL_MAX, frames.PRE_AUTH_LIMIT) == (64 << 20, 64 << 10)


def test_chunk_frames_are_capped_by_the_chunk_size_and_control_frames_by_control_max() -> None:
    with pytest.raises(ProtocolError, match="CHUNK frame of 1025 bytes is over the 1024"):
        FrameDecoder(1024).feed(frames.header(FrameType.CHUNK, 1025))
    assert frames.parse_header(frames.header(FrameType.CHUNK, 1024), 1024) == (FrameType.CHUNK, 1024)
    # a manifest larger than the chunk size is fine up to CONTROL_MAX, and not past it
    assert frames.parse_header(frames.header(FrameType.MANIFEST, 2048), 1024) == (FrameType.MANIFEST, 2048)
    with pytest.raises(ProtocolError, match="MANIFEST frame"):
        frames.parse_header(frames.header(FrameType.MANIFEST, frames.CONTROL_MAX + 1), 1 << 40)
    with pytest.raises(ProtocolError, match="over the 65536"):
        frames.parse_header(frames.header(FrameType.HELLO, 65537), 1 << 20, frames.PRE_AUTH_LIMIT)


def test_another_wire_version_is_refused_by_name() -> None:
    with pytest.raises(ProtocolError, match="wire version 2, this rq speaks 1"):
        FrameDecoder(1024).feed(b"RQ\x02\x0a\x00\x00\x00\x00")
    with pytest.raises(ProtocolError, match="not an rq peer"):
        FrameDecoder(1024).feed(b"XX\x01\x0a\x00\x00\x00\x00")


def test_short_chunk_and_ragged_pair_bodies_are_protocol_errors_not_struct_errors() -> None:
    with pytest.raises(ProtocolError, match="shorter than its header"):
        frames.parse_chunk(memoryview(b"x" * (frames.CHUNK.size - 1)))
    with pytest.raises(ProtocolError, match="whole number of pairs"):
        frames.parse_pairs(memoryview(b"x" * 7))
    assert frames.parse_pairs(memoryview(frames.pairs_frame(FrameType.ACK, [(1, 2), (3, 4)])[8:])) == [
        (1, 2),
        (3, 4),
    ]


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


KEY = "00" * 16


def test_journal_append_fsyncs_unless_the_caller_batches(
    state_dir: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ACK promises verified *and durable*: a record not synced could be gone after a power cut."""
    j = journal.Journal(state_dir, "f.journal", KEY, 8 << 20, 4 << 20, 2)
    synced: list[int] = []
    real = os.fsync

    def counted(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    j.append([(0, b"\x01" * 16)])
    assert len(synced) == 1
    j.append([(1, b"\x02" * 16)], sync=False)
    assert len(synced) == 1
    assert j.reload() == {0: b"\x01" * 16, 1: b"\x02" * 16}


def test_journals_hold_no_descriptor_between_calls(state_dir: int) -> None:
    before = len(os.listdir("/proc/self/fd"))
    made = [journal.Journal(state_dir, f"{i}.journal", KEY, 4 << 20, 4 << 20, 1) for i in range(200)]
    for j in made:
        j.append([(0, b"\x03" * 16)], sync=False)
        assert j.reload() == {0: b"\x03" * 16}
    assert len(os.listdir("/proc/self/fd")) <= before + 2


def test_a_journal_removed_under_it_reloads_as_empty(state_dir: int, tmp_path: Path) -> None:
    j = journal.Journal(state_dir, "gone.journal", KEY, 4 << 20, 4 << 20, 1)
    j.append([(0, b"\x04" * 16)], sync=False)
    (tmp_path / "gone.journal").unlink()
    assert j.reload() == {}


def test_a_placed_file_takes_no_chunks() -> None:
    known = journal.KnownDigests("placed.bin", {0: b"\x05" * 16})
    known.append([])  # nothing to add: fine
    with pytest.raises(ValueError, match=r"placed\.bin"):
        known.append([(1, b"\x06" * 16)])
    assert known.reload() == {0: b"\x05" * 16}


def test_name_length_limit_is_4096_bytes_exactly() -> None:
    at_limit = "/".join(["a" * 255] * 16) + "/" + "b" * 15  # 16 * 256 + 15 = 4111: too long
    assert len(at_limit) > names.MAX_NAME_BYTES
    with pytest.raises(NameTooLongError):
        names.validate_name(at_limit)
    exact = ("a" * 255 + "/") * 15 + "c" * 256  # 15 * 256 + 256 = 4096, last component 256: too long
    assert len(exact) == 4096
    with pytest.raises(UnsafeNameError, match="component too long"):
        names.validate_name(exact)
    fits = ("a" * 255 + "/") * 15 + "c" * 255  # 4095
    assert len(names.validate_name(fits)) == 16
    four_k = ("a" * 255 + "/") * 15 + "c" * 254 + "/d"  # 4096 exactly, every component ≤ 255
    assert len(four_k) == 4096 and len(names.validate_name(four_k)) == 17
    with pytest.raises(NameTooLongError):
        names.validate_name(four_k + "e")
    # multi-byte: counted in UTF-8 bytes, not characters
    wide = ("é" * 127 + "/") * 16  # 16 * 255 = 4080 bytes
    assert len(names.validate_name(wide + "é" * 8)) == 17  # 4096 bytes
    with pytest.raises(NameTooLongError):
        names.validate_name(wide + "é" * 8 + "x")


def test_a_name_that_is_not_text_is_an_unsafe_name() -> None:
    with pytest.raises(UnsafeNameError):
        names.validate_name(123)  # type: ignore[arg-type]
    with pytest.raises(UnsafeNameError):
        names.validate_name("")
