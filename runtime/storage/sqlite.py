"""SQLite store: one file, WAL journal, one SQL transaction per commit.

Several processes may share the file. Versions (``Write.expect``) keep their writes from
overwriting each other; the file's lock makes each commit atomic. Waiting for that lock is
bounded by ``busy_timeout`` seconds (default 5): ``SQLiteStore(path, busy_timeout=2)`` or
``open_store("sqlite:///path.db?busy_timeout=2")``. It is set when connecting, before
``PRAGMA journal_mode=WAL``, and an operation SQLite refuses at once instead of waiting (a
journal-mode switch racing another open, say) is retried until the same bound. Past it the
store raises ``StoreBusyError``; every other SQLite failure is a ``StorageError`` naming
the file, with the ``sqlite3`` error as ``__cause__``. The file's directory must exist.

Tables: ``docs`` holds each document's base value (JSON text) and the base's version;
``patches`` is an append-only log of the patches (``Write.patch``) committed since that
base, one row per version; ``heads`` has the current version and the log's size of each
document whose log is not empty. ``load()`` is the base with the log replayed in version
order. A patch is appended, not merged, so pushing one item to a 100,000-item list writes
that item (and two small rows), never the list; when the log grows larger than the base it
is compacted (the base rewritten at the current version, the log deleted), which keeps
writes amortised O(size of the change) and a load at most twice the document's size. To
check a patch's paths without reading the document back, the store keeps the current value
of documents it patched (by version; one another writer changed is read again).

``leases`` has one row per lease (the contract: ``runtime.storage.base``): its holder and
its expiry in seconds of ``time.time()``, the host's clock, which every process sharing the
file reads (a SQLite file is shared by the processes of one host, never across hosts). A
renewal is one statement, an upsert whose update applies only while the row has not
expired; its row count says which happened. Rows that expired an hour ago are deleted by
the next release. A renewal by another process counts as a commit to the file for the
check that lets a commit skip reading heads (``PRAGMA data_version``): with leases renewed
every few seconds, a commit then reads its documents' heads once per renewal, not per commit.

The change feed (``runtime.storage.feed``): while another store watches the file (a row
in ``watchers``, renewed every ``WATCH_TTL``/3 seconds while its feed is open), every
commit also appends its keys and new versions to ``changes``, marked with the store's
origin (one statement; the oldest rows beyond the newest ``CHANGES_KEPT`` are deleted every
``PRUNE_EVERY`` rows). Whether anyone watches is read when another connection has
committed since (``PRAGMA data_version``, which a watcher's arrival moves), so a process
alone on its file writes nothing for a feed. A watcher whose row expired (a long pause)
rechecks everything it holds. ``watch()``
polls ``PRAGMA data_version`` on a connection of its own every ``feed_interval`` seconds
(default 0.05: a read of shared memory, no I/O) and reads the rows after the last one it
saw only when another connection committed, skipping its own store's in SQL; a gap (rows
deleted before it read them) is a ``RECHECK``. So the processes of one host sharing a
file see each other's commits within the interval.

A file from before the log (only ``docs``), the leases or the feed opens as it is: the
missing tables are created.
"""

from __future__ import annotations

import json
import logging
import math
import random
import sqlite3
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio

from ..errors import StorageError, StoreBusyError, StoreClosedError, StoreConfigError
from .base import (
    LEASE_COLLECT_AFTER,
    DocKey,
    Stored,
    Write,
    check_lease_holder,
    check_lease_ttl,
)
from .feed import RECHECK, Changes
from .patch import MISSING, apply_patch, conflict, describe

T = TypeVar("T")
log = logging.getLogger("celldialog.sqlite")

DEFAULT_BUSY_TIMEOUT = 5.0
DEFAULT_FEED_INTERVAL = 0.05
CACHED_DOCS = 256  # documents whose current value is kept to check patches against
CHANGES_KEPT = 10_000  # rows of the change feed kept for readers that fall behind
PRUNE_EVERY = 500  # rows of the change feed between deletions of old ones
WATCH_TTL = 60.0  # seconds a watcher's row lasts unless renewed (every third of it)

