"""Topic sources behind one small interface: the embedded log, NATS JetStream, MQTT (live only)."""

from topics.sources.base import Sink, Source
from topics.sources.open import open_sink, open_source, parse_topic

__all__ = ["Sink", "Source", "open_sink", "open_source", "parse_topic"]
