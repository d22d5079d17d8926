"""Committed consumer-group offsets of an embedded topic: `groups/<group>.json`, written atomically."""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

import orjson

from topics.embedded.files import SHARED_DIR, fsync_dir, not_writable, write_atomic
from topics.errors import DamagedGroup, SpecError

_GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_group_name(name: str) -> str:
    """Group names become file names, so they are checked, never used as paths."""
    if not _GROUP.match(name):
        raise SpecError(
            f"bad group name {name!r}: use letters, digits, '.', '_' or '-', starting with a letter or "
            "digit (at most 128)"
        )
    return name


def check_commit_offset(group: str, offset: int) -> None:
    """Offsets start at 0: a negative one stored would read as a group whose records aged out."""
    if offset < 0:
        raise SpecError(f"cannot commit offset {offset} for group {group}: offsets start at 0")


class GroupStore:
    """Committed offsets: the next offset the group will read (Kafka's convention)."""

    def __init__(self, topic_dir: Path):
        self.dir = topic_dir / "groups"

    def committed(self, group: str) -> int | None:
        path = self.dir / f"{check_group_name(group)}.json"
        try:
            data = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except orjson.JSONDecodeError:
            data = None
        value = data.get("committed") if isinstance(data, dict) else None
        if not isinstance(value, int) or isinstance(value, bool):
            # Written atomically by rq, so this is damage or a hand edit: say which file, never guess.
            raise DamagedGroup(
                f"the committed offset of group {group} ({path}) is damaged: "
                f"set it again with `rq offsets reset TOPIC --group {group} --to SPEC`"
            )
        return value

    def commit(self, group: str, offset: int) -> None:
        check_group_name(group)
        check_commit_offset(group, offset)
        body = {"group": group, "committed": offset, "updated_ms": int(time.time() * 1000)}
        try:
            created = not self.dir.exists()
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.dir, SHARED_DIR)  # not 0777 under umask 000: others could replace offsets
            if created:
                fsync_dir(self.dir.parent)
            write_atomic(self.dir / f"{group}.json", orjson.dumps(body))
        except OSError as exc:
            raise not_writable(f"the offset of group {group}", exc) or exc from None

    def groups(self) -> list[str]:
        if not self.dir.is_dir():
            return []
        return sorted(p.stem for p in self.dir.glob("*.json") if _GROUP.match(p.stem))
