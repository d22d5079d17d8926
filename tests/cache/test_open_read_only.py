"""Cache.open promises "a verified, read-only file object". An object up to 16 MiB came back as a
plain io.BytesIO: writable() was True and write()/truncate() were taken, then lost (the cached
entry never changes), where the file object a bigger object comes back as refuses them. Both sizes
now refuse writes the same way (io.UnsupportedOperation). The errors rq's library raises are all
importable from `cache` (MisbehavingStoreError and ReadOnlyCacheError were only in submodules)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import cache
from cache import Cache


@pytest.mark.parametrize("size", [1000, (16 << 20) + 1])
def test_what_open_returns_is_read_only(tmp_path: Path, size: int) -> None:
    sample = tmp_path / "s.bin"
    sample.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    with Cache(tmp_path / "c", ram_dir=tmp_path / "ram") as c, c.open(sample) as f:
        assert f.readable() and f.seekable()
        assert not f.writable()  # was True for the small one
        for write in (lambda: f.write(b"y"), lambda: f.writelines([b"y"]), lambda: f.truncate(0)):
            with pytest.raises(io.UnsupportedOperation):
                write()
        f.seek(0)
        assert f.read() == sample.read_bytes()
        if hasattr(f, "getbuffer"):  # the in-memory one: no writing through its buffer either
            view = f.getbuffer()
            assert view.readonly and bytes(view[:3]) == sample.read_bytes()[:3]
            view.release()


def test_every_library_error_is_exported_from_cache() -> None:
    import cache.errors as errors

    classes = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, cache.CacheError)}
    assert classes <= set(cache.__all__), classes - set(cache.__all__)
    assert issubclass(cache.ReadOnlyCacheError, cache.BadSourceError)
    assert issubclass(cache.MisbehavingStoreError, cache.OriginError)
