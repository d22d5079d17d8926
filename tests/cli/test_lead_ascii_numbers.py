"""Sizes, seconds and ages are ASCII numbers. Python's \\d and float() also take other scripts'
digits and `_` separators: `--chunk-size ٤M` was 4 MiB, `--ram-limit ４` 4 bytes, `--keep-partial
٣d` three days and `1_0s` ten seconds, while topic SPECs (`--from ١٢`) were refused (fz)."""

from __future__ import annotations

import click
import pytest

from cache.errors import BadSourceError
from cache.sizes import parse_size
from rqcli.params import Age, Seconds


@pytest.mark.parametrize("text", ["٤M", "４", "1_000K", "١"])
def test_a_size_in_other_digits_is_refused(text: str) -> None:
    with pytest.raises(BadSourceError):
        parse_size(text)


@pytest.mark.parametrize("text", ["1_0", "٣", "１", "1_0s", "٣d"])
def test_seconds_and_ages_in_other_digits_are_refused(text: str) -> None:
    with pytest.raises(click.BadParameter):
        Age().convert(text, None, None)
    if not text.endswith(("s", "d")):
        with pytest.raises(click.BadParameter):
            Seconds().convert(text, None, None)


def test_plain_numbers_still_pass() -> None:
    assert parse_size("4M") == 4 << 20 and parse_size(" 1.5 GiB ") == 3 << 29
    assert Seconds().convert("2.5", None, None) == 2.5 and Seconds().convert("1e1", None, None) == 10
    assert Seconds().convert(".5", None, None) == 0.5 and Seconds().convert(3, None, None) == 3
    assert Age().convert("7d", None, None) == 7 * 86400 and Age().convert("90", None, None) == 90
    assert Age().convert("1.5h", None, None) == 5400 and Age().convert("never", None, None) is None
    with pytest.raises(click.BadParameter):
        Seconds().convert("inf", None, None)  # refused as before, by value


@pytest.mark.parametrize("text", ["٤", "1_6", "４"])
def test_whole_numbers_in_other_digits_are_refused(text: str) -> None:
    """Click's INT is int(): `--workers ٤` ran with 4 workers, `--workers 1_6` with 16 (dr3)."""
    from rqcli.params import Whole

    with pytest.raises(click.BadParameter):
        Whole(1, 4096).convert(text, None, None)
    assert Whole(1, 4096).convert("16", None, None) == 16 and Whole(1, 4096).convert(8, None, None) == 8


def test_a_port_in_other_digits_is_refused() -> None:
    """`rq send f rq://127.0.0.1:٩` connected to port 9 (dr3)."""
    from rqcli.commands.transfer import _parse_url
    from rqcli.errors import CliError

    with pytest.raises(CliError):
        _parse_url("rq://127.0.0.1:٩")
    assert _parse_url("rq://127.0.0.1:9")[:2] == ("127.0.0.1", 9)
