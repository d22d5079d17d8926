"""The sender's files: scanning SOURCE arguments into manifest entries and reading chunks by offset."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from transfer.errors import SourceChangedError, TransferError
from transfer.manifest import FileEntry, Manifest, file_key, make_manifest
from transfer.names import validate_name


@dataclass(frozen=True)
class SourceFile:
    path: Path
    size: int
    mtime_ns: int
    inode: int


def _identity(path: Path) -> SourceFile:
    st = os.stat(path)
    return SourceFile(path, st.st_size, st.st_mtime_ns, st.st_ino)


def scan(sources: list[Path], chunk_size: int) -> tuple[Manifest, list[SourceFile]]:
    """A file argument is sent under its base name; a directory under its own name with its tree
    (like `cp -r`). Symlinks to files are followed; symlinked directories and special files are not."""
    found: dict[str, tuple[SourceFile, int]] = {}
    for src in sources:
        if not src.exists():
            raise FileNotFoundError(2, "source does not exist", str(src))
        base = src.resolve().name if src.name in ("", ".", "..") else src.name
        if src.is_dir():
            for root, dirs, files in os.walk(src):
                dirs.sort()
                rel_root = Path(root).relative_to(src)
                for fname in sorted(files):
                    full = Path(root) / fname
                    if not stat.S_ISREG(os.stat(full).st_mode):
                        continue
                    _add(found, (Path(base) / rel_root / fname).as_posix(), full)
        else:
            _add(found, base, src)
    entries: list[FileEntry] = []
    for name, (sf, mode) in found.items():
        entries.append(
            FileEntry(
                name=name,
                size=sf.size,
                mode=mode,
                key=file_key(name, sf.size, sf.mtime_ns, sf.inode, chunk_size),
            )
        )
    manifest = make_manifest(chunk_size, entries)
    by_name = {name: sf for name, (sf, _) in found.items()}
    return manifest, [by_name[f.name] for f in manifest.files]


def _add(found: dict[str, tuple[SourceFile, int]], name: str, path: Path) -> None:
    name = os.path.normpath(name).replace(os.sep, "/")
    validate_name(name)  # we would refuse our own manifest otherwise; say so here
    if name in found:
        raise TransferError(f"two sources would both be sent as {name!r}")
    sf = _identity(path)
    found[name] = (sf, stat.S_IMODE(os.stat(path).st_mode))


def check_unchanged(files: list[SourceFile]) -> None:
    """Raises SourceChangedError if a file changed since it was scanned (after its last chunk was read)."""
    for sf in files:
        try:
            now = _identity(sf.path)
        except FileNotFoundError:
            raise SourceChangedError(f"{sf.path} disappeared while it was being sent") from None
        if (now.size, now.mtime_ns, now.inode) != (sf.size, sf.mtime_ns, sf.inode):
            raise SourceChangedError(
                f"{sf.path} changed while it was being sent; re-run to send the new version"
            )


MAX_OPEN = 8  # source descriptors one Reader keeps open


class Reader:
    """Reads chunks with pread into a buffer it reuses (fresh memory is slow to touch here)."""

    def __init__(self, files: list[SourceFile], chunk_size: int):
        self._files = files
        self._chunk = chunk_size
        self._fds: dict[int, int] = {}
        self._buf = bytearray(chunk_size)

    def read(self, f: int, k: int, length: int) -> memoryview:
        fd = self._fds.pop(f, None)
        if fd is None:
            if len(self._fds) >= MAX_OPEN:  # hundreds of shards must not mean hundreds of descriptors
                os.close(self._fds.pop(next(iter(self._fds))))
            fd = os.open(self._files[f].path, os.O_RDONLY | os.O_CLOEXEC)
        self._fds[f] = fd  # most recently used last
        view = memoryview(self._buf)[:length]
        got = 0
        while got < length:
            n = os.preadv(fd, [view[got:]], k * self._chunk + got)
            if n == 0:
                raise SourceChangedError(f"{self._files[f].path} shrank while it was being sent")
            got += n
        return view

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
