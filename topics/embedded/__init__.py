"""The embedded topic log: a directory of append-only, CRC-checked segments (see docs/topics.md)."""

from topics.embedded.groups import GroupStore
from topics.embedded.log import LogReader, LogWriter, TopicConfig, TopicLog

__all__ = ["GroupStore", "LogReader", "LogWriter", "TopicConfig", "TopicLog"]
