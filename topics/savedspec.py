"""Replay specs: what `--save-spec` writes and `--spec` replays and verifies.

A spec pins a replay to exact offsets, so replaying it later yields the same records in the same
order or fails loudly: the digest covers each replayed record's offset, timestamp, key, headers and
value (xxh3-128, length-framed; see pipeline.digest_records).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from topics.embedded.files import write_atomic
from topics.errors import SpecError

VERSION = 1


@dataclass
class ReplaySpec:
    source: str  # canonical topic (path or URL)
    kind: str
    start: int  # first offset read (inclusive)
    stop: int  # end offset (exclusive): exact, resolved when the spec was saved
    records: int  # how many records were replayed (after --where)
    digest: str
    from_spec: str | None = None  # the SPEC as the user wrote it, for people reading the file
    to_spec: str | None = None
    group: str | None = None
    where: str | None = None
    fields: str | None = None
    first_offset: int | None = None
    last_offset: int | None = None
    created: str | None = None
    # Exact time bounds (Unix ms) the replay applied record by record: a follow from a time still
    # to come starts at the end offset and drops what is stamped before it. Replayed with them.
    time_from: int | None = None
    time_to: int | None = None
    # Offsets [first, last] inside start..stop that retention deleted before the replay read them:
    # never replayed, so not in the digest (a copy that still holds them does not match the spec).
    aged_out: list[list[int]] | None = None

    def save(self, path: Path) -> None:
        body = {"rq_replay_spec": VERSION, **asdict(self)}
        write_atomic(path, orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")

    @classmethod
    def load(cls, path: Path) -> ReplaySpec:
        try:
            data: Any = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            raise SpecError(f"replay spec {path} does not exist") from None
        except IsADirectoryError:
            raise SpecError(
                f"replay spec {path} is a directory: name the spec file saved by --save-spec"
            ) from None
        except orjson.JSONDecodeError as exc:
            raise SpecError(f"replay spec {path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("rq_replay_spec") != VERSION:
            raise SpecError(f"{path} is not an rq replay spec (version {VERSION})")
        try:
            spec = cls(**{k: v for k, v in data.items() if k != "rq_replay_spec"})
        except TypeError as exc:
            raise SpecError(f"replay spec {path} has unexpected fields: {exc}") from None
        for name in ("start", "stop", "records"):
            value = getattr(spec, name)
            if type(value) is not int or value < 0:  # not a bool either
                raise SpecError(f"replay spec {path}: {name} must be a non-negative integer")
        for name in ("source", "kind", "digest"):
            if not isinstance(getattr(spec, name), str):
                raise SpecError(f"replay spec {path}: {name} must be a string")
        for name in ("time_from", "time_to"):
            value = getattr(spec, name)
            if value is not None and type(value) is not int:
                raise SpecError(f"replay spec {path}: {name} must be an integer (Unix ms) or null")
        for name in ("where", "fields", "group"):
            if getattr(spec, name) is not None and not isinstance(getattr(spec, name), str):
                raise SpecError(f"replay spec {path}: {name} must be a string or null")
        if spec.stop < spec.start:
            raise SpecError(f"replay spec {path}: stop comes before start")
        return spec
