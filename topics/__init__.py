"""rq's topics library: the embedded log, JetStream and MQTT sources, SPECs, filters, formats.

Usable without the CLI, e.g. from a training script:

    from pathlib import Path
    from topics import LogWriter, TopicLog

    with LogWriter(Path("/data/topics/samples")) as w:            # one writer per topic
        first, last = w.append([(None, b"key", (), b'{"x": 1}')])   # durable when it returns

    log = TopicLog(Path("/data/topics/samples"))
    for batch in log.reader(log.offset_for_time(ts_ms), stop=log.end_offset()):
        for offset, timestamp_ms, key, headers, value in batch:
            ...

Errors are `topics.errors.TopicError` subclasses; nothing here prints or exits.
"""

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from topics.embedded import GroupStore, LogReader, LogWriter, TopicConfig, TopicLog
    from topics.errors import TopicError
    from topics.expr import compile_where
    from topics.savedspec import ReplaySpec, replay_spec
    from topics.spec import parse_position, parse_range

# The public names load on first use (PEP 562), so that `import topics.embedded.log` (rq --version,
# rq offsets, rq tail) does not pay for the expression compiler, SPECs and the pipeline (~25 ms).
_LAZY = {
    "GroupStore": "topics.embedded",
    "LogReader": "topics.embedded",
    "LogWriter": "topics.embedded",
    "ReplaySpec": "topics.savedspec",
    "TopicConfig": "topics.embedded",
    "TopicError": "topics.errors",
    "TopicLog": "topics.embedded",
    "compile_where": "topics.expr",
    "parse_position": "topics.spec",
    "parse_range": "topics.spec",
    "replay_spec": "topics.savedspec",
}


if not TYPE_CHECKING:
    # (hidden from type checkers: a module __getattr__ makes mypy take every attribute as Any, and
    # `topics.ReplaySpek` would no longer be flagged; the TYPE_CHECKING imports above type the names)
    def __getattr__(name: str) -> Any:
        """A public name, imported from its module on first use (and kept here); after a plain `import
        topics`, `topics.expr`, `topics.savedspec`, … are there on first use too, as they were when this
        module imported them all."""
        module = _LAZY.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
            globals()[name] = value
            return value
        if not name.startswith("_") and importlib.util.find_spec(f"topics.{name}") is not None:
            return importlib.import_module(f"topics.{name}")
        raise AttributeError(f"module 'topics' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "GroupStore",
    "LogReader",
    "LogWriter",
    "ReplaySpec",
    "TopicConfig",
    "TopicError",
    "TopicLog",
    "compile_where",
    "parse_position",
    "parse_range",
    "replay_spec",
]
