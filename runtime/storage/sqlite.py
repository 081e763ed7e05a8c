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
base, one row per version, each above the base's: the newest is the document's version
(the base's while the log is empty). ``load()`` is the base with the log replayed in
version order, read by one statement. A patch is appended, not merged, so
pushing one item to a 100,000-item list writes that item (and a small row), never the list.
A patch that assigns the whole value (the empty path), or that would make the log larger
than the base, is written as the whole value instead: the base is rewritten at the new
version and the log deleted. Writes stay amortised O(size of the change), a load at most
twice the document's size.

A commit: values are serialised, and patches checked against the value they apply to,
before any statement is sent; that value comes from what the store keeps of documents it
wrote (``CACHED_DOCS`` of them, each as of a version: a committed version never changes) or
is read. Each write is conditional on the version it expects, checked by the write itself
(``UPDATE docs ... WHERE version = ? AND`` no log, ``INSERT INTO patches ... WHERE`` the
log's newest version is the one expected, ``INSERT ... ON CONFLICT DO NOTHING`` to create
if absent); one that matches no row is a ``ConflictError`` naming the document. While no
other store watches the file, the commit's first statement also requires that none does
(the quiet path), so a commit needs no ``PRAGMA`` and no feed rows: a whole value of one
document without a log is one statement, its own transaction, and so is a patch appended
(one row of one table: one page for the journal). An append never reads the ``docs`` row:
in a table WITHOUT ROWID even finding a row reads all of it, a large value's overflow pages
too. A statement that matches no row there (a conflict, a watcher that has just arrived, a
log this store did not know of) leaves nothing written, and the commit is made the locked
way: ``BEGIN IMMEDIATE``, whether anyone watches (read again only when
another connection has committed since: ``PRAGMA data_version``), the writes (trying the
other form, with or without a log), the feed's rows, ``COMMIT``.

``leases`` has one row per lease (the contract: ``runtime.storage.base``): its holder and
its expiry in seconds of ``time.time()``, the host's clock, which every process sharing the
file reads (a SQLite file is shared by the processes of one host, never across hosts). A
renewal is one statement, an upsert whose update applies only while the row has not
expired; its row count says which happened. Rows that expired an hour ago are deleted by
the next release.

The change feed (``runtime.storage.feed``): while another store watches the file (a row
in ``watchers``, renewed every ``WATCH_TTL``/3 seconds while its feed is open), every
commit also appends its keys and new versions to ``changes``, marked with the store's
origin (one statement; the oldest rows beyond the newest ``CHANGES_KEPT`` are deleted every
``PRUNE_EVERY`` rows). Whether anyone watches is checked by the quiet path's first
statement, or read on the locked path when another connection has committed since
(``PRAGMA data_version``, which a watcher's arrival moves), so a process alone on its file
writes nothing for a feed. A watcher whose row expired (a long pause) rechecks everything
it holds. ``watch()`` polls ``PRAGMA data_version`` on a connection of its own every
``feed_interval`` seconds (default 0.05: a read of shared memory, no I/O) and reads the
rows after the last one it saw only when another connection committed, skipping its own
store's in SQL; a gap (rows deleted before it read them) is a ``RECHECK``. So the
processes of one host sharing a file see each other's commits within the interval.

A file from before the log (only ``docs``), the leases or the feed gets the missing tables
when it opens. Files of the previous format had a table ``heads`` (each log's newest
version and sizes), moved by every patch: a second table, so a second page written per
patch. Opening one makes ``heads`` a view of the same rows, in one transaction under the
write lock, so a process of the previous code sharing the file (an upgrade under way) still
reads every document right, and still creates documents and writes whole values of
documents without a log; a write of its that would move a head (a patch, or a whole value
over a log) fails, since a view takes no writes, and nothing is written unseen.
"""

from __future__ import annotations

import json
import json.encoder
import logging
import math
import random
import sqlite3
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import anyio
import pydantic_core

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
from .patch import MISSING, apply_patch, conflict, copy_value, describe

T = TypeVar("T")
log = logging.getLogger("celldialog.sqlite")

DEFAULT_BUSY_TIMEOUT = 5.0
DEFAULT_FEED_INTERVAL = 0.05
CACHED_DOCS = 256  # documents whose current value is kept to check patches against
# a document whose base is larger (characters of JSON) keeps no value of the store's own
# for checked writes (``Write.checked``): held once, by the caller; a smaller one keeps a
# copy, so a log that outgrows its base (soon, for a small one) is rebased without a read
KEEP_VALUE_UPTO = 16_384
CURRENT_KEPT = 1024  # documents whose version ``versions()`` keeps while nobody else writes
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
_TABLES = {"docs": _DOCS, "patches": _PATCHES, "leases": _LEASES, "changes": _CHANGES,
           "watchers": _WATCHERS}
# The log of document ``d``: its patches newer than its base. Its newest version is the
# document's (the base's without a log), so a patch appended touches one table.
_LOG_OF = ("p.space={0}.space AND p.scope={0}.scope AND p.id={0}.id "
           "AND p.version>{0}.version")
# The newest patch of ``docs``'s row: the document's version if it has a log. One index
# entry read (``max()`` would read them all), and the ``docs`` row is not read: in a table
# WITHOUT ROWID even finding a row reads all of it, a large value's overflow pages too.
_NEWEST = ("(SELECT p.version FROM patches p WHERE p.space=docs.space AND "
           "p.scope=docs.scope AND p.id=docs.id ORDER BY p.version DESC LIMIT 1)")
# ``heads`` was a table (the current version and sizes of each document with a log) that
# every patch moved: a second table, so a second page, written per patch. Now a view of the
# same rows for processes of the previous code sharing the file: their reads see the log
# through it, and their writes of a head fail (a view takes no writes) instead of going
# unseen. This code never reads it.
_HEADS_VIEW = (
    "CREATE VIEW IF NOT EXISTS heads AS SELECT d.space AS space, d.scope AS scope, "
    "d.id AS id, max(p.version) AS version, sum(length(p.patch)) AS log_size, "
    "length(d.value) AS base_size FROM docs d JOIN patches p ON " + _LOG_OF.format("d")
    + " GROUP BY d.space, d.scope, d.id"
)
# create (row count 1), extend an unexpired lease (1), or leave an expired one (0): one
# atomic statement, so two processes renewing and judging one lease never interleave
_RENEW = (
    "INSERT INTO leases (holder, expires) VALUES (?, ?) ON CONFLICT (holder) DO UPDATE "
    "SET expires=excluded.expires WHERE leases.expires > ?"
)
_KEY = "space=? AND scope=? AND id=?"
# A document in one statement (so one snapshot, no transaction needed): the base row, then
# its log's patches in version order (each version is above the base's).
_READ = (
    "SELECT d.version, d.value FROM docs d WHERE d.space=?1 AND d.scope=?2 AND d.id=?3 "
    "UNION ALL "
    "SELECT p.version, p.patch FROM patches p JOIN docs d ON " + _LOG_OF.format("d")
    + " WHERE p.space=?1 AND p.scope=?2 AND p.id=?3 ORDER BY 1"
)
# the base's version and the log's newest (NULL: no log); no row: no document
_VERSION = f"SELECT version, {_NEWEST} FROM docs WHERE {_KEY}"
_WATCHED = "SELECT EXISTS (SELECT 1 FROM watchers WHERE origin != ? AND expires > ?)"
# the quiet path's guard (``SQLiteStore._quiet``): no other store watches the file
_UNWATCHED = " AND NOT EXISTS (SELECT 1 FROM watchers WHERE origin != ? AND expires > ?)"


def _both(sql: str) -> tuple[str, str]:
    """A write's statement without and with the guard."""
    return sql.format(""), sql.format(_UNWATCHED)


# Every write is conditional on the version it expects; matching no row means it is not
# there (a conflict), the other form applies (a log, or none), or, guarded, someone watches.
# A document is created if absent:
_CREATE = _both("INSERT INTO docs (space, scope, id, version, value) SELECT ?, ?, ?, 1, ? "
                "WHERE 1{} ON CONFLICT DO NOTHING")
# a whole value as the new base, the document without a log:
_PUT = _both(f"UPDATE docs SET version=?, value=? WHERE {_KEY} AND version=? AND "
             f"{_NEWEST} IS NULL{{}}")
# ... with a log: the base is rewritten if the log's head is the version expected (the
# check), then the log goes:
_REBASE = _both(f"UPDATE docs SET version=?, value=? WHERE {_KEY} AND {_NEWEST}=?{{}}")
_DROP_LOG = f"DELETE FROM patches WHERE {_KEY}"
# a patch appended to the log, one statement: if its newest patch is the version expected
# (the ``docs`` row is not read), or, the first since the base, if there is no log and the
# base is at that version (the row read once per base, which cost as much to write)
_ROW = ("INSERT INTO patches (space, scope, id, version, patch) SELECT ?1, ?2, ?3, ?4, ?5 "
        "WHERE ")
_THIS = "space=?1 AND scope=?2 AND id=?3"
_NEXT_ROW = _both(f"{_ROW}(SELECT version FROM patches WHERE {_THIS} ORDER BY version DESC "
                  "LIMIT 1)=?6{}")
_FIRST_ROW = _both(f"{_ROW}NOT EXISTS (SELECT 1 FROM patches WHERE {_THIS}) AND "
                   f"(SELECT version FROM docs WHERE {_THIS})=?6{{}}")


def _append_row(has_log: bool, guarded: bool) -> str:
    """The append's statement: after the log's newest version, or the first since the
    base; with the quiet path's guard or without. Bound to (*key, new, patch, expect)."""
    return (_NEXT_ROW if has_log else _FIRST_ROW)[guarded]


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




def _encoder() -> Callable[[Any, int], Iterable[str]]:
    """Compact JSON as chunks (joined by the caller, so encoding is one call from
    Python), the encoder made once: ``json.dumps`` (and ``JSONEncoder.encode``) build a
    new one per call, which costs more than encoding a small patch. Without the C
    accelerator, ``JSONEncoder.iterencode``. Same text either way (NaN and infinities as
    ``json.dumps`` writes them); no circular-reference check (a cycle hits the recursion
    limit instead, and is refused all the same)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        iterencode = json.JSONEncoder(separators=(",", ":")).iterencode
        return lambda value, _indent: iterencode(value)

    def default(value: Any) -> Any:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    chunks: Callable[[Any, int], Iterable[str]] = make(
        None, default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
    return chunks


_CHUNKS = _encoder()  # _CHUNKS(value, 0): the value's JSON text in chunks
_to_json = pydantic_core.to_json
_UNKNOWN: Any = object()  # a cached document's value the store does not keep


def _dumps(key: DocKey, value: Any) -> str:
    try:
        return "".join(_CHUNKS(value, 0))
    except (TypeError, ValueError, RecursionError) as e:
        raise StorageError(f"cannot store {describe(key)}: the value is not JSON ({e})") from e


def _text(key: DocKey, value: Any, plain: bool) -> str:
    """``value`` as JSON text. ``plain``: the runtime made it (``Write.checked``: dicts
    with text keys, lists, text without lone surrogates, numbers, at most 100 deep), so
    pydantic-core's encoder, in Rust, writes it at 2-3x the speed of ``json``'s C one
    (the text is UTF-8 rather than ASCII-escaped: the same JSON to any reader). Anything
    else, or what that encoder refuses, goes through ``_dumps``, which refuses what is not
    JSON: pydantic-core would write bytes, sets or dates as if they were."""
    if plain:
        try:
            return _to_json(value, inf_nan_mode="constants").decode()
        except ValueError:  # deeper than it goes (over 254), say: json's encoder may not be
            pass
    return _dumps(key, value)


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
        # does another store watch the file? A hint for choosing the quiet path, whose
        # guard checks for itself; read under the lock by the locked path
        self._watched = False
        self._watches = 0  # this store's open feeds (two runtimes may share the store)
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, (int, float)) or not (
            0 <= busy_timeout < float("inf")
        ):
            raise StoreConfigError(
                f"busy_timeout is the seconds to wait for a locked database, a number >= 0; "
                f"got {busy_timeout!r}"
            )
        self.busy_timeout = float(busy_timeout)
        # documents this store wrote or read to patch, as of a version (their values, to
        # check patches against, and sizes, to choose between a log entry and a new base)
        self._cache: OrderedDict[DocKey, _Known] = OrderedDict()
        self._data_version: int | None = None  # PRAGMA data_version when _watched was read
        # each document's version in the file as ``versions()`` last read it, moved by this
        # store's own commits since; good while no other connection has committed, i.e.
        # while ``PRAGMA data_version`` still reads ``_current_at`` (see ``versions``)
        self._current: dict[DocKey, int] = {}
        self._current_at: int | None = None
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
        if (len(writes) == 1 and not self._watched and self._watches < 2
                and writes[0].expect is not None):
            done = self._run("commit()", self._commit_one, writes[0])  # the usual commit
        elif not writes:
            self._open_db("commit()")
            return {}
        else:
            done = self._run("commit()", self._commit, writes)
        current = self._current
        if current:  # what versions() knows moves with this store's own commits
            for key, version in done.items():
                if key in current:
                    current[key] = version
        return done

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
        """The current version of each key that exists, in one snapshot.

        Known without reading a row while no other connection has committed since the
        last read of them (``PRAGMA data_version``, a read of shared memory, says so; this
        store's own commits keep what it knows current): a dialog asks before every step
        whether another process took its turn over, and the answer is almost always that
        nothing changed."""
        def read() -> dict[DocKey, int]:
            db = self._open_db("versions()")
            current = self._current
            seen = db.execute("PRAGMA data_version").fetchone()[0]
            if seen != self._current_at:  # another connection committed: forget it all
                current.clear()
                self._current_at = seen
            elif all(key in current for key in keys):
                return {key: v for key in keys if (v := current[key])}
            out: dict[DocKey, int] = {}
            db.execute("BEGIN")
            try:
                for key in keys:
                    version = self._head(db, key)[0]
                    if version:
                        out[key] = version
            finally:
                _rollback(db)
            if len(current) + len(keys) > CURRENT_KEPT:
                current.clear()  # a recheck of every document held: not worth keeping
            if len(keys) <= CURRENT_KEPT:
                # read after ``seen``: if another commit came in between, the next call
                # sees data_version move and forgets these
                for key in keys:
                    current[key] = out.get(key, 0)
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
                        out[key] = Stored(found.value, found.version)
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
        self._current.clear()
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

    def _run(self, what: str, op: Callable[..., T], *args: Any) -> T:
        """``op(*args)``, retried while the database is locked, up to ``busy_timeout`` in all;
        sqlite3 errors come out as ``StorageError``. The first try is made here, the retries
        (rare) in ``_retry``."""
        db = self._db
        if db is None:
            self._open_db(what)  # raises
        deadline = time.monotonic() + self.busy_timeout
        try:
            return op(*args)
        except sqlite3.Error as e:
            error = e
        assert db is not None
        return self._retry(db, what, deadline, error, op, args)

    def _retry(self, db: sqlite3.Connection, what: str, deadline: float, error: sqlite3.Error,
               op: Callable[..., T], args: tuple[Any, ...]) -> T:
        """After ``op`` failed with ``error``: raise it as a ``StorageError``, or wait and try
        again while the database is locked, until ``deadline``."""
        shortened = False
        try:
            while True:
                _rollback(db)
                left = deadline - time.monotonic()
                if not _is_busy(error):
                    raise StorageError(
                        f"SQLite store {self.path!r}: {what} failed: {error}"
                    ) from error
                if left <= 0:
                    raise StoreBusyError(
                        f"SQLite store {self.path!r}: {what} waited {self.busy_timeout:g} s "
                        f"(busy_timeout) for a lock another connection holds; nothing was "
                        f"committed. Retry later, end the other process's long "
                        f"transaction, or wait longer: SQLiteStore(path, busy_timeout=30) "
                        f"or 'sqlite:///path?busy_timeout=30'"
                    ) from error
                # SQLite refused without waiting (or waited in vain): retry, bounded
                time.sleep(min(left, random.uniform(0.001, 0.02)))
                left = max(deadline - time.monotonic(), 0.001)
                try:  # each statement's own wait must end by the deadline too
                    db.execute(f"PRAGMA busy_timeout={int(left * 1000) or 1}")
                    shortened = True
                except sqlite3.Error:
                    pass
                try:
                    return op(*args)
                except sqlite3.Error as e:
                    error = e
        finally:
            if shortened and self._db is db:
                try:
                    db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
                except sqlite3.Error:
                    pass

    def _migrate(self) -> None:
        """Bring the file to this format: the tables it lacks (a new file: all; one from
        before the log: ``patches`` too), and ``heads`` a view (a table in files of the
        previous format: its rows are what the log says, so it is dropped). Checked first
        without the write lock, then again under it (another process may have done it)."""
        db = self._open_db("open")
        if self._outdated(db) is None:
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            kinds = self._outdated(db) or {}
            for name in _TABLES:
                if name not in kinds:
                    db.execute(_TABLES[name])
            if kinds.get("heads") == "table":
                # the previous format's log is the patches up to its head, above the base:
                # none other exists (its writes kept them so), and none other may count
                db.execute(
                    "DELETE FROM patches WHERE NOT EXISTS (SELECT 1 FROM heads h JOIN docs d "
                    "ON d.space=h.space AND d.scope=h.scope AND d.id=h.id WHERE "
                    "h.space=patches.space AND h.scope=patches.scope AND h.id=patches.id "
                    "AND patches.version>d.version AND patches.version<=h.version)")
                db.execute("DROP TABLE heads")
            db.execute(_HEADS_VIEW)
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise

    @staticmethod
    def _outdated(db: sqlite3.Connection) -> dict[str, str] | None:
        """What the file has of this format's tables and of ``heads`` (name -> table or
        view); None if it needs nothing."""
        kinds = {name: kind for name, kind in db.execute(
            "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')")}
        if kinds.get("heads") == "view" and all(kinds.get(n) == "table" for n in _TABLES):
            return None
        return kinds

    # -- reading -----------------------------------------------------------------------

    def _load(self, key: DocKey) -> Stored | None:
        found = self._read(self._open_db("load()"), key)
        return Stored(found.value, found.version) if found else None

    def _read(self, db: sqlite3.Connection, key: DocKey) -> _Known | None:
        """The current value, version and sizes: the base with the log replayed, read by
        one statement."""
        rows = db.execute(_READ, key).fetchall()
        if not rows:
            return None
        text = rows[0][1]
        value = self._decode(key, text)
        log_size = 0
        for _, patch in rows[1:]:
            value = apply_patch(key, value, self._decode(key, patch), copy_values=False)
            log_size += len(patch)
        # the newest row's version is the document's (the base's while the log is empty)
        return _Known(rows[-1][0], value, log_size, len(text), len(rows) > 1)

    def _decode(self, key: DocKey, text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError as e:
            raise StorageError(
                f"SQLite store {self.path!r}: {describe(key)} holds text that is not JSON: {e}"
            ) from e

    @staticmethod
    def _head(db: sqlite3.Connection, key: DocKey) -> tuple[int, bool]:
        """The current version (0: no document) and whether it has a log."""
        row = db.execute(_VERSION, key).fetchone()
        if row is None:
            return 0, False
        return (row[0], False) if row[1] is None else (row[1], True)

    # -- writing -----------------------------------------------------------------------

    def _commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        """Plan the writes (see ``_plan``), then send them: on the quiet path while no other
        store watches, else in one ``BEGIN IMMEDIATE`` transaction with the feed's rows."""
        db = self._db
        assert db is not None  # _run checked
        plan, unconditional = self._plan(db, writes)
        if (self._watched or unconditional or self._watches > 1
                or not self._quiet(db, plan)):
            self._locked(db, plan)
        out: dict[DocKey, int] = {}
        cache = self._cache
        for step in plan:  # in order: a key's last step is what the file holds now
            key = step.key
            out[key] = step.new
            cache[key] = step.known(step.new)
            cache.move_to_end(key)
        while len(cache) > CACHED_DOCS:
            cache.popitem(last=False)
        return out

    def _commit_one(self, w: Write) -> dict[DocKey, int]:
        """The usual commit, one conditional write while no other store watches: what
        ``_commit`` does for it, without the bookkeeping of several writes. A whole value
        (``Write.value``, or a patch that only assigns the empty path: ``cell.set``) of a
        document without a log is its one guarded statement, with no step object, and so is
        a checked patch (``Write.checked``) appended to a log of known size."""
        db = self._db
        key, expect, patch = w.key, w.expect, w.patch
        assert db is not None and expect is not None  # _run and commit checked
        cache = self._cache
        known = cache.pop(key, None)  # stays out if the commit fails (see ``_plan``)
        if known is not None and known.version != expect:
            known = None  # another version (a stale entry): no use to this write
        new = expect + 1
        if w.checked and known is not None and known.value is _UNKNOWN and patch is not None:
            # the commit a handler's push to a large document makes: a checked patch to a log
            # of known size, with no value of ours to apply it to
            text = self._append_text(key, patch, known)
            if text is not None:
                log_size, base_size = known.log_size + len(text), known.base_size
                done = db.execute(_append_row(known.has_log, True),
                                  (*key, new, text, expect, self._origin, time.time()))
                if done.rowcount != 1:  # a conflict or a watcher
                    self._locked(db, [_Step(key, expect, _APPEND, text, _UNKNOWN, log_size,
                                            base_size, known.has_log)])
                cache[key] = _known((new, _UNKNOWN, log_size, base_size, True))
                if len(cache) > CACHED_DOCS:
                    cache.popitem(last=False)
                return {key: new}
        if patch is None:
            value, text = _UNKNOWN, _dumps(key, w.value)
        elif w.checked:  # no value of ours needed to check it against: kept if small
            value = _sole(patch)
            text = None if value is MISSING else _text(key, value, True)
            if text is not None:
                value = (value if type(value) in _IMMUTABLE else _UNKNOWN
                         if len(text) > KEEP_VALUE_UPTO else copy_value(value))
        else:
            value = _sole_value(patch)
            text = None if value is MISSING else _dumps(key, value)
        if text is not None and (expect == 0 or known is None or not known.has_log):
            if expect == 0:
                done = db.execute(_CREATE[1], (*key, text, self._origin, time.time()))
            else:
                done = db.execute(_PUT[1], (new, text, *key, expect, self._origin,
                                            time.time()))
            if done.rowcount != 1:  # nothing written: a conflict, a watcher or a log
                step = _Step(key, expect, _BASE, text, value, 0, len(text), False)
                self._locked(db, [step])
            cache[key] = _known((new, value, 0, len(text), False))  # the newest entry
        else:
            step = (self._patched(db, key, expect, patch, known, w.checked) if text is None
                    else _Step(key, expect, _BASE, text, value, 0, len(text), True))
            if not self._quiet(db, [step]):
                self._locked(db, [step])
            if w.checked and step.base_size > KEEP_VALUE_UPTO:
                step.value = _UNKNOWN  # a large base: held once, by the caller
            cache[key] = step.known(new)
        if len(cache) > CACHED_DOCS:
            cache.popitem(last=False)
        return {key: new}

    def _append_text(self, key: DocKey, patch: Any, known: _Known) -> str | None:
        """A checked patch (``Write.checked``) as the text of a log entry, appended without
        being applied to anything (no value is kept for it); None where it is not one: a
        step assigns the whole value, or the log would outgrow its base (``_patched`` then
        makes the new base)."""
        for path, _ in patch:
            if not path:
                return None
        text = self._patch_text(key, patch, True)
        return text if known.log_size + len(text) <= known.base_size else None

    def _plan(self, db: sqlite3.Connection, writes: Sequence[Write]
              ) -> tuple[list[_Step], bool]:
        """Each write as a step (``_step``), serialised and checked before any statement is
        sent, and whether one is unconditional (``expect`` None). A write's value comes
        from the cache (a committed version never changes, and the write checks the
        version), or from an earlier write of the same key in this commit. Cache entries
        taken stay out if the commit fails (they may be half-patched)."""
        cache = self._cache
        several = len(writes) > 1
        state: dict[DocKey, _Known] = {}  # this commit's view of each key it writes
        patched_at = {w.key: i for i, w in enumerate(writes)
                      if w.patch is not None} if several else {}
        plan: list[_Step] = []
        unconditional = False
        for i, w in enumerate(writes):
            key, expect = w.key, w.expect
            known = state.pop(key, None) if several else None
            if known is None:
                known = cache.pop(key, None)
            # ``-1``: the version of an unconditional write earlier in this commit
            if known is not None and known.version != expect and known.version != -1:
                known = None  # another version (a stale entry): no use to this write
            unconditional = unconditional or expect is None
            # a patch of this key later in this commit applies to this value: keep a copy
            step = self._step(db, w, known, patched_at.get(key, -1) > i)
            plan.append(step)
            if several:  # version -1: after an unconditional write
                state[key] = step.known(-1 if expect is None else expect + 1)
        return plan, unconditional

    def _step(self, db: sqlite3.Connection, w: Write, known: _Known | None, keep: bool
              ) -> _Step:
        """One write as a step: a whole value as a new base (``keep``: with a copy of a
        ``Write.value``, for a later patch of it in the commit), a patch as ``_patched``
        says."""
        key, expect, patch = w.key, w.expect, w.patch
        if patch is None:
            text = _dumps(key, w.value)
            value = copy_value(w.value) if keep else _UNKNOWN
        else:
            value = _sole_value(patch)
            if value is MISSING:
                return self._patched(db, key, expect, patch, known, w.checked)
            text = _text(key, value, w.checked)
        return _Step(key, expect, _BASE, text, value, 0, len(text),
                     known is not None and known.has_log)

    def _patched(self, db: sqlite3.Connection, key: DocKey, expect: int | None, patch: Any,
                 known: _Known | None, plain: bool) -> _Step:
        """A patch as a step, checked against the value it applies to (``known``'s, else
        read). One that assigns the whole value (the empty path), or would make the log
        outgrow its base, is written as the whole value, a new base; any other is
        appended to the log. ``plain``: the runtime made its values (``_text``)."""
        had_log = known is not None and known.has_log
        if _rooted(patch):  # the whole value first: no need of the current one
            value = apply_patch(key, MISSING, patch)
            whole = True
        else:
            cached = False
            if expect == 0:
                base = MISSING  # apply_patch says a new document starts at ()
            else:
                if known is None or known.value is _UNKNOWN:
                    known = self._read_known(db, key, expect)  # type: ignore[arg-type]
                    had_log = known.has_log
                else:
                    cached = True
                base = known.value
            try:
                value = apply_patch(key, base, patch)
            except StorageError:
                if cached:  # a path the file's newer version may not have: stale?
                    self._stale(db, key, expect)  # type: ignore[arg-type]
                raise
            whole = base is MISSING or _rooted_later(patch)
        if not whole:
            assert known is not None
            text = self._patch_text(key, patch, plain)
            log_size = known.log_size + len(text)
            if log_size <= known.base_size:  # else the log would outgrow the base
                return _Step(key, expect, _APPEND, text, value, log_size, known.base_size,
                             had_log)
        text = _text(key, value, plain)
        return _Step(key, expect, _BASE, text, value, 0, len(text), had_log)

    def _read_known(self, db: sqlite3.Connection, key: DocKey, expect: int) -> _Known:
        """The document at ``expect`` (a patch's base), read in one snapshot; another
        version in the file is a conflict, raised now."""
        found = self._read(db, key)
        have = found.version if found else 0
        if found is None or have != expect:
            raise conflict(key, have, expect)
        return found

    def _stale(self, db: sqlite3.Connection, key: DocKey, expect: int) -> None:
        """A patch that does not apply to the cached value at ``expect``: a conflict if
        the file has moved on since (raised here), else the caller's bad path."""
        have = self._head(db, key)[0]
        if have != expect:
            raise conflict(key, have, expect)

    @staticmethod
    def _patch_text(key: DocKey, patch: Any, plain: bool) -> str:
        """The patch as JSON (tuples are arrays), the way the log keeps it. ``plain``: the
        runtime made it (``_text``)."""
        if plain:
            try:
                return _to_json(patch, inf_nan_mode="constants").decode()
            except ValueError:
                pass
        try:
            return "".join(_CHUNKS(patch, 0))
        except (TypeError, ValueError, RecursionError):  # another sequence, or not JSON
            return _dumps(key, [[list(p), v] for p, v in patch])

    def _quiet(self, db: sqlite3.Connection, plan: list[_Step]) -> bool:
        """The commit, with its first statement guarded by "no other store watches the
        file" (in the same statement, so no watcher can arrive in between): then it
        needs no feed rows and no ``PRAGMA data_version``, and a lone write to a document
        without a log is that one statement, its own transaction. False, with nothing
        written, when a statement matched no row: a watcher, a conflict or a wrong guess
        of whether a log exists, which the locked path tells apart."""
        guard = (self._origin, time.time())
        first = plan[0]
        if len(plan) == 1 and (first.kind is _APPEND or first.expect == 0
                               or not first.had_log):
            return self._send(db, first, guard)  # autocommit: one statement
        db.execute("BEGIN IMMEDIATE")
        try:
            for step in plan:
                if not self._send(db, step, guard):
                    _rollback(db)
                    return False
                guard = ()
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise
        return True

    def _locked(self, db: sqlite3.Connection, plan: list[_Step]) -> None:
        """The commit in a ``BEGIN IMMEDIATE`` transaction: whether another store watches
        (read again only when another connection has committed since), the writes (one
        that matches no row is a conflict, named), and the feed's rows if anyone watches."""
        db.execute("BEGIN IMMEDIATE")
        try:
            # under the write lock: has another connection committed since we last looked?
            seen = db.execute("PRAGMA data_version").fetchone()[0]
            if seen != self._data_version:
                self._data_version = seen
                # does another store watch the file? (a watcher's arrival is a commit, so
                # the answer holds while no other connection commits)
                self._watched = bool(db.execute(_WATCHED, (self._origin, time.time())
                                                ).fetchone()[0])
            for step in plan:
                if step.expect is None:  # unconditional: at whatever version the file has
                    step.expect, step.had_log = self._head(db, step.key)
                if not self._send(db, step, ()):
                    raise self._conflict(db, step)
            if self._watched or self._watches > 1:
                self._feed(db, plan)
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise

    @staticmethod
    def _send(db: sqlite3.Connection, step: _Step, guard: tuple[Any, ...]) -> bool:
        """The step's statements, each conditional on the version it expects; False when
        the first matched no row (nothing of the step was written). With a ``guard`` the
        first also requires that no other store watches, and only the guessed form (with
        or without a log) is tried."""
        key, expect, q = step.key, step.expect, 1 if guard else 0
        assert expect is not None
        new = step.new = expect + 1
        if step.kind is _APPEND:  # the form known to apply: a log at ``expect`` or none
            return db.execute(_append_row(step.had_log, bool(guard)),
                              (*key, new, step.text, expect, *guard)).rowcount == 1
        if expect == 0:
            return db.execute(_CREATE[q], (*key, step.text, *guard)).rowcount == 1
        forms = (step.had_log,) if guard else (step.had_log, not step.had_log)
        for with_log in forms:
            if not with_log:
                if db.execute(_PUT[q], (new, step.text, *key, expect, *guard)).rowcount == 1:
                    return True
            elif db.execute(_REBASE[q], (new, step.text, *key, expect, *guard)
                            ).rowcount == 1:
                db.execute(_DROP_LOG, key)
                return True
        return False

    def _conflict(self, db: sqlite3.Connection, step: _Step) -> StorageError:
        """Why a write matched no row: the document is at another version."""
        have = self._head(db, step.key)[0]
        assert step.expect is not None
        if have != step.expect:
            return conflict(step.key, have, step.expect)
        return StorageError(  # at the expected version, yet no form of the write matched
            f"SQLite store {self.path!r}: {describe(step.key)} is at version {have} but its "
            f"rows disagree (a base and a log that do not match); nothing was committed")

    def _feed(self, db: sqlite3.Connection, plan: list[_Step]) -> None:
        """The commit's rows in ``changes`` (its keys and new versions); every
        ``PRUNE_EVERY`` rows written (by any process) the oldest beyond ``CHANGES_KEPT``
        go, so the table stays bounded however processes come and go."""
        versions = {step.key: step.new for step in plan}
        if len(versions) == 1:  # the usual commit: one statement SQLite has compiled
            ((key, version),) = versions.items()
            last = db.execute(_CHANGE, (self._origin, *key, version)).lastrowid
            if last is not None and last % PRUNE_EVERY == 0:
                db.execute("DELETE FROM changes WHERE seq <= ?", (last - CHANGES_KEPT,))
            return
        items = list(versions.items())
        for i in range(0, len(items), 1000):  # SQLite's limit on ? per statement
            chunk = items[i:i + 1000]
            last = db.execute(_changes(len(chunk)), [
                x for k, v in chunk for x in (self._origin, *k, v)]).lastrowid
            if last is not None and last // PRUNE_EVERY != (last - len(chunk)) // PRUNE_EVERY:
                db.execute("DELETE FROM changes WHERE seq <= ?", (last - CHANGES_KEPT,))


_BASE = "base"  # a step that writes the whole value as the base
_APPEND = "append"  # a step that appends a patch to the log


class _Known(NamedTuple):
    """A document as the file holds it at ``version``. A committed version never changes,
    so this stays true of that version, and every write checks the version in SQL."""

    version: int  # -1: written unconditionally earlier in this commit (not known yet)
    value: Any  # the store's own copy, or _UNKNOWN (a caller's whole value, not kept)
    log_size: int
    base_size: int
    has_log: bool  # a ``heads`` row (and a log) exists


# a _Known from a tuple of its fields, without the Python-level ``__new__`` of a NamedTuple
_known: Callable[[tuple[int, Any, int, int, bool]], _Known] = partial(tuple.__new__, _Known)


class _Step:
    """One write as planned: ``text`` is the whole value (``_BASE``) or the patch
    (``_APPEND``); ``value``, ``log_size`` and ``base_size`` what the document holds after
    it; ``had_log`` whether it has a log before it (known, or for a base a guess its
    statements check); ``new`` its version once sent."""

    __slots__ = ("base_size", "expect", "had_log", "key", "kind", "log_size", "new", "text",
                 "value")

    def __init__(self, key: DocKey, expect: int | None, kind: str, text: str, value: Any,
                 log_size: int, base_size: int, had_log: bool) -> None:
        self.key = key
        self.expect = expect
        self.kind = kind
        self.text = text
        self.value = value
        self.log_size = log_size
        self.base_size = base_size
        self.had_log = had_log
        self.new = 0

    def known(self, version: int) -> _Known:
        """What the document holds after this step, as of ``version``."""
        return _known((version, self.value, self.log_size, self.base_size,
                       self.kind is _APPEND))


def _sole(patch: Any) -> Any:
    """The new value of a patch that only assigns the empty path (``cell.set``), the
    caller's own object; else ``MISSING``."""
    first = patch[0] if type(patch) is tuple and len(patch) == 1 else None
    if type(first) is tuple and len(first) == 2 and type(first[0]) is tuple and not first[0]:
        return first[1]
    return MISSING


def _sole_value(patch: Any) -> Any:
    """``_sole``'s value as ``apply_patch`` would make it (a copy), without its general
    checks; else ``MISSING``."""
    value = _sole(patch)
    return value if value is MISSING or type(value) in _IMMUTABLE else copy_value(value)


_IMMUTABLE = (int, str, float, bool, type(None))  # JSON values copy_value returns as they are


def _rooted(patch: Any) -> bool:
    """Whether a patch starts by assigning the whole value (then it needs no current one)."""
    try:
        return len(patch[0][0]) == 0
    except (TypeError, IndexError, KeyError):
        return False  # apply_patch says what is wrong with it


def _rooted_later(patch: Any) -> bool:
    """Whether a later step of a patch (already applied, so well formed) assigns the whole
    value."""
    return len(patch) > 1 and any(not step[0] for step in patch)


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
