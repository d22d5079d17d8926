"""Committed consumer-group offsets of an embedded topic: `groups/<group>.json`, written atomically."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from topics.embedded.files import SHARED_DIR, RenamedNotSynced, fsync_dir, not_writable, write_atomic
from topics.errors import CommitNotDurable, DamagedGroup, SpecError, offset_arg

STALE_TMP_S = 3600  # a commit's temp file older than this was left by a commit that died

# (fullmatch: `$` also matches before a final newline, which let "nl\n" through as a file name)
_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_group_name(name: str) -> str:
    """Group names become file names, so they are checked, never used as paths."""
    if not _GROUP.fullmatch(name):
        raise SpecError(
            f"bad group name {name!r}: use ASCII letters, digits, '.', '_' or '-', starting with a letter or "
            "digit (at most 128)"
        )
    return name


def check_commit_offset(group: str, offset: int) -> int:
    """The offset as a plain int. Offsets start at 0: a negative one stored would read as a group
    whose records aged out; a float (7.5) stored read back as damaged, True was stored as `true`,
    and numpy's int64 failed in orjson with a bare TypeError. An int, or anything with __index__
    (not a bool), is taken; anything else is refused (SpecError)."""
    return offset_arg(f"cannot commit offset {offset!r} for group {group}: it", offset)


class GroupStore:
    """Committed offsets: the next offset the group will read (Kafka's convention).

    `end` (the topic's end offset) is what a commit and a stored offset are checked against:
    `TopicLog(d).groups` gives it. A GroupStore made without it stores offsets only and checks
    none against an end: it knows no log (it may be made for a directory with none yet)."""

    def __init__(self, topic_dir: Path, end: Callable[[], int] | None = None):
        self.dir = topic_dir / "groups"
        self.end = end  # the topic's end offset, to check a stored offset against
        # The largest end seen: the end only grows (a torn tail is never counted), so an offset at
        # or below it needs no new look at the log. `rq offsets` of 3000 groups walked the newest
        # segment 3000 times (O(groups) scans a call); now once, and again only for an offset past it.
        self._seen_end = -1

    def _end_at_least(self, offset: int) -> tuple[bool, int]:
        """(offset <= the topic's end, that end as last seen)."""
        assert self.end is not None
        if offset > self._seen_end:
            self._seen_end = max(self._seen_end, self.end())
        return offset <= self._seen_end, self._seen_end

    def committed(self, group: str) -> int | None:
        path = self.dir / f"{check_group_name(group)}.json"
        try:
            data = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except orjson.JSONDecodeError:
            data = None
        value = data.get("committed") if isinstance(data, dict) else None
        # the topic by its directory: a path every rq takes as TOPIC, however it was named here
        topic = shlex.quote(str(self.dir.parent))
        mend = f"set it again with `rq offsets reset {topic} --group {group} --to SPEC`"
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            # Written atomically by rq, so this is damage or a hand edit: say which file, never guess.
            # (rq never stores a negative offset: one read back passed for records aged out.)
            what = f" ({value})" if isinstance(value, int) and not isinstance(value, bool) else ""
            raise DamagedGroup(f"the committed offset{what} of group {group} ({path}) is damaged: {mend}")
        within, end = self._end_at_least(value) if self.end is not None and value else (True, value)
        if not within:
            # rq commits only what a reader read, and a reset clamps to the end: an offset past it
            # is a hand edit, or records a power cut took back after the group read them (a reader
            # may read a batch before the writer's fdatasync). Taken as it is, records produced
            # later at the offsets before it would be skipped for good.
            raise DamagedGroup(
                f"the committed offset {value} of group {group} ({path}) is past the end of the topic "
                f"({end}): records it read are gone; set it to the end with `rq offsets reset {topic} "
                f"--group {group} --to end` (it then reads what is produced from now on)"
            )
        return value

    def commit(self, group: str, offset: int) -> None:
        """Stores `offset` for `group`. Raises when it is not stored (an OSError named for the
        group's file, or a TopicError); CommitNotDurable when it is stored and read by everyone,
        but syncing it failed (a power cut may take it back): count it as committed, and say so."""
        check_group_name(group)
        offset = check_commit_offset(group, offset)
        within, end = self._end_at_least(offset) if self.end is not None else (True, offset)
        if not within:
            # stored, it would read back as damaged (committed() above); JetStream refuses it too
            raise SpecError(
                f"cannot commit offset {offset} for group {group}: past the end of the topic ({end})"
            )
        body = {"group": group, "committed": offset, "updated_ms": int(time.time() * 1000)}
        try:
            created = not self.dir.exists()
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.dir, SHARED_DIR)  # not 0777 under umask 000: others could replace offsets
            if created:
                fsync_dir(self.dir.parent)
            write_atomic(self.dir / f"{group}.json", orjson.dumps(body))
        except RenamedNotSynced as exc:
            # The rename is done: every reader (the next replay, `rq offsets`) starts at `offset`
            # now. Passed up as a failed commit, a script trusting it re-read what it had read,
            # or believed nothing moved; only the durability is in doubt.
            self._sweep(group)
            raise CommitNotDurable(group, offset, os.fsdecode(exc.filename), exc) from None
        except OSError as exc:
            raise not_writable(f"the offset of group {group}", exc) or exc from None
        self._sweep(group)

    def _sweep(self, group: str) -> None:
        """Removes the temp files of this group's commits killed before their rename (kill -9, a
        power cut): one each, never removed, they piled up in groups/. Only ones untouched for
        STALE_TMP_S: a commit in flight in another process (its temp is seconds old) keeps its own."""
        prefix = f".{group}.json."
        cutoff = time.time() - STALE_TMP_S
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.dir):
                if entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            os.unlink(entry.path)

    def groups(self) -> list[str]:
        """The groups with a file here, named as their files are: a name no group may have now (an
        older rq let "g\n" through) is listed too, and `committed` refuses it, so a listing can say
        it skipped that file instead of leaving it out without a word."""
        if not self.dir.is_dir():
            return []
        return sorted(p.stem for p in self.dir.glob("?*.json") if not p.name.startswith("."))
