"""The cache index: one SQLite database in WAL mode shared by every process using the cache dir.

Tables:
  entries   one row per cached object (url is the key; blob names the file in its tier)
  holds     space that counts against a tier cap but is not an entry: downloads in progress,
            victims being evicted or demoted, old versions a reader still has open
  settings  caps and the RAM root, so later runs and other processes agree on them

Every change that touches accounting runs inside BEGIN IMMEDIATE, which serialises writers across
processes; readers never block writers (WAL). The index is the accounting; the files are the data,
written and renamed before the index learns about them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cache.errors import CacheError, CacheFullError, FileSystemFullError, ReadOnlyCacheError

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    url TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    size INTEGER NOT NULL,
    tier TEXT NOT NULL,
    blob TEXT NOT NULL,
    xxh3 TEXT NOT NULL,
    verified_by TEXT NOT NULL,
    pinned INTEGER NOT NULL DEFAULT 0,
    last_access REAL NOT NULL,
    checked_at REAL NOT NULL,
    created REAL NOT NULL,
    endpoint TEXT
);
CREATE INDEX IF NOT EXISTS entries_lru ON entries (tier, pinned, last_access);
CREATE TABLE IF NOT EXISTS holds (
    id INTEGER PRIMARY KEY,
    tier TEXT NOT NULL,
    size INTEGER NOT NULL,
    kind TEXT NOT NULL,
    blob TEXT NOT NULL,
    url TEXT,
    pid INTEGER NOT NULL,
    pid_start INTEGER NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS holds_blob ON holds (blob);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tier_bytes (tier TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS entries_add AFTER INSERT ON entries BEGIN
    UPDATE tier_bytes SET bytes = bytes + NEW.size WHERE tier = NEW.tier;
END;
CREATE TRIGGER IF NOT EXISTS entries_del AFTER DELETE ON entries BEGIN
    UPDATE tier_bytes SET bytes = bytes - OLD.size WHERE tier = OLD.tier;
END;
CREATE TRIGGER IF NOT EXISTS entries_upd AFTER UPDATE OF size, tier ON entries BEGIN
    UPDATE tier_bytes SET bytes = bytes - OLD.size WHERE tier = OLD.tier;
    UPDATE tier_bytes SET bytes = bytes + NEW.size WHERE tier = NEW.tier;
END;
"""
# Triggers keep per-tier totals exact inside every transaction, so reserving space costs O(1), not a
# scan of every entry (2,000 reservations over a growing table were a measured second of CPU).

RECOUNT = """
INSERT OR REPLACE INTO tier_bytes (tier, bytes)
    SELECT 'ram', COALESCE(SUM(size), 0) FROM entries WHERE tier = 'ram';
INSERT OR REPLACE INTO tier_bytes (tier, bytes)
    SELECT 'disk', COALESCE(SUM(size), 0) FROM entries WHERE tier = 'disk';
"""
# The tier totals from the entries themselves (a scan): when the totals table is new to an index
# that already holds entries, and by `rq cache verify --repair`.

INDEX_VERSION = 1
"""The layout of the index this rq reads and writes, kept in the database as PRAGMA user_version.
0: an index made before versions were kept (before it, rq kept no tier totals, or kept them with
no recount): opening it adds what is missing and recounts the totals from the entries, then marks
it 1. An index of a later version is refused (IndexVersionError), never read as this one; a later
rq that changes the layout raises the number and migrates what is older.

Version 1 also takes additions an older rq of version 1 reads and writes as they are, which are
made in place (Index._add_columns) without raising the number (raised, every older rq would refuse
the cache): `entries.endpoint`, the S3 endpoint an s3:// entry was fetched from or last confirmed
at (NULL: a local entry, or one landed by an rq that did not record it)."""


class IndexVersionError(CacheError):
    """The index was made by a newer rq, in a layout this one does not know."""


