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

from topics.embedded import GroupStore, LogReader, LogWriter, TopicConfig, TopicLog
from topics.errors import TopicError
from topics.expr import compile_where
from topics.savedspec import ReplaySpec, replay_spec
from topics.spec import parse_position, parse_range

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
