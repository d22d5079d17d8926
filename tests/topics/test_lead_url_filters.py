"""A topic URL's path is taken as typed: an MQTT filter keeps a '?' (urlsplit read it as a query
and dropped the rest: mqtt://h/a?b subscribed to `a`), a leading empty level (mqtt://h//a/b is
/a/b, not a/b), and a %-escape that is not UTF-8 is refused (it became U+FFFD silently)."""

from __future__ import annotations

import pytest

from topics.errors import SpecError
from topics.sources.open import _split_url


@pytest.mark.parametrize(
    ("url", "subject"),
    [
        ("mqtt://h/a?b", "a?b"),
        ("mqtt://h/a?b/#", "a?b/#"),
        ("mqtt://h//a/b", "/a/b"),
        ("mqtt://h/%2Fa/b", "/a/b"),
        ("mqtt://h:1883/s/#", "s/#"),
        ("mqtt://u:p@h/x/+/y", "x/+/y"),
        ("mqtt://h#", "#"),
        ("nats://h/S/a.b", "a.b"),
        ("nats://h/S/a?b", "a?b"),
    ],
)
def test_the_path_is_the_filter_as_typed(url: str, subject: str) -> None:
    assert _split_url(url).subject == subject


@pytest.mark.parametrize("url", ["mqtt://h/%FF/x", "mqtt://h?x", "nats://h/S/%FE"])
def test_what_cannot_be_a_filter_is_refused(url: str) -> None:
    with pytest.raises(SpecError):
        _split_url(url)
