"""PostgreSQL store: several processes, on several machines, share one database.

``PostgresStore("postgresql://user@host/db")`` or ``open_store("postgresql://...")``: a
libpq URL (``host`` may be a socket directory: ``postgresql:///db?host=/run/postgresql``).
Our own options ride in the same query string and are taken out before libpq sees it:

- ``pool_size`` (default 4): pooled connections (``psycopg_pool``) for the store's calls;
- ``prepare=off``: no server-side prepared statements, for PgBouncer in transaction mode
  (its older versions cannot route them); on by default;
- ``busy_timeout`` (seconds, default 5): how long a commit waits for a row another
  transaction has locked (``lock_timeout``) before ``StoreBusyError``;
- ``listen_url`` (a percent-encoded libpq URL): where the change feed's ``LISTEN``
  connection goes when the store's own URL is a pooler in transaction mode, which cannot
  carry a ``LISTEN`` (PgBouncer's session port, or the server itself). Default: the URL.

Tables (created on first open, under an advisory lock so processes starting together do not
race): ``celldialog_docs`` has one row per document: its current version, a base value and
the base's version, and the sizes of the base and its log; ``celldialog_patches`` the
patches committed since the base, one row per version; ``celldialog_leases`` the leases, on
the server's clock (``clock_timestamp()``), the one every machine sharing the database
reads. As in SQLite, a patch is appended, not merged, and a patch that would make the log
larger than the base is written as the whole value instead: a write costs what it changes,
and a load at most twice the document's size.

A commit is one round trip for one document, two for several. Values are serialised, and
patches checked against the value they apply to, before anything is sent (the value comes
from a small cache of documents this store wrote, or is read). Each write is one
conditional statement (``UPDATE ... WHERE version = expect``, ``INSERT ... ON CONFLICT DO
NOTHING`` to create if absent) that also sends ``pg_notify('celldialog', ...)`` with its key
and new version (the change feed, ``pg_feed.py``), delivered only if the commit commits. A
single write is its own transaction and raises SQLSTATE ``CD409`` (``celldialog_conflict()``)
when its row is not at the expected version. Several are ``BEGIN`` and the writes in one
pipeline, then ``COMMIT``, or ``ROLLBACK`` when one matched no row. Either way the conflict
becomes ``ConflictError`` naming the document. Writes go in key order, so two commits never
deadlock on each other's rows.

Connections: idle ones are closed after ``MAX_IDLE`` (a cloud database kills them anyway),
TCP keepalives are on and connecting times out after 10 s, so a long model call never finds
a dead socket. A read that finds its connection dead is retried once on a connection the
pool has just checked. A commit that loses its connection is read back by the random token
its statements write on their rows: if it landed, its versions are returned; if it surely
did not, it is sent once more (or is a ``ConflictError``); if others wrote since,
``StorageError`` says the outcome is unknown. Errors never show the URL's passwords
(``pg_url.py``).
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, NamedTuple, TypeVar

import anyio

from ..errors import (
    ConflictError,
    StorageError,
    StoreBusyError,
    StoreClosedError,
    StoreConfigError,
)
from .base import (
    LEASE_COLLECT_AFTER,
    DocKey,
    Stored,
    Write,
    check_lease_holder,
    check_lease_ttl,
)
from .feed import Changes
from .patch import MISSING, apply_patch, conflict, copy_value, describe
from .pg_feed import Listener, payload
from .pg_url import (
    check_busy_timeout,
    check_listen_url,
    check_pool_size,
    parse_url,
    redact,
    scrub,
    secrets_of,
)

__all__ = ["PostgresStore"]

log = logging.getLogger("celldialog.postgres")
T = TypeVar("T")

CACHED_DOCS = 256  # documents whose current value is kept to check patches against
MAX_IDLE = 300.0  # seconds before an idle pooled connection is closed
KEYS_PER_QUERY = 1000
_SCHEMA = """
CREATE TABLE IF NOT EXISTS celldialog_docs (
    space        text   NOT NULL,
    scope        text   NOT NULL,
    id           text   NOT NULL,
    version      bigint NOT NULL,
    base_version bigint NOT NULL,
    base_size    bigint NOT NULL,
    log_size     bigint NOT NULL,
    value        text   NOT NULL,
    token        bigint NOT NULL DEFAULT 0,  -- the last commit's: who wrote it (_resolve)
    PRIMARY KEY (space, scope, id)
);
CREATE TABLE IF NOT EXISTS celldialog_patches (
    space   text   NOT NULL,
    scope   text   NOT NULL,
    id      text   NOT NULL,
    version bigint NOT NULL,
    patch   text   NOT NULL,
    PRIMARY KEY (space, scope, id, version)
);
CREATE TABLE IF NOT EXISTS celldialog_leases (
    holder  text        PRIMARY KEY,
    expires timestamptz NOT NULL
);
CREATE OR REPLACE FUNCTION celldialog_conflict() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'CD409',
        MESSAGE = 'celldialog: a document changed since the version this commit expects';