# ``version`` before ``value``: reading a row's version must not walk a large value's
# overflow pages (files from before the log have them the other way round; they work)
_DOCS = """
CREATE TABLE IF NOT EXISTS docs (
    space   TEXT NOT NULL,
    scope   TEXT NOT NULL,
    id      TEXT NOT NULL,
    version INTEGER NOT NULL,
    value   TEXT NOT NULL,
    PRIMARY KEY (space, scope, id)
) WITHOUT ROWID
"""
# one row per document with a non-empty log: its current version, the log's and the base's
# size. Kept apart from ``docs`` because SQLite rewrites a whole row on update, value too.
_HEADS = """
CREATE TABLE IF NOT EXISTS heads (
    space     TEXT NOT NULL,
    scope     TEXT NOT NULL,
    id        TEXT NOT NULL,
    version   INTEGER NOT NULL,
    log_size  INTEGER NOT NULL,
    base_size INTEGER NOT NULL,
    PRIMARY KEY (space, scope, id)
) WITHOUT ROWID
"""
_PATCHES = """
CREATE TABLE IF NOT EXISTS patches (
    space   TEXT NOT NULL,
    scope   TEXT NOT NULL,
    id      TEXT NOT NULL,
    version INTEGER NOT NULL,
    patch   TEXT NOT NULL,
    PRIMARY KEY (space, scope, id, version)
) WITHOUT ROWID
"""
_LEASES = """
CREATE TABLE IF NOT EXISTS leases (
    holder  TEXT PRIMARY KEY,
    expires REAL NOT NULL
) WITHOUT ROWID
"""
_CHANGES = """
CREATE TABLE IF NOT EXISTS changes (
    seq     INTEGER PRIMARY KEY,
    origin  INTEGER NOT NULL,
    space   TEXT NOT NULL,
    scope   TEXT NOT NULL,
    id      TEXT NOT NULL,
    version INTEGER NOT NULL
)
"""
# the stores whose feed is open (one row each, renewed while it is): a commit writes its
# rows in ``changes`` only while another store watches the file
_WATCHERS = """
CREATE TABLE IF NOT EXISTS watchers (
    origin  INTEGER PRIMARY KEY,
    expires REAL NOT NULL
)
"""
_TABLES = {"docs": _DOCS, "heads": _HEADS, "patches": _PATCHES, "leases": _LEASES,
           "changes": _CHANGES, "watchers": _WATCHERS}
# create (row count 1), extend an unexpired lease (1), or leave an expired one (0): one
# atomic statement, so two processes renewing and judging one lease never interleave
_RENEW = (
    "INSERT INTO leases (holder, expires) VALUES (?, ?) ON CONFLICT (holder) DO UPDATE "
    "SET expires=excluded.expires WHERE leases.expires > ?"
)
_WHERE = "space=? AND scope=? AND id=?"
_CHANGE = "INSERT INTO changes (origin, space, scope, id, version) VALUES (?,?,?,?,?)"
_CHANGE_ROWS: dict[int, str] = {}  # the statement for n changes (n <= 1000), made once


def poll_interval(value: object, what: str) -> float:
    """Check a feed's poll interval: seconds, a number > 0 and <= 60."""
    if (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and 0 < value <= 60):
        return float(value)
    raise StoreConfigError(f"{what}: the feed's poll interval is seconds, a number > 0 and "
                           f"<= 60; got {value!r}")


def _changes(n: int) -> str:
    sql = _CHANGE_ROWS.get(n)
    if sql is None:
        sql = _CHANGE_ROWS[n] = _CHANGE + ",(?,?,?,?,?)" * (n - 1)
    return sql
_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (low byte of the extended code)


