"""ex: `Cache.open` was annotated `IO[bytes]`, which has no `readinto`, so the read into a buffer
of one's own that docs/cache.md shows failed `mypy --strict` in a training job's code (the
packages ship py.typed), though both file objects it returns take it at run time."""

from __future__ import annotations

import typing

from cache import Cache


def test_what_open_is_typed_as_takes_readinto() -> None:
    returned = typing.get_type_hints(Cache.open)["return"]
    kinds = typing.get_args(returned) or (returned,)
    assert kinds and all(
        hasattr(kind, "readinto") and hasattr(kind, "seek") for kind in kinds
    )  # (old: IO[bytes])
