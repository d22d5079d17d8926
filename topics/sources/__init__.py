"""Topic sources behind one small interface: the embedded log, NATS JetStream, MQTT (live only)."""

from topics.sources.base import Appended, Sink, Source
from topics.sources.open import open_sink, open_source, parse_topic

__all__ = ["Appended", "Sink", "Source", "open_sink", "open_source", "parse_topic"]