ENTRY_COLS = (
    "url, version, size, tier, blob, xxh3, verified_by, pinned, last_access, checked_at, created, endpoint"
)
# an index whose entries lack the endpoint column (opened read-only, so never given it): read as NULL
_ENTRY_COLS_NO_ENDPOINT = ENTRY_COLS.replace(", endpoint", ", NULL")
HOLD_COLS = "id, tier, size, kind, blob, url, pid, pid_start, created"
# where Index.touch puts the stamp of an entry read before it landed (and stamped after): past its
# `created`, so that it counts as read (Prefetcher), by a microsecond (several float steps at
# today's epoch seconds), so that its LRU place is that of its landing
READ_BEFORE_LANDING = 1e-6


@dataclass
class Entry:
    url: str
    version: str
    size: int
    tier: str
    blob: str
    xxh3: str
    verified_by: str
    pinned: bool = False
    last_access: float = 0.0
    checked_at: float = 0.0
    created: float = 0.0
    # the S3 endpoint (http(s)://host[:port]) this s3:// entry was fetched from or last confirmed
    # at; None for a local entry, or an unknown one (landed by an rq that did not record it)
    endpoint: str | None = None

    def row(self) -> tuple[object, ...]:
        return (
            self.url,
            self.version,
            self.size,
            self.tier,
            self.blob,
            self.xxh3,
            self.verified_by,
            int(self.pinned),
            self.last_access,
            self.checked_at,
            self.created,
            self.endpoint,
        )


@dataclass
class Hold:
    id: int
    tier: str
    size: int
    kind: str  # landing | evicting | garbage
    blob: str
    url: str | None
    pid: int
    pid_start: int
    created: float


def _entry(row: tuple[object, ...]) -> Entry:
    e = Entry(*row)  # type: ignore[arg-type]
    e.pinned = bool(e.pinned)
    return e


def _index_error(path: Path, exc: sqlite3.Error) -> CacheError:
    if isinstance(exc, sqlite3.OperationalError):  # locked, read-only, no permission: not damage
        return CacheError(f"cannot use the cache index {path}: {exc}")
    return CacheError(
        f"cache index {path} cannot be used ({exc}); every cached file can be fetched again: "
        f"remove {path.parent} to start the cache over"
    )


def _not_writable(path: Path) -> str | None:
    """Why the index's directory cannot be written here, or None when it can."""
    try:
        if os.statvfs(path.parent).f_flag & os.ST_RDONLY:
            return "its file system is read-only"
    except OSError:
        return None
    if not path.exists():
        return None
    if not os.access(path.parent, os.W_OK):
        return "its directory is not writable by you"
    return None


def _full(path: Path, exc: sqlite3.Error) -> str | None:
    """Why an index that failed to open for writing (SQLITE_FULL, or the disk I/O error SQLite
    answers when it cannot make its -shm) may be opened read-only instead: its file system has no
    space left. Read-only there, rq serves what is cached; `rq cache clear`/`evict` free space
    first (Store.remove unlinks before it writes the index)."""
    text = str(exc).lower()
    if "full" in text:
        return FULL  # SQLITE_FULL: ENOSPC on a write, whatever statvfs says a moment later
    if "disk i/o" not in text:
        return None
    try:
        fs = os.statvfs(path.parent)
    except OSError:
        return None
    if fs.f_bavail * fs.f_frsize >= 1 << 20 and (fs.f_files == 0 or fs.f_favail > 0):
        return None  # space enough: a real I/O error, not the file system being full
    return FULL


FULL = "its file system is full"


def _write_refused(directory: Path) -> int | None:
    """ENOSPC or EDQUOT when a small file cannot be written in `directory` (SQLite reports EDQUOT,
    and an ENOSPC on some of its writes, as a bare "disk I/O error"), else None."""
    probe = directory / f".rq-space-probe.{os.getpid()}.{threading.get_ident()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        return exc.errno if exc.errno in (errno.ENOSPC, errno.EDQUOT) else None
    try:
        os.pwrite(fd, b"\0" * 4096, 0)
        os.fsync(fd)
    except OSError as exc:
        return exc.errno if exc.errno in (errno.ENOSPC, errno.EDQUOT) else None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None


