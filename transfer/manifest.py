"""The manifest: what a transfer moves, sent first, validated by the receiver before anything is written.

Each file carries its relative name, size, the sender's identity of that version of the file
(size, mtime_ns, inode, ctime_ns) folded into `key`, and its element size hint for byte grouping. A file is cut
into `chunk_size` pieces; chunk k of a file covers bytes [k*chunk_size, min(size, (k+1)*chunk_size)).
Because the receiver derives every offset from (file, k) itself, a sender cannot name overlapping
or out-of-range byte ranges: it can only name chunks that exist.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass, field
from typing import Any, TypeGuard, cast

import orjson
import xxhash

from transfer.errors import LimitError, ProtocolError, UnsafeNameError
from transfer.names import all_plain_and_valid, display_name, validate_name

PROTOCOL_VERSION = 1
# A manifest that lists directories (empty ones: the others arrive as parents of their files) says
# version 2, so that a receiver without them refuses it rather than silently drop them (in practice
# every such receiver is also older than auth 2 and fails at authentication first, exit 4); a
# manifest without directories stays version 1, which every receiver takes. The frame header's wire
# version is unchanged.
DIRS_VERSION = 2
MANIFEST_VERSIONS = (PROTOCOL_VERSION, DIRS_VERSION)
MIN_CHUNK = 64 * 1024
MAX_CHUNK = 64 * 1024 * 1024
DEFAULT_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts; checked against the manifest before anything touches the disk."""

    max_bytes: int | None = None
    max_files: int = 100_000
    max_chunks: int = 4_000_000
    max_manifest_bytes: int = 32 * 1024 * 1024


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    mode: int
    key: str  # hex xxh3-128 of (name, size, mtime_ns, inode, chunk size, ctime_ns): this version
    elem: int = 2  # element size for byte grouping: 2 (bf16/fp16) or 4 (fp32)
    # hex xxh3-128 of (name, size, mtime_ns, inode, ctime_ns): this version whatever the chunk
    # size, so a receiver can tell a re-run with another --chunk-size from a changed source.
    # Optional on the wire ("" from an older sender): outside the transfer id, so older peers agree.
    ident: str = ""
    # the source's mtime in ns, set on the received file before it is placed (like rsync -a, so
    # that a later rsync's size+mtime quick check finds it current). Optional on the wire (None
    # from an older sender: the file keeps the time it arrived), outside the transfer id.
    mtime_ns: int | None = None

    def chunks(self, chunk_size: int) -> int:
        return -(-self.size // chunk_size)

    def chunk_len(self, k: int, chunk_size: int) -> int:
        return min(chunk_size, self.size - k * chunk_size)


@dataclass(frozen=True)
class Manifest:
    chunk_size: int
    files: tuple[FileEntry, ...]
    version: int = PROTOCOL_VERSION
    transfer_id: str = field(default="")
    dirs: tuple[str, ...] = ()  # directories to create (relative names, validated like file names)
    # (name, mtime_ns) of the transfer's directories (those in `dirs` and the parents of its
    # files), set once their contents are placed. Optional on the wire, outside the transfer id.
    dir_mtimes: tuple[tuple[str, int], ...] = ()
    # (name, mode) of the same directories: the sender's permission bits, applied (less what the
    # receiver refuses, store.final_mode) deepest first once everything under them is placed.
    # Optional on the wire, outside the transfer id: older peers and in-flight resumes agree.
    dir_modes: tuple[tuple[str, int], ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def total_chunks(self) -> int:
        return sum(f.chunks(self.chunk_size) for f in self.files)

    def to_json(self) -> bytes:
        body: dict[str, Any] = {
            "version": self.version,
            "transfer_id": self.transfer_id,
            "chunk_size": self.chunk_size,
            "files": [_entry_json(f) for f in self.files],
        }
        if self.dirs:
            body["dirs"] = list(self.dirs)
        if self.dir_mtimes:
            body["dir_mtimes"] = dict(self.dir_mtimes)
        if self.dir_modes:
            body["dir_modes"] = dict(self.dir_modes)
        return orjson.dumps(body)


def _entry_json(f: FileEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"name": f.name, "size": f.size, "mode": f.mode, "key": f.key, "elem": f.elem}
    if f.ident:
        out["ident"] = f.ident
    if f.mtime_ns is not None:
        out["mtime_ns"] = f.mtime_ns
    return out


def file_ident(name: str, size: int, mtime_ns: int, inode: int, *, ctime_ns: int = 0) -> str:
    """The identity of one version of a source file, independent of the chunk size."""
    return xxhash.xxh3_128_hexdigest(orjson.dumps([name, size, mtime_ns, inode, ctime_ns]))


def file_key(name: str, size: int, mtime_ns: int, inode: int, chunk_size: int, *, ctime_ns: int = 0) -> str:
    """The identity of one version of a source file: a changed file gets a new key and restarts.

    The ctime is in it because an in-place rewrite can keep size, inode and mtime (`touch -r`,
    os.utime put the mtime back) but never the ctime: without it a resume kept the old version's
    chunks beside the new one's and called the mix verified. The device number is not in it: an NFS
    mount gets a new one at every mount, and a resume after a reboot must not send everything again.
    Keys made before (without ctime) match no key made now: their journals read as another
    version's, and the file is sent again whole, never trusted."""
    return xxhash.xxh3_128_hexdigest(orjson.dumps([name, size, mtime_ns, inode, chunk_size, ctime_ns]))


def transfer_id(chunk_size: int, files: tuple[FileEntry, ...], dirs: tuple[str, ...] = ()) -> str:
    """The same sources, unchanged, give the same id: that is how a re-run finds its journal."""
    listed: list[Any] = [chunk_size, [(f.name, f.key) for f in files]]
    if dirs:  # only then: a manifest without directories keeps the id older rq computes
        listed.append(list(dirs))
    return xxhash.xxh3_128_hexdigest(orjson.dumps(listed))


def make_manifest(
    chunk_size: int,
    files: list[FileEntry],
    dirs: list[str] | None = None,
    dir_mtimes: dict[str, int] | None = None,
    dir_modes: dict[str, int] | None = None,
) -> Manifest:
    ordered = tuple(sorted(files, key=lambda f: f.name))
    dirs_t = tuple(sorted(set(dirs or ())))
    return Manifest(
        chunk_size=chunk_size,
        files=ordered,
        version=DIRS_VERSION if dirs_t else PROTOCOL_VERSION,
        transfer_id=transfer_id(chunk_size, ordered, dirs_t),
        dirs=dirs_t,
        dir_mtimes=tuple(sorted((dir_mtimes or {}).items())),
        dir_modes=tuple(sorted((dir_modes or {}).items())),
    )


def parse_manifest(body: bytes | memoryview, limits: Limits) -> Manifest:
    """Parses and validates a manifest from the network; raises ProtocolError (or a subclass)."""
    if len(body) > limits.max_manifest_bytes:
        raise LimitError(f"manifest is {len(body)} bytes, more than the {limits.max_manifest_bytes} allowed")
    try:
        raw: Any = orjson.loads(bytes(body))
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"manifest is not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("files"), list):
        raise ProtocolError("manifest must be an object with a list of files")
    version = raw.get("version")
    if type(version) is not int or version not in MANIFEST_VERSIONS:  # (not true, not 1.0)
        raise ProtocolError(
            f"unsupported protocol version {version!r} (this rq speaks {PROTOCOL_VERSION}-{DIRS_VERSION}); "
            "upgrade rq on the older side"
        )
    chunk_size = raw.get("chunk_size")
    if type(chunk_size) is not int or not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
        raise ProtocolError(f"chunk size {chunk_size!r} outside {MIN_CHUNK}..{MAX_CHUNK}")
    items = raw["files"]
    dir_items = raw.get("dirs", [])
    if version == PROTOCOL_VERSION and "dirs" in raw:
        raise ProtocolError("a version 1 manifest cannot list directories")
    if not isinstance(dir_items, list) or not all(isinstance(d, str) for d in dir_items):
        raise ProtocolError("manifest dirs must be a list of names")
    if len(items) + len(dir_items) > limits.max_files:
        raise LimitError(
            f"manifest lists {len(items) + len(dir_items)} files and directories, "
            f"more than the {limits.max_files} allowed"
        )
    # names and keys checked in bulk where they are all plain; each entry on its own otherwise
    # (which says which is wrong and how)
    dicts = all(type(item) is dict for item in items)
    names_ok = dicts and all_plain_and_valid([item.get("name") for item in items])
    keys_ok = dicts and _all_hex32([item.get("key") for item in items])
    idents_ok = dicts and _all_hex32([i for item in items if (i := item.get("ident", "")) != ""])
    files = [_parse_entry(item, names_ok, keys_ok, idents_ok) for item in items]
    _check_tree(files)
    dirs = _parse_dirs(dir_items, files)
    manifest = Manifest(
        chunk_size=chunk_size,
        files=tuple(files),
        version=version,
        transfer_id=str(raw.get("transfer_id", "")),
        dirs=dirs,
        dir_mtimes=_parse_dir_table(raw.get("dir_mtimes", {}), "dir_mtimes", files, dirs),
        dir_modes=_parse_dir_table(raw.get("dir_modes", {}), "dir_modes", files, dirs),
    )
    if manifest.total_chunks > limits.max_chunks:
        raise LimitError(
            f"manifest has {manifest.total_chunks} chunks, more than the {limits.max_chunks} allowed"
        )
    if limits.max_bytes is not None and manifest.total_bytes > limits.max_bytes:
        raise LimitError(
            f"transfer is {manifest.total_bytes} bytes, more than --max-bytes {limits.max_bytes}"
        )
    if manifest.transfer_id != transfer_id(chunk_size, manifest.files, manifest.dirs):
        raise ProtocolError("manifest transfer id does not match its contents")
    return manifest


def _parse_entry(item: Any, name_ok: bool = False, key_ok: bool = False, ident_ok: bool = False) -> FileEntry:
    """One file entry; `name_ok`, `key_ok`, `ident_ok`: its name, key, ident were checked already."""
    if not isinstance(item, dict):
        raise ProtocolError("manifest file entry must be an object")
    get = item.get
    name, size, mode, key, elem = get("name"), get("size"), get("mode"), get("key"), get("elem")
    ident = get("ident", "")
    mtime_ns = get("mtime_ns")
    if not isinstance(name, str):
        raise ProtocolError("manifest file name must be a string")
    if not name_ok:
        validate_name(name)
    # type(...) is int: JSON true is a Python int too, and was taken for 1 (fz: a 1-byte file)
    if type(size) is not int or size < 0 or size > 1 << 50:
        raise ProtocolError(f"bad size {size!r} for a file")
    if type(mode) is not int or not 0 <= mode <= 0o7777:
        raise ProtocolError(f"bad mode {mode!r} for a file")
    if not key_ok and not _is_hex32(key):
        raise ProtocolError("bad file key in manifest")
    if ident != "" and not ident_ok and not _is_hex32(ident):
        raise ProtocolError("bad file identity in manifest")
    if type(elem) is not int or elem not in (1, 2, 4):
        raise ProtocolError(f"bad element size {elem!r}")
    if mtime_ns is not None and not _is_ns(mtime_ns):
        raise ProtocolError(f"bad mtime {mtime_ns!r} for a file")
    return FileEntry(
        name=name, size=size, mode=mode, key=cast(str, key), elem=elem, ident=ident, mtime_ns=mtime_ns
    )


def _is_ns(value: Any) -> TypeGuard[int]:
    """A time in ns since the epoch that utimensat(2) takes (before 1970 included)."""
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 62) <= value < 1 << 62


_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX = re.compile(r"[0-9a-f]*")


def _all_hex32(values: list[Any]) -> bool:
    """Whether every value is a string of 32 lowercase hex digits (see _is_hex32), in bulk."""
    if not values:
        return True
    if set(map(type, values)) != {str} or set(map(len, values)) != {32}:
        return False
    return _HEX.fullmatch("".join(values)) is not None


def _is_hex32(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and _HEX32.fullmatch(value) is not None


def _tree_key(name: str) -> str:
    """`name` with `/` as NUL (which no valid name holds): in the sorted order of such keys,
    every name under a directory D follows D at once, before any other name that starts with D."""
    return name.replace("/", "\x00")


def _check_tree(files: list[FileEntry]) -> None:
    """No duplicate names, and no name that is both a file and a directory of another file.

    Done on the sorted names (a file F is a directory of another name exactly when the name after
    it starts with F + "/"), never by listing each name's prefixes: a name of 2,048 components has
    2,048 prefixes of up to 4 KiB each, and a hostile manifest of such names made the receiver build
    gigabytes of them (~4 MB per name) before any limit could refuse it."""
    names = {f.name for f in files}
    if len(names) != len(files):
        raise ProtocolError("manifest names the same file twice")
    keys = {f.key for f in files}
    if len(keys) != len(files):
        raise ProtocolError("manifest repeats a file key")
    _check_no_file_above(sorted(_tree_key(f.name) for f in files), names)


def _check_no_file_above(sorted_keys: list[str], files: set[str]) -> None:
    """Refuses a file of `files` that another name (in `sorted_keys`, made by _tree_key) lies under."""
    for here, after in itertools.pairwise(sorted_keys):
        if after.startswith(here + "\x00"):
            name = here.replace("\x00", "/")
            if name in files:
                raise ProtocolError(f"manifest uses {name!r} as both a file and a directory")


def _parse_dirs(items: list[str], files: list[FileEntry]) -> tuple[str, ...]:
    """Directory names pass the same checks as file names (no absolute path, no `..`, no control
    characters, nothing inside .rq-partial), appear once, in order, and are neither a file of the
    manifest nor under one."""
    if not all_plain_and_valid(items):
        for name in items:
            validate_name(name)
    if len(set(items)) != len(items) or items != sorted(items):
        raise ProtocolError("manifest directories must be sorted and listed once")
    names = {f.name for f in files}
    for name in items:
        if name in names:
            raise ProtocolError(f"manifest uses {name!r} as both a file and a directory")
    if items:
        _check_no_file_above(sorted(_tree_key(n) for n in [*names, *items]), names)
    return tuple(items)


def _parse_dir_table(
    raw: Any, field_name: str, files: list[FileEntry], dirs: tuple[str, ...]
) -> tuple[tuple[str, int], ...]:
    """`dir_mtimes` or `dir_modes`: each name one of the transfer's directories (one of `dirs`, or
    a parent of one or of a file). A name from the network is data: one that would escape DEST
    ('..', absolute) or names a directory the transfer does not fill is refused like a bad file
    name (UnsafeNameError), so a sender cannot chmod or touch anything else under DEST."""
    if not isinstance(raw, dict):
        raise ProtocolError(f"manifest {field_name} must be an object of names and values")
    ours = set(dirs)
    # the parents of every file and directory, found in their sorted keys (not listed: see _check_tree)
    under = sorted(_tree_key(n) for n in [*(f.name for f in files), *dirs]) if raw else []
    for name, value in raw.items():
        validate_name(name)
        if name not in ours and not _is_parent(under, _tree_key(name) + "\x00"):
            what = "a mode" if field_name == "dir_modes" else "a time"
            raise UnsafeNameError(
                f"manifest gives {what} to {display_name(name)!r}, which is not a directory of the transfer"
            )
        if field_name == "dir_modes":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0o7777:
                raise ProtocolError(f"bad mode {value!r} for a directory")
        elif not _is_ns(value):
            raise ProtocolError(f"bad mtime {value!r} for a directory")
    return tuple(sorted(raw.items()))


def _is_parent(sorted_keys: list[str], prefix: str) -> bool:
    """Whether a key of `sorted_keys` starts with `prefix` (a directory's key and a NUL)."""
    i = bisect.bisect_left(sorted_keys, prefix)
    return i < len(sorted_keys) and sorted_keys[i].startswith(prefix)