END $$;
"""
_TABLES = ("celldialog_docs", "celldialog_patches", "celldialog_leases")
_FUNCTION = "celldialog_conflict()"
CONFLICT = "CD409"  # the SQLSTATE of a write whose expected version is not the row's
_KEY = "space = %s AND scope = %s AND id = %s"
# the base and the log since it, in one statement (one snapshot)
_LOAD = (
    "SELECT d.version, d.value, d.log_size, d.base_size, p.patch FROM celldialog_docs d "
    "LEFT JOIN celldialog_patches p ON p.space = d.space AND p.scope = d.scope "
    "AND p.id = d.id AND p.version > d.base_version AND p.version <= d.version "
    "WHERE d.space = %s AND d.scope = %s AND d.id = %s ORDER BY p.version"
)
_LOAD_MANY = (
    "SELECT d.space, d.scope, d.id, d.version, d.value, p.patch "
    "FROM unnest(%s::text[], %s::text[], %s::text[]) AS k(space, scope, id) "
    "JOIN celldialog_docs d USING (space, scope, id) "
    "LEFT JOIN celldialog_patches p ON p.space = d.space AND p.scope = d.scope "
    "AND p.id = d.id AND p.version > d.base_version AND p.version <= d.version "
    "ORDER BY d.space, d.scope, d.id, p.version"
)
_VERSIONS = (
    "SELECT d.space, d.scope, d.id, d.version "
    "FROM unnest(%s::text[], %s::text[], %s::text[]) AS k(space, scope, id) "
    "JOIN celldialog_docs d USING (space, scope, id)"
)
# Each write is one statement returning the new version, which also notifies (the payload
# given, or built here when the version is only known here). Alone in a commit, it is its
# own transaction and raises CONFLICT when its expected version is not the row's (which
# undoes it, notification included). Several go in one transaction, quietly: a write that
# matched no row returns none, and the transaction is rolled back.
_RAISE = " UNION ALL SELECT celldialog_conflict() WHERE NOT EXISTS (SELECT 1 FROM u)"
_TAIL = (
    ", n AS (SELECT pg_notify('celldialog', coalesce(%s, json_build_array("
    "json_build_array(%s::text, %s::text, %s::text, u.version))::text)) FROM u) "
    "SELECT u.version FROM u, n" + _RAISE
)
_DROP_LOG = ("d AS (DELETE FROM celldialog_patches p USING u "
             "WHERE p.space = %s AND p.scope = %s AND p.id = %s)")
# a whole value: the new base (its log deleted), conditional on the expected version
_PUT = (
    "WITH u AS (UPDATE celldialog_docs SET version = version + 1, "
    "base_version = version + 1, base_size = %s, log_size = 0, value = %s, token = %s "
    f"WHERE {_KEY} AND version = %s RETURNING version), {_DROP_LOG}{_TAIL}"
)
_UPSERT = (
    "WITH u AS (INSERT INTO celldialog_docs AS t "
    "(space, scope, id, version, base_version, base_size, log_size, value, token) "
    "VALUES (%s, %s, %s, 1, 1, %s, 0, %s, %s) ON CONFLICT (space, scope, id) DO UPDATE SET "
    "version = t.version + 1, base_version = t.version + 1, base_size = excluded.base_size, "
    "log_size = 0, value = excluded.value, token = excluded.token RETURNING version), "
    f"{_DROP_LOG}{_TAIL}"
)
_CREATE = (
    "WITH u AS (INSERT INTO celldialog_docs "
    "(space, scope, id, version, base_version, base_size, log_size, value, token) "
    "VALUES (%s, %s, %s, 1, 1, %s, 0, %s, %s) ON CONFLICT (space, scope, id) DO NOTHING "
    f"RETURNING version){_TAIL}"
)
# a patch: appended to the log, conditional on the expected version
_APPEND = (
    "WITH u AS (UPDATE celldialog_docs SET version = version + 1, log_size = log_size + %s, "
    f"token = %s WHERE {_KEY} AND version = %s RETURNING version), "
    "p AS (INSERT INTO celldialog_patches (space, scope, id, version, patch) "
    f"SELECT %s, %s, %s, version, %s FROM u){_TAIL}"
)
_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true)"  # this transaction only
_TOKENS = (
    "SELECT d.space, d.scope, d.id, d.version, d.token "
    "FROM unnest(%s::text[], %s::text[], %s::text[]) AS k(space, scope, id) "
    "JOIN celldialog_docs d USING (space, scope, id)"
)
_RENEW = (
    "INSERT INTO celldialog_leases AS l (holder, expires) "
    "VALUES (%s, clock_timestamp() + make_interval(secs => %s)) "
    "ON CONFLICT (holder) DO UPDATE SET expires = excluded.expires "
    "WHERE l.expires > clock_timestamp()"
)
_REMAINING = ("SELECT extract(epoch FROM expires - clock_timestamp())::float8 "
              "FROM celldialog_leases WHERE holder = %s")
_RELEASE = ("DELETE FROM celldialog_leases WHERE holder = %s "
            "OR expires < clock_timestamp() - make_interval(secs => %s)")


def _psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401
    except ImportError as e:
        raise StoreConfigError(
            "a postgresql:// store needs psycopg 3 and psycopg_pool: "
            "pip install 'celldialog[postgres]'"
        ) from e
    return psycopg


def _dumps(key: DocKey, value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise StorageError(f"cannot store {describe(key)}: the value is not JSON ({e})") from e


def _has_nul(key: DocKey) -> bool:
    return "\x00" in key.space or "\x00" in key.scope or "\x00" in key.id


def _columns(keys: Sequence[DocKey]) -> tuple[list[str], list[str], list[str]]:
    return [k.space for k in keys], [k.scope for k in keys], [k.id for k in keys]


class PostgresStore:
    """The store port on PostgreSQL (see the module). ``url`` is a libpq URL with our
    options in its query; the keyword arguments, when given, override those."""

    def __init__(self, url: str, *, pool_size: int | None = None, prepare: bool | None = None,
                 busy_timeout: float | None = None, listen_url: str | None = None) -> None:
        psycopg = _psycopg()
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise StoreConfigError("a PostgreSQL store takes a libpq URL: "
                                   "'postgresql://user@host:5432/dbname'")
        self.url = redact(url)
        self._secrets = secrets_of(url)
        self._conninfo, options = parse_url(url)
        if pool_size is not None:
            options = replace(options, pool_size=check_pool_size(pool_size, "(argument)"))
        if prepare is not None:
            if not isinstance(prepare, bool):
                raise StoreConfigError(f"prepare is True or False; got {prepare!r}")
            options = replace(options, prepare=prepare)
        if busy_timeout is not None:
            options = replace(options, busy_timeout=check_busy_timeout(busy_timeout,
                                                                       "(argument)"))
        if listen_url is not None:
            if not isinstance(listen_url, str):
                raise StoreConfigError(f"listen_url is a libpq URL; got {type(listen_url)}")
            self._secrets = sorted({*self._secrets, *secrets_of(listen_url)}, key=len,
                                   reverse=True)
            options = replace(options, listen_url=check_listen_url(listen_url, "(argument)"))
        self.options = options
        self._listen = options.listen_url or self._conninfo
        # lock_timeout 0 is "wait forever" to PostgreSQL; ours means "do not wait"
        self._lock_ms = max(1, math.ceil(options.busy_timeout * 1000))
        self._psycopg = psycopg
        self._cache: OrderedDict[DocKey, tuple[int, Any]] = OrderedDict()
        self._cache_lock = threading.Lock()  # threads may share a store (and its pool)
        self._closed = False
        self._kwargs: dict[str, Any] = {
            "autocommit": True, "prepare_threshold": 5 if options.prepare else None}
        try:
            with psycopg.connect(self._conninfo, **self._kwargs) as conn:
                self._migrate(conn)
        except psycopg.Error as e:
            raise self._opening(e) from None
        from psycopg_pool import ConnectionPool

        self._pool = ConnectionPool(
            self._conninfo, kwargs=self._kwargs, min_size=1, max_size=options.pool_size,
            configure=self._configure, open=False, name="celldialog", max_idle=MAX_IDLE,
            timeout=30.0, num_workers=1)
        try:
            self._pool.open(wait=True, timeout=30.0)
        except Exception as e:
            self._pool.close()
            raise StorageError(f"cannot open PostgreSQL store {self.url}: "
                               f"{self._why(e)}") from None

    # -- the port ---------------------------------------------------------------------

    def load(self, key: DocKey) -> Stored | None:
        """The document's value and version, or None (a key PostgreSQL cannot hold, one
        with NUL, is never found)."""
        self._check_open("load()")
        if _has_nul(key):
            return None
        found = self._run("load()", lambda conn: self._read(conn, key))
        return Stored(*found) if found else None

    def commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        """Every write or none, in one transaction (see the module)."""
        self._check_open("commit()")
        if not writes:
            return {}
        plan = self._plan(writes)  # values it took from the cache stay out if this fails
        versions = self._send(plan)
        with self._cache_lock:
            cache = self._cache
            for step in plan:  # in key order: a key's last step is what it holds now
                key = step.write.key
                if step.owned is None:  # the caller's value: never kept
                    cache.pop(key, None)
                    continue
                cache[key] = _Cached(versions[key], step.owned, step.log_size, step.base_size)
                cache.move_to_end(key)
            while len(cache) > CACHED_DOCS:
                cache.popitem(last=False)
        return versions

    def _send(self, plan: list[_Step]) -> dict[DocKey, int]:
        """The commit, sent; when the connection is lost on the way, what happened is read
        back: landed (its versions), or nothing happened (sent once more, on a connection
        the pool has just checked)."""
        token = random.getrandbits(63)  # marks this commit's rows: _resolve knows them
        for attempt in (1, 2):
            try:
                return self._run("commit()", lambda conn: self._commit(conn, plan, token))
            except _Lost as lost:
                self._dead("commit()", lost.error)
                found = self._resolve(plan, token)
                if found is not None:
                    return found
                if attempt == 2:
                    raise StorageError(
                        f"PostgreSQL store {self.url}: commit() lost its connection twice; "
                        f"nothing was committed ({self._why(lost.error)})") from None
        raise AssertionError("unreachable")

    def keys(self, space: str) -> Iterable[DocKey]:
        """Every document key in ``space``."""
        self._check_open("keys()")
        if "\x00" in space:
            return []
        rows = self._run("keys()", lambda conn: conn.execute(
            "SELECT space, scope, id FROM celldialog_docs WHERE space = %s", (space,)
        ).fetchall())
        return [DocKey(*r) for r in rows]

    def renew_lease(self, holder: str, ttl: float) -> bool:
        """The lease contract (``runtime.storage.base``), on the server's clock."""
        self._check_open("renew_lease()")
        check_lease_holder(holder, "renew_lease()")
        check_lease_ttl(ttl, "renew_lease()")
        return self._run("renew_lease()", lambda conn: conn.execute(
            _RENEW, (holder, float(ttl))).rowcount == 1)

    def lease_remaining(self, holder: str) -> float | None:
        """Seconds left on the server's clock; None: no such lease."""
        self._check_open("lease_remaining()")
        check_lease_holder(holder, "lease_remaining()")
        row = self._run("lease_remaining()", lambda conn: conn.execute(
            _REMAINING, (holder,)).fetchone())
        return None if row is None else float(row[0])

    def release_lease(self, holder: str) -> None:
        """Drop the lease (and those expired an hour ago)."""
        self._check_open("release_lease()")
        check_lease_holder(holder, "release_lease()")
        self._run("release_lease()", lambda conn: conn.execute(
            _RELEASE, (holder, LEASE_COLLECT_AFTER)))

    def close(self) -> None:
        """Close the pool; feeds still open end at their next batch."""
        if self._closed:
            return
        self._closed = True
        with self._cache_lock:
            self._cache.clear()
        self._pool.close()

    def __repr__(self) -> str:
        return f"PostgresStore({self.url!r}{', closed' if self._closed else ''})"

    # -- the change feed (runtime.storage.feed) -----------------------------------------

    def versions(self, keys: Sequence[DocKey]) -> dict[DocKey, int]:
        """The current version of each key that exists (a query per 1,000 keys)."""
        return {DocKey(s, sc, i): v for s, sc, i, v in self._by_keys("versions()", _VERSIONS,
                                                                     keys)}

    def load_many(self, keys: Sequence[DocKey]) -> dict[DocKey, Stored]:
        """The value and version of each key that exists (a query per 1,000 keys)."""
        out: dict[DocKey, Stored] = {}
        current: DocKey | None = None
        value: Any = None
        for space, scope, id_, version, text, patch in self._by_keys("load_many()",
                                                                     _LOAD_MANY, keys):
            key = DocKey(space, scope, id_)
            if key != current:
                current, value = key, self._decode(key, text)
            if patch is not None:
                value = apply_patch(key, value, self._decode(key, patch), copy_values=False)
            out[key] = Stored(value, version)
        return out

    def _by_keys(self, what: str, sql: str, keys: Sequence[DocKey]) -> list[Any]:
        """The rows of ``sql`` for ``keys`` (each once; NUL-holding ones cannot exist),
        1,000 keys a query; a key's rows are never split between queries."""
        self._check_open(what)
        todo = list(dict.fromkeys(k for k in keys if not _has_nul(k)))
        rows: list[Any] = []
        for i in range(0, len(todo), KEYS_PER_QUERY):
            chunk = todo[i:i + KEYS_PER_QUERY]
            rows += self._run(what, lambda conn, c=chunk: conn.execute(
                sql, _columns(c)).fetchall())
        return rows

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[Changes | None]]:
        """Follow the ``celldialog`` channel on a connection of its own (``pg_feed``)."""
        self._check_open("watch()")
        if not _on_asyncio():
            raise StoreConfigError(
                "the PostgreSQL change feed listens with psycopg's async connection, which "
                "needs asyncio (anyio's default backend); run on asyncio, or pass "
                "Runtime(follow=False) to go without the feed")
        listener = Listener(self._psycopg, self._listen, lambda: self._closed)
        try:
            yield listener
        finally:
            with anyio.CancelScope(shield=True):
                await listener.aclose()

    # -- connections --------------------------------------------------------------------

    def _configure(self, conn: Any) -> None:
        if self.options.prepare:  # a connection of its own (no transaction pooler)
            conn.execute(f"SET lock_timeout = {self._lock_ms}")

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise StoreClosedError(
                f"{what} on PostgreSQL store {self.url} after close(); open the store again "
                f"(PostgresStore(url) or open_store('postgresql://...'))"
            )

    def _why(self, e: BaseException) -> str:
        """A driver's message, on one line, without the URL's passwords."""
        return scrub(" ".join(str(e).split()) or type(e).__name__, self._secrets)

    def _opening(self, e: BaseException) -> StorageError:
        return StorageError(f"cannot open PostgreSQL store {self.url}: {self._why(e)}")

    def _run(self, what: str, op: Callable[[Any], T]) -> T:
        """``op(conn)`` on a pooled connection. A connection found dead is retried once, on
        a connection the pool has just checked, when ``op`` is safe to repeat (a read or a
        lease call; a commit raises ``_Lost`` instead, for ``_send``). Driver errors come
        out as ``StorageError``."""
        psycopg = self._psycopg
        for attempt in (1, 2):
            try:
                with self._pool.connection() as conn:
                    return op(conn)
            except _Lost:
                raise
            except psycopg.OperationalError as e:
                if attempt == 2 or not _is_disconnect(e):
                    raise self._error(what, e) from None
                self._dead(what, e)
            except psycopg.Error as e:
                raise self._error(what, e) from None
            except StorageError:
                raise
            except Exception as e:  # the pool's own (PoolTimeout, PoolClosed)
                if self._closed:
                    raise StoreClosedError(f"{what} on PostgreSQL store {self.url} after "
                                           f"close()") from None
                raise StorageError(f"PostgreSQL store {self.url}: {what} failed: "
                                   f"{self._why(e)}") from None
        raise AssertionError("unreachable")

    def _dead(self, what: str, e: BaseException) -> None:
        """A connection died (a restart, a failover, an idle one killed): its idle siblings
        likely did too; the pool checks them all before the retry takes one."""
        log.info("PostgreSQL store %s: %s found its connection dead; retrying on a checked "
                 "one: %s", self.url, what, self._why(e))
        try:
            self._pool.check()
        except Exception:  # the retry reports what is wrong
            pass

    def _error(self, what: str, e: BaseException) -> StorageError:
        errors = self._psycopg.errors
        if isinstance(e, errors.LockNotAvailable):
            return StoreBusyError(
                f"PostgreSQL store {self.url}: {what} waited "
                f"{self.options.busy_timeout:g} s (busy_timeout) for a row another "
                f"transaction holds; nothing was committed. Retry later, or wait longer: "
                f"'postgresql://...?busy_timeout=30'")
        if isinstance(e, errors.ProgramLimitExceeded):
            if "notif" in str(e).lower():
                return StorageError(
                    f"PostgreSQL store {self.url}: {what} failed: the server's NOTIFY queue "
                    f"is full (a listening process stopped reading: find it with "
                    f"pg_notification_queue_usage() and pg_stat_activity); nothing was "
                    f"committed ({self._why(e)})")
            return StorageError(
                f"PostgreSQL store {self.url}: {what} failed: a document's key is too long "
                f"for PostgreSQL's index (space, scope and id together must stay under about "
                f"2,700 bytes); nothing was committed ({self._why(e)})")
        return StorageError(f"PostgreSQL store {self.url}: {what} failed: {self._why(e)}")

    def _migrate(self, conn: Any) -> None:
        """Create the tables a database lacks, once, under an advisory lock."""
        if self._missing(conn):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('celldialog schema'))")
                if self._missing(conn):
                    conn.execute(_SCHEMA)

    @staticmethod
    def _missing(conn: Any) -> bool:
        row = conn.execute("SELECT " + ", ".join(f"to_regclass('{t}')" for t in _TABLES)
                           + f", to_regprocedure('{_FUNCTION}')").fetchone()
        return any(v is None for v in row)

    # -- reading -----------------------------------------------------------------------

    def _read(self, conn: Any, key: DocKey) -> tuple[Any, int] | None:
        found = self._read_sized(conn, key)
        return None if found is None else (found.value, found.version)

    def _read_sized(self, conn: Any, key: DocKey) -> _Cached | None:
        """The value and version, with the sizes of the base and the log (in bytes of JSON
        text) that decide when a patch is written as a whole value instead."""
        rows = conn.execute(_LOAD, key).fetchall()
        if not rows:
            return None
        version, text, log_size, base_size = rows[0][:4]
        value = self._decode(key, text)
        for *_, patch in rows:
            if patch is not None:
                value = apply_patch(key, value, self._decode(key, patch), copy_values=False)
        return _Cached(version, value, log_size, base_size)

    def _decode(self, key: DocKey, text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError as e:
            raise StorageError(f"PostgreSQL store {self.url}: {describe(key)} holds text "
                               f"that is not JSON: {e}") from e

    # -- writing -----------------------------------------------------------------------

    def _plan(self, writes: Sequence[Write]) -> list[_Step]:
        """The writes as steps, serialised and checked before anything is sent, in key order
        (one key's writes in their order), so concurrent commits lock rows in one order.
        A patch is checked against the value it applies to, taken out of the cache (this
        commit owns it: another thread never patches the same object) or read; one that
        would make the log outgrow the base is written as the whole value instead (what a
        compaction would do, without a statement of its own)."""
        plan: list[_Step] = []
        state: dict[DocKey, _Cached] = {}  # this commit's view of each key it writes
        undo: list[Callable[[], None]] = []
        ordered = sorted(writes, key=lambda w: w.key)
        try:
            for i, w in enumerate(ordered):
                key = w.key
                if _has_nul(key):
                    raise StoreConfigError(
                        f"cannot store {describe(key)}: PostgreSQL text cannot hold the NUL "
                        f"character (\\x00); use keys without it")
                nxt = ordered[i + 1] if i + 1 < len(ordered) else None
                again = nxt is not None and nxt.key == key  # written again in this commit
                if w.patch is None:
                    text = _dumps(key, w.value)
                    plan.append(_Step(w, text, "put"))
                    state.pop(key, None)
                    if again and nxt is not None and nxt.patch is not None:
                        # the next patch's base (its version unknown before the write when
                        # expect is None: its own SQL checks it)
                        state[key] = _Cached(-1 if w.expect is None else w.expect + 1,
                                             copy_value(w.value), 0, len(text))
                    continue
                base = state.get(key)
                if base is None or (base.version != -1 and base.version != w.expect):
                    base = self._current(key, w.expect)  # type: ignore[arg-type]
                try:
                    value = apply_patch(key, base.value, w.patch, undo)
                except StorageError:
                    self._stale(key, w.expect)  # type: ignore[arg-type]
                    raise
                patch = _dumps(key, [[list(p), v] for p, v in w.patch])
                if base.value is MISSING or base.log_size + len(patch) > base.base_size:
                    # a new document (its first write is a base), or a log that would
                    # outgrow its base: the whole value, at the expected version
                    step = _Step(w, _dumps(key, value), "put", value)
                    step.log_size, step.base_size = 0, len(step.text)
                else:
                    step = _Step(w, patch, "append", value)
                    step.log_size = base.log_size + len(patch)
                    step.base_size = base.base_size
                plan.append(step)
                state[key] = _Cached(w.expect + 1, value,  # type: ignore[operator]
                                     step.log_size, step.base_size)
        except BaseException:
            for step_back in reversed(undo):
                step_back()
            raise
        return plan

    def _stale(self, key: DocKey, expect: int) -> None:
        """A patch that does not apply: a conflict if the document moved on since
        ``expect`` (raised here), else the caller's bad path (the caller raises)."""
        if expect == 0:
            return
        have = self.versions([key]).get(key, 0)
        if have != expect:
            raise conflict(key, have, expect)

    def _current(self, key: DocKey, version: int) -> _Cached:
        """The value at ``version`` with its sizes (MISSING for version 0), taken out of the
        cache or read. Another version in the database is a conflict, raised now."""
        if version == 0:
            return _Cached(0, MISSING, 0, 0)
        with self._cache_lock:
            cached = self._cache.pop(key, None)
        if cached is not None and cached.version == version:
            return cached
        found = self._run("commit()", lambda conn: self._read_sized(conn, key))
        have = found.version if found else 0
        if found is None or have != version:
            raise conflict(key, have, version)
        return found

    def _commit(self, conn: Any, plan: list[_Step], token: int) -> dict[DocKey, int]:
        """A single write is one statement, its own transaction (autocommit): one round
        trip; its ``CONFLICT`` undoes it. Several are ``BEGIN``, the writes and a sync in
        one pipeline, then ``COMMIT`` (or ``ROLLBACK`` when one matched no row): two round
        trips, however many documents. The writes never fail on purpose there: psycopg,
        which prepares a statement on its fifth use, could take one the server skipped
        after an error as prepared. A conflict reads the versions to say which and why.
        (Behind a transaction pooler the transaction also sets its ``lock_timeout``.)"""
        psycopg = self._psycopg
        try:
            if len(plan) == 1 and self.options.prepare:
                return {plan[0].write.key: conn.execute(*_statement(plan[0], token)
                                                        ).fetchone()[0]}
            rows = self._pipeline(conn, plan, token)
            if any(row is None for row in rows):
                conn.execute("ROLLBACK")
                raise self._which_conflict(conn, plan)
            conn.execute("COMMIT")
        except psycopg.Error as e:
            if e.sqlstate == CONFLICT:
                raise self._which_conflict(conn, plan) from None
            if isinstance(e, psycopg.OperationalError) and _is_disconnect(e):
                raise _Lost(e) from e
            raise
        return {step.write.key: row[0] for step, row in zip(plan, rows, strict=True)}

    def _pipeline(self, conn: Any, plan: list[_Step], token: int) -> list[Any]:
        """``BEGIN`` and every write in one round trip; each write's row (None: it matched
        none). A server error rolls the transaction back before it is raised."""
        psycopg = self._psycopg
        failed: Exception | None = None
        with conn.pipeline() as pipeline:
            conn.execute("BEGIN")
            if not self.options.prepare:
                conn.execute(_LOCK_TIMEOUT, (f"{self._lock_ms}ms",))
            cursors = [conn.execute(*_statement(step, token, alone=False)) for step in plan]
            try:
                pipeline.sync()  # inside the block: the pipeline ends clean, nothing logged
            except psycopg.Error as e:
                failed = e
        if failed is not None:
            if not conn.closed and conn.info.transaction_status != 0:  # not idle
                conn.execute("ROLLBACK")
            raise failed
        return [cur.fetchone() for cur in cursors]

    def _which_conflict(self, conn: Any, plan: list[_Step]) -> StorageError:
        """The first write whose expected version is not the document's (in the commit's
        order, each key's versions followed through its own writes)."""
        have = self._versions_on(conn, [step.write.key for step in plan])
        mine: set[DocKey] = set()  # keys an earlier write of this commit moved
        for step in plan:
            key, expect = step.write.key, step.write.expect
            now = have.get(key, 0)
            if expect is not None and expect != now:
                if key in mine:
                    return ConflictError(
                        f"{describe(key)} is written twice in this commit and the second "
                        f"write expects version {expect}, but the first leaves it at {now}; "
                        f"nothing was committed. Expect the version each write leaves")
                return conflict(key, now, expect)
            have[key] = now + 1
            mine.add(key)
        return StorageError(f"PostgreSQL store {self.url}: commit() was refused as a "
                            f"conflict, but every version now matches; nothing was "
                            f"committed. Run it again")

    @staticmethod
    def _versions_on(conn: Any, keys: list[DocKey]) -> dict[DocKey, int]:
        rows = conn.execute(_VERSIONS, _columns(list(dict.fromkeys(keys)))).fetchall()
        return {DocKey(a, b, c): v for a, b, c, v in rows}

    def _resolve(self, plan: list[_Step], token: int) -> dict[DocKey, int] | None:
        """After the connection was lost mid-commit: did it land? Every row this commit
        writes carries its ``token``. All of them carrying it: it landed (its versions).
        None carrying it: it did not land, for sure where each document is still at the
        version the commit expected (None: send it again) or exactly one version past it
        (another writer's: ``ConflictError``). Anything else (ours landed and others wrote
        on top?) raises ``StorageError`` saying the outcome is unknown."""
        keys = list(dict.fromkeys(step.write.key for step in plan))
        rows = self._run("commit()", lambda conn: conn.execute(
            _TOKENS, _columns(keys)).fetchall())
        now = {DocKey(a, b, c): (v, t) for a, b, c, v, t in rows}
        expect: dict[DocKey, int | None] = {}
        for step in plan:
            expect.setdefault(step.write.key, step.write.expect)
        ours = [now.get(k, (0, None))[1] == token for k in keys]
        if all(ours):
            return {k: now[k][0] for k in keys}
        if not any(ours):
            moved = None
            for k in keys:
                if expect[k] is None:
                    continue  # a "last writer wins" write: sending it again is what it means
                have = now.get(k, (0, None))[0]
                if have == expect[k] + 1:  # type: ignore[operator]
                    moved = moved or (k, have)
                elif have != expect[k]:
                    break
            else:
                if moved is None:
                    return None
                raise conflict(moved[0], moved[1], expect[moved[0]])  # type: ignore[arg-type]
        raise StorageError(
            f"PostgreSQL store {self.url}: the connection was lost while committing; the "
            f"commit may or may not have been stored (other writers have written since). "
            f"Load the documents to see")


def _statement(step: _Step, token: int, *, alone: bool = True) -> tuple[str, tuple[Any, ...]]:
    """The SQL of one write and its arguments (the notification's payload given when the
    new version is known here, else built by the server; ``token`` marks the commit).
    ``alone``: the commit's only write, raising ``CONFLICT``; else quiet (no row)."""
    w, text, key = step.write, step.text, step.write.key
    version = None if w.expect is None else w.expect + 1
    notification = payload(key, version)
    tail = (notification, *key)
    if step.kind == "append":
        sql, args = _APPEND, (len(text), token, *key, w.expect, *key, text, *tail)
    elif w.expect is None:
        sql, args = _UPSERT, (*key, len(text), text, token, *key, *tail)
    elif w.expect == 0:
        sql, args = _CREATE, (*key, len(text), text, token, *tail)
    else:
        sql, args = _PUT, (len(text), text, token, *key, w.expect, *key, *tail)
    return (sql if alone else _QUIET[sql]), args


_QUIET = {sql: sql.removesuffix(_RAISE) for sql in (_APPEND, _UPSERT, _CREATE, _PUT)}


class _Cached(NamedTuple):
    """A document as a commit needs it: its version, value (owned: patched in place) and
    the sizes of its base and log."""

    version: int
    value: Any
    log_size: int
    base_size: int


class _Step:
    """One write of a commit, ready before anything is sent: ``put`` a whole value
    (``text``) or ``append`` a patch (``text``). ``owned`` is the document after it when
    the store owns that value (not the caller's), kept in the cache after the commit;
    ``log_size``/``base_size`` what the row will hold."""

    __slots__ = ("base_size", "kind", "log_size", "owned", "text", "write")

    def __init__(self, write: Write, text: str, kind: str, owned: Any = None) -> None:
        self.write = write
        self.text = text
        self.kind = kind
        self.owned = owned
        self.log_size = 0
        self.base_size = 0


def _on_asyncio() -> bool:
    import sniffio

    return bool(sniffio.current_async_library() == "asyncio")


class _Lost(Exception):
    """The connection was lost while a commit was on its way: ``_resolve`` finds out
    whether it landed."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _is_disconnect(e: BaseException) -> bool:
    conn_error = getattr(e, "sqlstate", None)
    return conn_error is None or conn_error.startswith(("08", "57P"))