def _full_error(path: Path, quota: bool = False) -> CacheFullError:
    if quota:
        return FileSystemFullError(
            f"no space left for the cache index {path}: disk quota exceeded (the quota on its file system is used up)"
        )
    return FileSystemFullError(f"no space left on the file system of the cache index {path}")


def _statements(script: str) -> Iterator[str]:
    """The statements of a script, one at a time (a trigger's body holds semicolons): run inside
    a transaction, where executescript() cannot go (it commits first)."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement.strip()
            statement = ""
    if statement.strip():
        yield statement.strip()


# Every open index of this process. A fork while another thread is inside a transaction leaves the
# child with SQLite's in-memory lock state of that transaction (SQLite keeps one per process and
# per file): the child's own new connection then waits out the busy timeout and fails with
# "database is locked". So a fork waits for transactions to end, holding every index's lock.
_OPEN: weakref.WeakSet[Index] = weakref.WeakSet()
_HELD: list[Index] = []


def _before_fork() -> None:
    for index in list(_OPEN):
        index._lock.acquire()
        _HELD.append(index)


def _after_fork() -> None:
    while _HELD:
        _HELD.pop()._lock.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


class Index:
    """A thread-safe handle on the index for one process (reopened after fork by the owner)."""

    def __init__(self, path: Path, busy_timeout_s: float = 60.0):
        self.path = path
        self._lock = threading.RLock()
        self._busy_timeout_s = busy_timeout_s
        # the S3 endpoint this process's s3:// landings and checks come from (cache.api.Cache sets
        # it; None: unknown), recorded on the entries they land or confirm (Entry.endpoint)
        self.endpoint: Callable[[], str | None] = lambda: None
        try:
            self._db = sqlite3.connect(
                str(path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise _index_error(path, exc) from exc
        self._writing = False  # inside write(): a transaction open otherwise is a leftover
        self.readonly = False  # opened read-only: see _open_read_only
        self._why_readonly = ""
        self._quota = False  # opened read-only for want of space (full): a disk quota used up
        self._cols = ENTRY_COLS  # what an entry is read as (_ENTRY_COLS_NO_ENDPOINT: see _add_columns)
        try:
            self._use_wal(busy_timeout_s)
            # NORMAL in WAL mode: consistent after a power cut, may lose the last commits; every
            # blob is verified by digest before it is served and orphans are collected, so that
            # loss is harmless.
            self._db.execute("PRAGMA synchronous=NORMAL")
            with self._lock:
                if self._version() != INDEX_VERSION:
                    self._migrate()
                self._add_columns()
        except IndexVersionError:
            self._db.close()
            raise
        except sqlite3.Error as exc:
            self._db.close()
            quota = False
            why = _not_writable(path) or _full(path, exc)
            if why is None and "disk i/o" in str(exc).lower():
                # EDQUOT (SQLite says only "disk I/O error" for it) or an ENOSPC the free-space
                # figures did not show: a write of our own next to it tells
                lack = _write_refused(path.parent)
                if lack is not None:
                    why, quota = FULL, lack == errno.EDQUOT
            self._quota = quota
            if why is None or not self._open_read_only(busy_timeout_s, why):
                if why == FULL:
                    # (a new cache, or an index not rq's, has nothing to read: exit 7, not 1)
                    raise _full_error(path, quota) from exc
                if why is not None and isinstance(exc, sqlite3.OperationalError):
                    raise CacheError(f"cannot use the cache index {path}: {exc} ({why})") from exc
                raise _index_error(path, exc) from exc
            try:
                self._version()  # (one opened read-only is read as it is, never migrated)
                if not self._has_endpoint():
                    self._cols = _ENTRY_COLS_NO_ENDPOINT
            except IndexVersionError:
                self._db.close()
                raise
            except sqlite3.Error as exc:
                self._db.close()
                raise _index_error(path, exc) from exc
        else:
            why = _not_writable(path)
            if why is not None and "file system" in why:
                # opened all the same (SQLite reads a -shm and -wal left there): still read-only
                self.readonly, self._why_readonly = True, why
        _OPEN.add(self)

    def _version(self) -> int:
        """The index's layout version; IndexVersionError if it is newer than this rq's."""
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > INDEX_VERSION:
            raise IndexVersionError(
                f"cache index version {version} is newer than this rq understands "
                f"(it knows {INDEX_VERSION}; {self.path}): upgrade rq, or use another --cache-dir"
            )
        return version

    def _migrate(self) -> None:
        """Brings an index of an older layout (or a new, empty file) to INDEX_VERSION, in one
        IMMEDIATE transaction that reads the version again: two processes racing here agree, and
        a newer rq's layout made meanwhile is refused, never written back to this one. Version 0:
        the tables and triggers missing (CREATE IF NOT EXISTS), and the tier totals recounted from
        the entries. An index from before the totals got them new, as zeros under entries already
        there: trusted, every cap was overrun by what the cache held (and evicting it drove them
        below zero); one whose totals drifted (REPLACE skipped the delete trigger) gets them right."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            if self._version() < INDEX_VERSION:
                for statement in _statements(SCHEMA + RECOUNT):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {INDEX_VERSION}")
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _has_endpoint(self) -> bool:
        return any(row[1] == "endpoint" for row in self._db.execute("PRAGMA table_info(entries)"))

    def _add_columns(self) -> None:
        """Adds `entries.endpoint` to an index of version 1 made before it, in place and without
        raising the version: a nullable column at the end, which an older rq's reads (by column
        name) pass over and whose inserts (naming their columns) leave NULL. One IMMEDIATE
        transaction that looks again: two processes racing here add it once."""
        if self._has_endpoint():
            return
        try:
            self._db.execute("BEGIN IMMEDIATE")
            if not self._has_endpoint():
                self._db.execute("ALTER TABLE entries ADD COLUMN endpoint TEXT")
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def recount(self) -> dict[str, int]:
        """Recounts the tier totals from the entries (`rq cache verify --repair`): totals another
        program (or an older rq's bug) left wrong would keep every cap wrong. Returns the
        difference per tier that was corrected (0: they were right)."""
        with self.write() as db:
            before = dict(db.execute("SELECT tier, bytes FROM tier_bytes").fetchall())
            for statement in _statements(RECOUNT):
                db.execute(statement)
            after = dict(db.execute("SELECT tier, bytes FROM tier_bytes").fetchall())
        return {t: int(after[t]) - int(before.get(t, 0)) for t in after}

    def _open_read_only(self, busy_timeout_s: float, why: str) -> bool:
        """Opens an index that cannot be written here (its file system is read-only, or its
        directory is not ours to write) for reading: `rq cache ls/du/stat/verify/cat/path` work
        on a cache on read-only media. A WAL index needs its `-shm` file, which SQLite cannot make
        there, so `mode=ro` (it reads a `-shm` and `-wal` left in place) is tried first, then
        `immutable=1` (no locks, no -shm: right for read-only media, whose file nobody changes).
        Every write is then ReadOnlyCacheError; LRU and freshness stamps are not kept."""
        from urllib.parse import quote

        for query in ("mode=ro", "mode=ro&immutable=1"):
            try:
                db = sqlite3.connect(
                    f"file:{quote(str(self.path))}?{query}",
                    uri=True,
                    timeout=busy_timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                )
            except sqlite3.Error:
                continue
            try:
                if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'entries'").fetchone() is None:
                    db.close()
                    return False  # not an index rq made: the caller's error stands
            except sqlite3.Error:
                db.close()
                continue
            self._db, self.readonly, self._why_readonly = db, True, why
            return True
        return False

    @property
    def full(self) -> bool:
        """Opened read-only because its file system had no space left (see _full)."""
        return self.readonly and self._why_readonly == FULL

    @property
    def why_readonly(self) -> str:
        return self._why_readonly

    def reopen_writable(self) -> None:
        """Opens an index read-only for want of space (`full`) for writing again, once space was
        freed (Store.remove unlinked a file); stays read-only while it still cannot be."""
        if not self.full:
            return
        with self._lock:
            try:
                db = sqlite3.connect(
                    str(self.path),
                    timeout=self._busy_timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                )
            except sqlite3.Error:
                return
            try:
                old, self._db = self._db, db
                self._use_wal(self._busy_timeout_s)
                self._db.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.Error:
                self._db = old
                db.close()
                return
            old.close()
            self.readonly, self._why_readonly = False, ""

    def check_writable(self) -> None:
        """Raises ReadOnlyCacheError when the index was opened read-only (CacheFullError when for
        want of space)."""
        if not self.readonly:
            return
        if self.full:  # (no space to open it for writing: exit 7, free space there)
            raise CacheFullError(str(_full_error(self.path, self._quota)))  # (its class as before)
        raise ReadOnlyCacheError(
            f"the cache {self.path.parent} is read-only ({self._why_readonly}): rq can read it "
            "(rq cache ls, du, stat, verify, cat, path) but not change it"
        )

    def _use_wal(self, patience: float) -> None:
        """Switches a new index to WAL. SQLite answers "database is locked" at once, without its
        busy handler, when another process is creating or switching the same file (two processes
        opening a new cache together did), so the switch is retried until `patience` runs out."""
        deadline = time.monotonic() + patience
        while True:
            try:
                mode = self._db.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() != "wal":
                    self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005 + random.random() * 0.02)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, exclusive across processes from its first statement.
        SQLite's "disk full" becomes CacheFullError; the transaction is rolled back whole.
        An index opened read-only raises ReadOnlyCacheError."""
        self.check_writable()
        with self._lock:
            try:
                if self._db.in_transaction and not self._writing:
                    # one an interrupt (KeyboardInterrupt) left open between its BEGIN and the
                    # rollback below: kept, it would fail every later write and hold SQLite's
                    # write lock against every other process
                    self._db.execute("ROLLBACK")
                # the try is entered before BEGIN: an interrupt landing right after BEGIN
                # succeeded still rolls back (rollback whenever a transaction is open). A write
                # nested in one of this thread (a bug) fails at BEGIN, leaving the outer be.
                outer = not self._writing
                try:
                    self._writing = True
                    self._db.execute("BEGIN IMMEDIATE")
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    if outer and self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
                finally:
                    if outer:
                        self._writing = False
            except sqlite3.OperationalError as exc:
                if "full" in str(exc).lower():
                    raise _full_error(self.path) from exc
                if "disk i/o" in str(exc).lower():
                    lack = _write_refused(self.path.parent)
                    if lack is not None:
                        raise _full_error(self.path, lack == errno.EDQUOT) from exc
                if "readonly" in str(exc).lower():  # (SQLite fell back to reading it)
                    self.readonly = True
                    self._why_readonly = _not_writable(self.path) or str(exc)
                    self.check_writable()
                raise CacheError(f"cache index {self.path}: {exc}") from exc
            except sqlite3.DatabaseError as exc:
                raise _index_error(self.path, exc) from exc

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._db

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """Reads that must agree with each other: one read transaction, so all of them see one
        state of the index (each statement outside one sees its own, in WAL mode)."""
        with self._lock:
            if self._db.in_transaction:  # a write of this thread, or one an interrupt left open
                yield self._db
                return
            # the try is entered before BEGIN: an interrupt landing right after BEGIN still ends
            # the transaction (left open, every later read of this handle saw that old snapshot)
            try:
                self._db.execute("BEGIN")
                yield self._db
            finally:
                if self._db.in_transaction:
                    self._db.execute("COMMIT")  # a read transaction: ends it, writes nothing

    # --- entries -------------------------------------------------------------------------------

    def get(self, url: str, db: sqlite3.Connection | None = None) -> Entry | None:
        with contextlib.nullcontext(db) if db is not None else self.read() as conn:
            row = conn.execute(f"SELECT {self._cols} FROM entries WHERE url = ?", (url,)).fetchone()
        return _entry(row) if row else None

    def get_many(self, urls: Iterable[str]) -> dict[str, Entry]:
        out: dict[str, Entry] = {}
        batch: list[str] = []
        with self.read() as db:
            for url in urls:
                batch.append(url)
                if len(batch) == 500:
                    out.update(self._get_batch(db, batch, self._cols))
                    batch = []
            if batch:
                out.update(self._get_batch(db, batch, self._cols))
        return out

    @staticmethod
    def _get_batch(db: sqlite3.Connection, urls: list[str], cols: str = ENTRY_COLS) -> dict[str, Entry]:
        marks = ",".join("?" * len(urls))
        rows = db.execute(f"SELECT {cols} FROM entries WHERE url IN ({marks})", urls).fetchall()
        return {r[0]: _entry(r) for r in rows}

    def entries(self, tier: str | None = None) -> list[Entry]:
        """Every entry (of a tier), in URL order. A cache of millions holds them all in memory at
        once: pages() is the way to walk one."""
        return [e for page in self.pages() for e in page if tier is None or e.tier == tier]

    PAGE = 1000

    def pages(self, prefix: str = "", page: int = PAGE, after: str | None = None) -> Iterator[list[Entry]]:
        """The entries whose URL starts with `prefix`, in URL order, `page` at a time: one short
        query per page (`url > last ORDER BY url LIMIT page`, a range of the primary key), each
        read to its end before the page is handed out, so no read transaction stays open while
        the caller works on it (a WAL checkpoint would wait for it) and memory is one page.
        Entries landed, evicted or moved meanwhile are seen or not as the next pages find them;
        none is handed out twice. `after`: the pages past that URL (a walk picked up again)."""
        end = prefix + "\U0010ffff"
        last = after
        while True:
            with self.read() as db:
                if last is None:
                    rows = db.execute(
                        f"SELECT {self._cols} FROM entries WHERE url >= ? AND url < ? ORDER BY url LIMIT ?",
                        (prefix, end, page),
                    ).fetchall()
                else:
                    rows = db.execute(
                        f"SELECT {self._cols} FROM entries WHERE url > ? AND url < ? ORDER BY url LIMIT ?",
                        (last, end, page),
                    ).fetchall()
            if not rows:
                return
            yield [_entry(r) for r in rows]
            if len(rows) < page:
                return
            last = rows[-1][0]

    @staticmethod
    def put(db: sqlite3.Connection, entry: Entry) -> None:
        # DELETE then INSERT, not INSERT OR REPLACE: a REPLACE's implicit delete does not fire the
        # delete trigger (recursive triggers are off), which would leave the tier totals too high
        db.execute("DELETE FROM entries WHERE url = ?", (entry.url,))
        db.execute(f"INSERT INTO entries ({ENTRY_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", entry.row())

    @staticmethod
    def delete(db: sqlite3.Connection, url: str) -> None:
        db.execute("DELETE FROM entries WHERE url = ?", (url,))

    def lru(self, db: sqlite3.Connection, tier: str) -> Generator[Entry, None, None]:
        """Unpinned entries of a tier, least recently used first."""
        cur = db.execute(
            f"SELECT {self._cols} FROM entries WHERE tier = ? AND pinned = 0 ORDER BY last_access",
            (tier,),
        )
        for row in cur:
            yield _entry(row)

    def touch(self, stamps: dict[str, float]) -> None:
        """Records reads for LRU; best effort, batched by the caller so hits stay cheap (none on
        a read-only index)."""
        if self.readonly:
            return
        # a stamp never moves back (batches of several processes land out of order), except one
        # that lies ahead of the clock: the wall clock stepped back since (NTP, a resumed VM), and
        # kept, it would stop every later read from being recorded, for LRU and for Prefetcher.
        # A stamp older than the landing of an entry not read since (last_access = created) is a
        # read made before it landed, its batch written late: a DataLoader worker's read of a disk
        # copy that a Prefetcher then promoted to RAM (a new landing). It marks the entry read,
        # last_access = created + READ_BEFORE_LANDING, else Prefetcher never sees that read
        # (its window stalled for the rest of the pass); for LRU the entry is as fresh as landed.
        ahead = time.time() + 1.0
        with self.write() as db:
            db.executemany(
                "UPDATE entries SET last_access = CASE WHEN last_access = created AND ? < created"
                " AND last_access <= ? THEN created + ? ELSE ? END"
                " WHERE url = ? AND (last_access < ? OR last_access > ? OR (last_access = created AND ? < created))",
                [(t, ahead, READ_BEFORE_LANDING, t, u, t, ahead, t) for u, t in stamps.items()],
            )

    def mark_checked(self, urls: list[str], when: float, endpoint: str | None = None) -> None:
        """Best effort, like the LRU stamps: on a full file system the entry is still served, and
        its origin asked again next time. The S3 endpoint that confirmed them (`endpoint`, else
        the one this process asks, self.endpoint()) is recorded on their s3:// entries with the
        stamp: a stamp says when, and where, the entry was last known current."""
        if self.readonly:
            return  # (a read-only cache asks its origin again next time: it cannot remember)
        if endpoint is None:
            endpoint = self.endpoint()
        try:
            with self.write() as db:
                db.executemany(
                    "UPDATE entries SET checked_at = ?,"
                    " endpoint = CASE WHEN substr(url, 1, 5) = 's3://' THEN ? ELSE endpoint END WHERE url = ?",
                    [(when, endpoint, u) for u in urls],
                )
        except CacheFullError:
            pass

    def set_pinned(self, urls: list[str], pinned: bool) -> int:
        with self.write() as db:
            cur = db.executemany(
                "UPDATE entries SET pinned = ? WHERE url = ?", [(int(pinned), u) for u in urls]
            )
            return cur.rowcount

    # --- accounting ----------------------------------------------------------------------------

    @staticmethod
    def used(db: sqlite3.Connection, tier: str) -> int:
        a = db.execute("SELECT bytes FROM tier_bytes WHERE tier = ?", (tier,)).fetchone()[0]
        b = db.execute("SELECT COALESCE(SUM(size), 0) FROM holds WHERE tier = ?", (tier,)).fetchone()[0]
        return int(a) + int(b)

    def created_since(self, t: float, prefixes: Iterable[str]) -> dict[str, int]:
        """How many entries under each URL prefix each tier holds that were landed at or after `t`
        (a range scan of the primary key per prefix)."""
        out: dict[str, int] = {}
        with self.read() as db:
            for prefix in set(prefixes):
                rows = db.execute(
                    "SELECT tier, COUNT(*) FROM entries WHERE url >= ? AND url < ? AND created >= ? GROUP BY tier",
                    (prefix, prefix + "\U0010ffff", t),
                )
                for tier, n in rows:
                    out[tier] = out.get(tier, 0) + int(n)
        return out

    def checked_not_created_since(self, t: float, prefixes: Iterable[str]) -> dict[str, int]:
        """How many entries under each URL prefix each tier holds that were checked at or after `t`
        but landed before it (cached before a preload that listed them)."""
        out: dict[str, int] = {}
        with self.read() as db:
            for prefix in set(prefixes):
                rows = db.execute(
                    "SELECT tier, COUNT(*) FROM entries WHERE url >= ? AND url < ? AND created < ?"
                    " AND checked_at >= ? GROUP BY tier",
                    (prefix, prefix + "\U0010ffff", t, t),
                )
                for tier, n in rows:
                    out[tier] = out.get(tier, 0) + int(n)
        return out

    def usage(self) -> dict[str, dict[str, int]]:
        """Per tier: entries, their bytes, pinned bytes and held bytes, from one snapshot. Read
        statement by statement, a hold that became an entry between two of them was counted twice:
        `rq cache du` showed bytes + held over the cap when the cap held (108 of 42,904 samples
        under four readers, by up to 54 KiB; found by a review of the three jobs together)."""
        out: dict[str, dict[str, int]] = {}
        with self.snapshot() as db:
            for tier in ("ram", "disk"):
                n, size = db.execute(
                    "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries WHERE tier = ?", (tier,)
                ).fetchone()
                pinned = db.execute(
                    "SELECT COALESCE(SUM(size), 0) FROM entries WHERE tier = ? AND pinned = 1", (tier,)
                ).fetchone()[0]
                held = db.execute(
                    "SELECT COALESCE(SUM(size), 0) FROM holds WHERE tier = ?", (tier,)
                ).fetchone()[0]
                out[tier] = {"objects": int(n), "bytes": int(size), "pinned": int(pinned), "held": int(held)}
        return out

    @staticmethod
    def add_hold(
        db: sqlite3.Connection,
        tier: str,
        size: int,
        kind: str,
        blob: str,
        url: str | None,
        owner: tuple[int, int],
    ) -> int:
        cur = db.execute(
            "INSERT INTO holds (tier, size, kind, blob, url, pid, pid_start, created) VALUES (?,?,?,?,?,?,?,?)",
            (tier, size, kind, blob, url, owner[0], owner[1], time.time()),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    @staticmethod
    def names_blob(db: sqlite3.Connection, tier: str, blob: str) -> bool:
        """Whether an entry still points at this blob (so its file must stay)."""
        row = db.execute("SELECT 1 FROM entries WHERE blob = ? AND tier = ?", (blob, tier)).fetchone()
        return row is not None

    @staticmethod
    def resize_hold(db: sqlite3.Connection, hold_id: int, size: int) -> None:
        db.execute("UPDATE holds SET size = ? WHERE id = ?", (size, hold_id))

    @staticmethod
    def drop_hold(db: sqlite3.Connection, hold_id: int) -> None:
        db.execute("DELETE FROM holds WHERE id = ?", (hold_id,))

    @staticmethod
    def holds(db: sqlite3.Connection, tier: str | None = None) -> list[Hold]:
        if tier:
            rows = db.execute(f"SELECT {HOLD_COLS} FROM holds WHERE tier = ?", (tier,)).fetchall()
        else:
            rows = db.execute(f"SELECT {HOLD_COLS} FROM holds").fetchall()
        return [Hold(*r) for r in rows]

    @staticmethod
    def stale_landings(db: sqlite3.Connection, url: str, blob: str) -> list[Hold]:
        """The orphaned landing holds (kept partial downloads) of `url` under another blob than
        `blob`: partials of another version of it, in any tier."""
        rows = db.execute(
            f"SELECT {HOLD_COLS} FROM holds WHERE url = ? AND kind = 'landing' AND pid = 0 AND blob != ?",
            (url, blob),
        ).fetchall()
        return [Hold(*r) for r in rows]

    @staticmethod
    def adopt_hold(db: sqlite3.Connection, hold_id: int, owner: tuple[int, int]) -> None:
        db.execute("UPDATE holds SET pid = ?, pid_start = ? WHERE id = ?", (owner[0], owner[1], hold_id))

    # --- settings ------------------------------------------------------------------------------

    def setting(self, key: str) -> str | None:
        with self.read() as db:
            return Index.setting_in(db, key)

    @staticmethod
    def setting_in(db: sqlite3.Connection, key: str) -> str | None:
        row = db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_setting(self, key: str, value: str) -> None:
        with self.write() as db:
            Index.put_setting(db, key, value)

    @staticmethod
    def put_setting(db: sqlite3.Connection, key: str, value: str) -> None:
        """Inside the caller's transaction."""
        db.execute("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", (key, value))
