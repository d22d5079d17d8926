"""The embedded writer killed (SIGKILL) at any point, and torn tails of every kind: what was
acknowledged reads back byte for byte, offsets stay dense, nothing torn or foreign is ever
served, and the next writer appends right after. Guards: these held on the code they were
written against (engineer ec's review), kept so that they go on holding."""

from __future__ import annotations

import os
import random
import signal
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from topics.embedded import format as fmt
from topics.embedded.log import LogWriter, TopicConfig, TopicLog
from topics.errors import CorruptRecord


def _records(round_: int, start: int, n: int, rnd: random.Random) -> list[fmt.Pending]:
    return [
        (
            None,
            b"k%d" % i if i % 3 else None,
            (("h", b"%d" % i),) if i % 5 == 0 else (),
            b"r%d-%d-" % (round_, i) + b"x" * rnd.randint(0, 2000),
        )
        for i in range(start, start + n)
    ]


def _round(round_: int, count: int) -> list[fmt.Pending]:
    """The first `count` records round `round_`'s writer sends, in order (the child draws the same)."""
    rnd = random.Random(round_)
    out: list[fmt.Pending] = []
    while len(out) < count:
        out += _records(round_, len(out), rnd.randint(1, 40), rnd)
    return out[:count]


def _write_until_killed(t: Path, round_: int, wfd: int) -> None:
    rnd = random.Random(round_)
    with LogWriter(t, TopicConfig(segment_bytes=64 * 1024)) as w:
        i = 0
        while True:
            batch = _records(round_, i, rnd.randint(1, 40), rnd)
            first, last = w.append(batch)
            os.write(wfd, struct.pack("<qq", first, last))  # acknowledged: durable
            i += len(batch)


def kill_9_after(child: Callable[[int], None], want: int) -> bytes:
    """Forks a child running `child(wfd)` (it reports what it has made durable on wfd), SIGKILLs
    it once `want` bytes of reports came (or it ended), and returns every report it wrote."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child is killed
        os.close(rfd)
        try:
            child(wfd)
        finally:
            os._exit(1)
    os.close(wfd)
    got = b""
    while len(got) < want and (chunk := os.read(rfd, want - len(got))):
        got += chunk
    os.kill(pid, signal.SIGKILL)  # mid-stream: wherever the child is now
    os.waitpid(pid, 0)
    while chunk := os.read(rfd, 4096):
        got += chunk
    os.close(rfd)
    return got


def test_kill_9_at_twenty_points_loses_nothing_acknowledged(tmp_path: Path) -> None:
    t = tmp_path / "t"
    pick = random.Random(20)
    acked: dict[int, int] = {}  # offset -> round
    for round_ in range(20):
        got = kill_9_after(lambda wfd, r=round_: _write_until_killed(t, r, wfd), 16 * pick.randint(1, 12))
        for first, last in struct.iter_unpack("<qq", got[: len(got) // 16 * 16]):
            acked.update(dict.fromkeys(range(first, last + 1), round_))

        log = TopicLog(t)
        log.check_end()
        recs = [r for batch in log.reader(0, None) for r in batch]
        assert [r[0] for r in recs] == list(range(log.end_offset()))  # dense, nothing past the end
        assert max(acked) < len(recs)
        by_round: dict[int, list[fmt.Pending]] = {}
        for offset, _ts, key, headers, value in recs:
            r = int(bytes(value).split(b"-")[0][1:])
            assert acked.get(offset, r) == r, offset
            by_round.setdefault(r, []).append(
                (None, None if key is None else bytes(key), headers, bytes(value))
            )
        for r, stored in by_round.items():  # each round's records: a prefix of what it sent, exact
            assert stored == _round(r, len(stored)), r
    with LogWriter(t) as w:  # and the next writer appends right after the last whole batch
        assert w.append([(None, None, (), b"after")]) == (len(recs), len(recs))


def _topic(tmp_path: Path) -> tuple[Path, list[bytes]]:
    t = tmp_path / "t"
    values = [b"%d-" % i + os.urandom(i % 700) for i in range(300)]
    with LogWriter(t, TopicConfig(segment_bytes=40_000)) as w:
        for k in range(0, 300, 7):
            w.append([(None, None, (), v) for v in values[k : k + 7]])
    return t, values


TAILS = {
    # what a crash leaves: the newest batch cut anywhere, or cut and the file extended with zeros
    # no further than its header (a power cut after the size reached the disk, not the data)
    "cut in the header": lambda d, last: d[: last + 20],
    "cut in a record": lambda d, last: d[: last + fmt.BATCH_SIZE + 50],
    "cut one byte short": lambda d, last: d[:-1],
    "cut, then zeros": lambda d, last: d[: last + fmt.BATCH_SIZE] + bytes(9000),
    "zeros past the end": lambda d, last: d + bytes(5000),
    "a few garbage bytes": lambda d, last: d + b"\x9b" * 30,
    # damage a crash cannot leave: refused in one line (CorruptRecord), never served
    "garbage past the end": lambda d, last: d + b"\x9b" * 300,
    "the last bytes zeroed": lambda d, last: d[:-40] + bytes(40),
}


DAMAGE = ("garbage past the end", "the last bytes zeroed")


@pytest.mark.parametrize("tail", list(TAILS))
def test_a_torn_or_damaged_tail_is_dropped_or_refused_never_served(tmp_path: Path, tail: str) -> None:
    t, values = _topic(tmp_path)
    seg = t / fmt.segment_name(TopicLog(t).segments()[-1])
    data = seg.read_bytes()
    seg.write_bytes(TAILS[tail](data, data.rindex(fmt.MAGIC)))
    log = TopicLog(t)
    for skip in (False, True):
        served: list[tuple[int, bytes]] = []
        try:
            for batch in log.reader(0, None, skip_corrupt=skip):
                served += [(r[0], bytes(r[4])) for r in batch]
        except CorruptRecord as exc:
            assert not skip and tail in DAMAGE and len(str(exc).splitlines()) == 1, (tail, str(exc))
        assert served == [(i, values[i]) for i, _ in served], tail  # only real records, in place
        assert [o for o, _ in served] == list(range(len(served)))
    try:
        w = LogWriter(t)
    except CorruptRecord as exc:  # damage at the end that does not frame: refused, kept as it was
        assert tail == "garbage past the end" and "not appending after them" in str(exc)
        return
    with w:
        first, _ = w.append([(None, None, (), b"after")])
    # a torn newest batch (offsets 294..299) is dropped; the rest appends at 300
    assert first == (294 if tail.startswith("cut") else 300), first
    again = [r for batch in TopicLog(t).reader(0, None, skip_corrupt=True) for r in batch]
    assert again[-1][0] == first and bytes(again[-1][4]) == b"after"