def _dumps(key: DocKey, value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise StorageError(f"cannot store {describe(key)}: the value is not JSON ({e})") from e


def _rollback(db: sqlite3.Connection) -> None:
    """End a failed transaction without hiding why it failed."""
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def _is_busy(e: sqlite3.Error) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _BUSY_CODES
    text = str(e).lower()
    return "locked" in text or "busy" in text


class SQLiteStore:
    def __init__(self, path: str | Path, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                 feed_interval: float = DEFAULT_FEED_INTERVAL) -> None:
        self.path = str(path)
        self.feed_interval = poll_interval(feed_interval, "SQLiteStore(feed_interval=...)")
        # this store's mark on its rows of the feed: its own watch() skips them in SQL
        self._origin = random.getrandbits(62)
        self._watched = True  # until a commit has looked: does another store watch?
        self._watches = 0  # this store's open feeds (two runtimes may share the store)
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, (int, float)) or not (
            0 <= busy_timeout < float("inf")
        ):
            raise StoreConfigError(
                f"busy_timeout is the seconds to wait for a locked database, a number >= 0; "
                f"got {busy_timeout!r}"
            )
        self.busy_timeout = float(busy_timeout)
        self._cache: OrderedDict[DocKey, tuple[int, Any]] = OrderedDict()
        # what the heads table says of documents this connection wrote: (version, log
        # size, base size, has a heads row), valid while no other connection has committed
        # (PRAGMA data_version unchanged), so a commit needs no read per document
        self._heads: dict[DocKey, tuple[int, int, int | None, bool]] = {}
        self._data_version: int | None = None
        self._db: sqlite3.Connection | None = None
        if self.path != ":memory:":
            parent = Path(self.path).parent
            if not parent.is_dir():
                raise StorageError(
                    f"cannot open SQLite store {self.path!r}: the directory {str(parent)!r} "
                    f"does not exist; create it first (the store does not create directories)"
                )
        try:
            # timeout= sets SQLite's busy timeout on the connection, before any statement
            db = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        except sqlite3.Error as e:
            raise StorageError(f"cannot open SQLite store {self.path!r}: {e}") from e
        self._db = db
        try:
            self._run("open", lambda: db.execute("PRAGMA journal_mode=WAL").fetchall())
            db.execute("PRAGMA synchronous=NORMAL")
            self._run("open", self._migrate)
        except BaseException as e:
            self._db = None
            db.close()
            if isinstance(e, sqlite3.Error):
                raise StorageError(f"cannot open SQLite store {self.path!r}: {e}") from e
            raise

    # -- the port ---------------------------------------------------------------------

    def load(self, key: DocKey) -> Stored | None:
        return self._run("load()", lambda: self._load(key))

    def commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        if not writes:
            self._open_db("commit()")
            return {}
        return self._run("commit()", lambda: self._commit(writes))

    def keys(self, space: str) -> Iterable[DocKey]:
        def read() -> list[DocKey]:
            rows = self._open_db("keys()").execute(
                "SELECT space, scope, id FROM docs WHERE space=?", (space,)
            )
            return [DocKey(*r) for r in rows]

        return self._run("keys()", read)

    def renew_lease(self, holder: str, ttl: float) -> bool:
        db = self._open_db("renew_lease()")
        check_lease_holder(holder, "renew_lease()")
        check_lease_ttl(ttl, "renew_lease()")

        def renew() -> bool:
            now = time.time()  # read again on each try: a wait for the lock takes time
            return db.execute(_RENEW, (holder, now + ttl, now)).rowcount == 1

        return self._run("renew_lease()", renew)

    def lease_remaining(self, holder: str) -> float | None:
        db = self._open_db("lease_remaining()")
        check_lease_holder(holder, "lease_remaining()")

        def read() -> float | None:
            row = db.execute("SELECT expires FROM leases WHERE holder=?", (holder,)).fetchone()
            return None if row is None else row[0] - time.time()

        return self._run("lease_remaining()", read)

    def release_lease(self, holder: str) -> None:
        db = self._open_db("release_lease()")
        check_lease_holder(holder, "release_lease()")
        self._run("release_lease()", lambda: db.execute(
            "DELETE FROM leases WHERE holder=? OR expires<?",  # and long-dead ones
            (holder, time.time() - LEASE_COLLECT_AFTER)))

    # -- the change feed (runtime.storage.feed) -----------------------------------------

    def versions(self, keys: Sequence[DocKey]) -> dict[DocKey, int]:
        """The current version of each key that exists, in one snapshot."""
        def read() -> dict[DocKey, int]:
            db = self._open_db("versions()")
            out: dict[DocKey, int] = {}
            db.execute("BEGIN")
            try:
                for key in keys:
                    head = db.execute(f"SELECT version FROM heads WHERE {_WHERE}", key
                                      ).fetchone() or db.execute(
                        f"SELECT version FROM docs WHERE {_WHERE}", key).fetchone()
                    if head is not None:
                        out[key] = head[0]
            finally:
                _rollback(db)
            return out

        return self._run("versions()", read)

    def load_many(self, keys: Sequence[DocKey]) -> dict[DocKey, Stored]:
        """The value and version of each key that exists, in one snapshot."""
        def read() -> dict[DocKey, Stored]:
            db = self._open_db("load_many()")
            out: dict[DocKey, Stored] = {}
            db.execute("BEGIN")  # one snapshot for them all
            try:
                for key in keys:
                    found = self._read(db, key)
                    if found is not None:
                        out[key] = Stored(*found)
            finally:
                _rollback(db)
            return out

        return self._run("load_many()", read)

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[Changes | None]]:
        """Follow the file's ``changes`` on a connection of its own (see the module)."""
        self._open_db("watch()")
        feed = _Poller(self)
        self._watches += 1
        try:
            yield feed
        finally:
            self._watches -= 1
            feed.close()

    def close(self) -> None:
        db, self._db = self._db, None
        self._cache.clear()
        self._heads.clear()
        if db is not None:
            try:
                db.close()
            except sqlite3.Error as e:
                raise StorageError(f"closing SQLite store {self.path!r} failed: {e}") from e

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}{', closed' if self._db is None else ''})"

    # -- waiting and wrapping ----------------------------------------------------------

    def _open_db(self, what: str) -> sqlite3.Connection:
        if self._db is None:
            raise StoreClosedError(
                f"{what} on SQLite store {self.path!r} after close(); open the store again "
                f"(SQLiteStore(path) or open_store('sqlite:///...'))"
            )
        return self._db

    def _run(self, what: str, op: Callable[[], T]) -> T:
        """``op()``, retried while the database is locked, up to ``busy_timeout`` in all;
        sqlite3 errors come out as ``StorageError``."""
        db = self._open_db(what)
        deadline = time.monotonic() + self.busy_timeout
        shortened = False
        try:
            while True:
                try:
                    return op()
                except sqlite3.Error as e:
                    _rollback(db)
                    left = deadline - time.monotonic()
                    if not _is_busy(e):
                        raise StorageError(
                            f"SQLite store {self.path!r}: {what} failed: {e}"
                        ) from e
                    if left <= 0:
                        raise StoreBusyError(
                            f"SQLite store {self.path!r}: {what} waited {self.busy_timeout:g} s "
                            f"(busy_timeout) for a lock another connection holds; nothing was "
                            f"committed. Retry later, end the other process's long "
                            f"transaction, or wait longer: SQLiteStore(path, busy_timeout=30) "
                            f"or 'sqlite:///path?busy_timeout=30'"
                        ) from e
                    # SQLite refused without waiting (or waited in vain): retry, bounded
                    time.sleep(min(left, random.uniform(0.001, 0.02)))
                    left = max(deadline - time.monotonic(), 0.001)
                    try:  # each statement's own wait must end by the deadline too
                        db.execute(f"PRAGMA busy_timeout={int(left * 1000) or 1}")
                        shortened = True
                    except sqlite3.Error:
                        pass
        finally:
            if shortened and self._db is db:
                try:
                    db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
                except sqlite3.Error:
                    pass

    def _migrate(self) -> None:
        """Create the tables a file lacks (a new file: all; one from before the log:
        ``heads`` and ``patches``). Checked first without the write lock."""
        db = self._open_db("open")
        if not self._missing_tables(db):
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            for name in self._missing_tables(db):
                db.execute(_TABLES[name])
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise

    @staticmethod
    def _missing_tables(db: sqlite3.Connection) -> list[str]:
        have = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return [name for name in _TABLES if name not in have]

    # -- reading -----------------------------------------------------------------------

    def _load(self, key: DocKey) -> Stored | None:
        db = self._open_db("load()")
        db.execute("BEGIN")  # one snapshot for the base and its log
        try:
            found = self._read(db, key)
        except BaseException:
            _rollback(db)
            raise
        db.execute("COMMIT")
        return Stored(*found) if found else None

    def _read(self, db: sqlite3.Connection, key: DocKey) -> tuple[Any, int] | None:
        """The current value and version, from the base and the log (in a transaction)."""
        row = db.execute(f"SELECT version, value FROM docs WHERE {_WHERE}", key).fetchone()
        if row is None:
            return None
        base_version, text = row
        value = self._decode(key, text)
        head = db.execute(f"SELECT version FROM heads WHERE {_WHERE}", key).fetchone()
        if head is None:
            return value, base_version
        for (patch,) in db.execute(
            f"SELECT patch FROM patches WHERE {_WHERE} AND version>? AND version<=? "
            f"ORDER BY version",
            (*key, base_version, head[0]),
        ):
            value = apply_patch(key, value, self._decode(key, patch), copy_values=False)
        return value, head[0]

    def _decode(self, key: DocKey, text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError as e:
            raise StorageError(
                f"SQLite store {self.path!r}: {describe(key)} holds text that is not JSON: {e}"
            ) from e

    # -- writing -----------------------------------------------------------------------

    def _commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        db = self._open_db("commit()")
        cache = self._cache
        heads = self._heads
        out: dict[DocKey, int] = {}
        touched: list[DocKey] = []
        patch_rows: list[tuple[Any, ...]] = []
        head_rows: list[tuple[Any, ...]] = []
        db.execute("BEGIN IMMEDIATE")
        try:
            # under the write lock: has another connection committed since we last did?
            seen = db.execute("PRAGMA data_version").fetchone()[0]
            if seen != self._data_version:
                heads.clear()
                self._data_version = seen
                # does another store watch the file? (a watcher's arrival is a commit, so
                # the answer holds while no other connection commits)
                self._watched = db.execute(
                    "SELECT EXISTS (SELECT 1 FROM watchers WHERE origin != ? AND expires > ?)",
                    (self._origin, time.time())).fetchone()[0]
            for w in writes:
                key = w.key
                known = heads.pop(key, None)
                if known is not None:
                    have, log_size, base_size, has_row = known
                else:  # O(1) while the document has a log; else one read of the docs row
                    head = db.execute(
                        f"SELECT version, log_size, base_size FROM heads WHERE {_WHERE}", key
                    ).fetchone()
                    if head is not None:
                        (have, log_size, base_size), has_row = head, True
                    else:
                        row = db.execute(
                            f"SELECT version FROM docs WHERE {_WHERE}", key).fetchone()
                        have, log_size, base_size = (row[0] if row else 0), 0, None
                        has_row = False
                if w.expect is not None and w.expect != have:
                    raise conflict(key, have, w.expect)
                new = have + 1
                if w.patch is None:
                    cache.pop(key, None)
                    text = _dumps(key, w.value)
                    self._put_base(db, key, text, new, has_row)
                    heads[key] = (new, 0, len(text), False)
                    out[key] = new
                    continue
                touched.append(key)
                value = apply_patch(key, self._current(db, key, have), w.patch)
                patch_text = _dumps(key, [[list(p), v] for p, v in w.patch])
                if base_size is None:  # the first patch since the base was written
                    row = db.execute(
                        f"SELECT length(value) FROM docs WHERE {_WHERE}", key
                    ).fetchone()
                    base_size = row[0] if row else 0
                log_size += len(patch_text)
                if log_size > base_size:  # compact: the log outgrew the base
                    text = _dumps(key, value)
                    self._put_base(db, key, text, new, has_row)
                    heads[key] = (new, 0, len(text), False)
                else:
                    patch_rows.append((*key, new, patch_text))
                    head_rows.append((*key, new, log_size, base_size))
                    heads[key] = (new, log_size, base_size, True)
                cache[key] = (new, value)
                cache.move_to_end(key)
                out[key] = new
            # the feed's rows; every PRUNE_EVERY rows written (by any process) the oldest
            # beyond CHANGES_KEPT go, so the table stays bounded however processes come and go
            if not self._watched and self._watches < 2:
                pass  # nobody else follows the file: no rows (no page written) for a feed
            elif len(out) == 1:  # the usual commit: one statement SQLite has compiled
                for key, version in out.items():
                    last = db.execute(_CHANGE, (self._origin, *key, version)).lastrowid
                if last % PRUNE_EVERY == 0:
                    db.execute("DELETE FROM changes WHERE seq <= ?", (last - CHANGES_KEPT,))
            else:
                items = list(out.items())
                for i in range(0, len(items), 1000):  # SQLite's limit on ? per statement
                    chunk = items[i:i + 1000]
                    last = db.execute(_changes(len(chunk)), [
                        x for k, v in chunk for x in (self._origin, *k, v)]).lastrowid
                    if last // PRUNE_EVERY != (last - len(chunk)) // PRUNE_EVERY:
                        db.execute("DELETE FROM changes WHERE seq <= ?",
                                   (last - CHANGES_KEPT,))
            if patch_rows:  # one statement each for all the commit's documents
                db.executemany(
                    "INSERT INTO patches (space, scope, id, version, patch) VALUES (?,?,?,?,?)",
                    patch_rows)
                db.executemany(
                    "INSERT INTO heads (space, scope, id, version, log_size, base_size) "
                    "VALUES (?,?,?,?,?,?) ON CONFLICT (space, scope, id) DO UPDATE SET "
                    "version=excluded.version, log_size=excluded.log_size", head_rows)
            db.execute("COMMIT")
        except BaseException:
            for key in touched:  # patched in place: no longer what the file holds
                cache.pop(key, None)
            heads.clear()  # nothing of this commit happened
            _rollback(db)
            raise
        while len(cache) > CACHED_DOCS:
            cache.popitem(last=False)
        return out

    @staticmethod
    def _put_base(db: sqlite3.Connection, key: DocKey, text: str, version: int,
                  had_log: bool) -> None:
        db.execute(
            "INSERT INTO docs (space, scope, id, version, value) VALUES (?,?,?,?,?) "
            "ON CONFLICT (space, scope, id) DO UPDATE SET "
            "value=excluded.value, version=excluded.version",
            (*key, version, text),
        )
        if had_log:
            db.execute(f"DELETE FROM heads WHERE {_WHERE}", key)
            db.execute(f"DELETE FROM patches WHERE {_WHERE}", key)

    def _current(self, db: sqlite3.Connection, key: DocKey, version: int) -> Any:
        """The value at ``version`` (the file's current one) to patch in place."""
        if version == 0:
            return MISSING
        cached = self._cache.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        found = self._read(db, key)  # another writer changed it, or first patch here
        if found is None or found[1] != version:
            raise StorageError(
                f"SQLite store {self.path!r}: {describe(key)} changed while locked "
                f"(read {found and found[1]}, expected version {version})"
            )
        self._cache[key] = found
        return found[0]


class _Poller:
    """The feed of one ``watch()``: ``PRAGMA data_version`` every ``feed_interval``
    seconds; the ``changes`` rows after the last one read, when it moved."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._db: sqlite3.Connection | None = None
        self._seen: int | None = None  # data_version last read
        self._last = 0  # the last change row read
        self._renewed = -math.inf  # when its row in ``watchers`` was last renewed

    def __aiter__(self) -> AsyncIterator[Changes | None]:
        return self

    async def __anext__(self) -> Changes | None:
        store = self._store
        while True:
            if store._db is None:
                raise StopAsyncIteration  # the store closed
            if self._db is None:
                if store.path == ":memory:":  # one connection, one process: no one else
                    if self._seen is None:
                        self._seen = 0
                        return RECHECK
                    await anyio.sleep_forever()
                try:
                    self._open()
                except sqlite3.Error as e:
                    (log.debug if _is_busy(e) else log.warning)(
                        "SQLite store %r: the change feed cannot open (retrying): %s",
                        store.path, e)
                    await anyio.sleep(store.feed_interval)
                    continue
                return RECHECK
            await anyio.sleep(store.feed_interval)  # the poll's period
            try:
                if time.monotonic() - self._renewed > WATCH_TTL / 3:
                    try:
                        if not self._renew():
                            return RECHECK  # its row had expired (a long pause): rows missed
                    except sqlite3.OperationalError as e:
                        if not _is_busy(e):
                            raise
                        # another connection writes: renew at a later poll (the row lasts)
                batch = self._poll()
            except sqlite3.Error as e:
                log.warning("SQLite store %r: the change feed's read failed (retrying): %s",
                            store.path, e)
                self.close()
                continue
            if batch is not None:
                return batch if batch else RECHECK

    def _open(self) -> None:
        # timeout 0: the poller runs on the event loop, so it never waits for a lock (its
        # reads need none in WAL; its renewals try again at a later poll)
        db = sqlite3.connect(self._store.path, timeout=0, isolation_level=None)
        self._db = db
        try:
            self._renew()  # watched from now on: writers add rows for it (then the recheck)
            self._seen = db.execute("PRAGMA data_version").fetchone()[0]
            self._last = db.execute("SELECT coalesce(max(seq), 0) FROM changes").fetchone()[0]
        except BaseException:
            self._db = None
            db.close()
            raise

    def _renew(self) -> bool:
        """Write (or extend) this store's row in ``watchers``; False if it had expired or
        was gone, so commits may have skipped their rows meanwhile."""
        db = self._db
        assert db is not None
        now = time.time()
        origin = self._store._origin
        kept = db.execute("UPDATE watchers SET expires = ? WHERE origin = ? AND expires > ?",
                          (now + WATCH_TTL, origin, now)).rowcount == 1
        if not kept:
            db.execute("INSERT INTO watchers (origin, expires) VALUES (?, ?) ON CONFLICT "
                       "(origin) DO UPDATE SET expires = excluded.expires",
                       (origin, now + WATCH_TTL))
            db.execute("DELETE FROM watchers WHERE expires < ?", (now - WATCH_TTL,))
        self._renewed = time.monotonic()
        return kept

    def _poll(self) -> Changes | None:
        """None: nothing new; {}: a gap (re-check); else the new versions."""
        db = self._db
        assert db is not None
        seen = db.execute("PRAGMA data_version").fetchone()[0]
        if seen == self._seen:
            return None
        self._seen = seen
        db.execute("BEGIN")  # one snapshot: no pruning between the bounds and the rows
        try:
            return self._read_changes(db)
        finally:
            db.execute("ROLLBACK")

    def _read_changes(self, db: sqlite3.Connection) -> Changes | None:
        top, first = db.execute("SELECT coalesce(max(seq), 0), min(seq) FROM changes "
                                "WHERE seq > ?", (self._last,)).fetchone()
        if first is None:
            top = db.execute("SELECT coalesce(max(seq), 0) FROM changes").fetchone()[0]
            if top < self._last:  # the table was emptied or replaced: numbering restarted
                self._last = top
                return {}
            return None  # a commit without changes (a lease renewed)
        gap = first != self._last + 1
        # the store's own commits are skipped here, in SQLite: its runtime has them (unless
        # two runtimes share the store: then each needs the other's)
        skip = self._store._origin if self._store._watches < 2 else -1
        rows = db.execute("SELECT space, scope, id, version FROM changes WHERE seq > ? AND "
                          "seq <= ? AND origin != ?", (self._last, top, skip)).fetchall()
        self._last = top
        if gap:
            return {}
        if not rows:
            return None
        out: Changes = {}
        for space, scope, id_, version in rows:
            key = DocKey(space, scope, id_)
            if out.get(key, -1) < version:
                out[key] = version
        return out

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            try:  # no longer watched: writers stop adding rows for it
                db.execute("DELETE FROM watchers WHERE origin = ?", (self._store._origin,))
            except sqlite3.Error:
                pass  # it expires by itself
            db.close()
