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
the base's version; ``celldialog_patches`` the patches committed since the base, one row per
version; ``celldialog_leases`` the leases, on the server's clock (``clock_timestamp()``), the
one every machine sharing the database reads. As in SQLite, a patch is appended, not merged,
and the base is rewritten when the log outgrows it: a write costs what it changes.

A commit is one transaction. Values and patches are serialised, and patches checked against
the value they apply to, before ``BEGIN``; inside it each write is one conditional statement
(``UPDATE ... WHERE version = expect``, ``INSERT ... ON CONFLICT DO NOTHING`` to create if
absent): a row count short of one rolls everything back and raises ``ConflictError``. Writes
go in key order, so two commits never deadlock on each other's rows. The same transaction
sends ``pg_notify('celldialog', ...)`` with the keys and new versions (no values), split
under 8,000 bytes: the change feed (``runtime.storage.feed``), which ``watch()`` follows on
one listening connection of its own (psycopg's async connection).

Connections: idle ones are closed after ``max_idle`` (a cloud database kills them
anyway) and TCP keepalives are on, so a long model call never finds a dead socket. A
connection lost before ``COMMIT`` was sent is retried once on a new one (nothing was
committed); one lost during ``COMMIT`` raises ``StorageError`` saying the outcome is unknown.
Errors never show the URL's password.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
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
from .feed import Changes
from .patch import MISSING, apply_patch, conflict, copy_value, describe
from .pg_feed import CHANNEL, Listener, payloads
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
"""
_TABLES = ("celldialog_docs", "celldialog_patches", "celldialog_leases")
_KEY = "space = %s AND scope = %s AND id = %s"
# the base and the log since it, in one statement (one snapshot)
_LOAD = (
    "SELECT d.version, d.value, p.patch FROM celldialog_docs d "
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
# a whole value: the new base (its log deleted), conditional on the expected version
_PUT = (
    "WITH u AS (UPDATE celldialog_docs SET version = version + 1, "
    "base_version = version + 1, base_size = %s, log_size = 0, value = %s "
    f"WHERE {_KEY} AND version = %s RETURNING version), "
    "d AS (DELETE FROM celldialog_patches p USING u "
    "WHERE p.space = %s AND p.scope = %s AND p.id = %s) SELECT version FROM u"
)
_UPSERT = (
    "WITH u AS (INSERT INTO celldialog_docs AS t "
    "(space, scope, id, version, base_version, base_size, log_size, value) "
    "VALUES (%s, %s, %s, 1, 1, %s, 0, %s) ON CONFLICT (space, scope, id) DO UPDATE SET "
    "version = t.version + 1, base_version = t.version + 1, base_size = excluded.base_size, "
    "log_size = 0, value = excluded.value RETURNING version), "
    "d AS (DELETE FROM celldialog_patches p USING u "
    "WHERE p.space = %s AND p.scope = %s AND p.id = %s) SELECT version FROM u"
)
_CREATE = (
    "INSERT INTO celldialog_docs "
    "(space, scope, id, version, base_version, base_size, log_size, value) "
    "VALUES (%s, %s, %s, 1, 1, %s, 0, %s) ON CONFLICT (space, scope, id) DO NOTHING "
    "RETURNING version"
)
# a patch: appended to the log, conditional on the expected version
_APPEND = (
    "WITH u AS (UPDATE celldialog_docs SET version = version + 1, log_size = log_size + %s "
    f"WHERE {_KEY} AND version = %s RETURNING version, log_size, base_size), "
    "p AS (INSERT INTO celldialog_patches (space, scope, id, version, patch) "
    "SELECT %s, %s, %s, version, %s FROM u) SELECT version, log_size, base_size FROM u"
)
_COMPACT = (
    "WITH u AS (UPDATE celldialog_docs SET base_version = version, base_size = %s, "
    f"log_size = 0, value = %s WHERE {_KEY} RETURNING version), "
    "d AS (DELETE FROM celldialog_patches p USING u "
    "WHERE p.space = %s AND p.scope = %s AND p.id = %s) SELECT version FROM u"
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
        versions = self._run("commit()", lambda conn: self._commit(conn, plan), retry=False)
        with self._cache_lock:
            cache = self._cache
            for step in plan:
                if step.kind == "patch":
                    cache[step.write.key] = (versions[step.write.key], step.value)
                    cache.move_to_end(step.write.key)
                else:
                    cache.pop(step.write.key, None)
            while len(cache) > CACHED_DOCS:
                cache.popitem(last=False)
        return versions

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
        self._check_open("versions()")
        out: dict[DocKey, int] = {}
        todo = list(dict.fromkeys(k for k in keys if not _has_nul(k)))
        for i in range(0, len(todo), KEYS_PER_QUERY):
            chunk = todo[i:i + KEYS_PER_QUERY]
            rows = self._run("versions()", lambda conn, c=chunk: conn.execute(
                _VERSIONS, _columns(c)).fetchall())
            out.update((DocKey(s, sc, i_), v) for s, sc, i_, v in rows)
        return out

    def load_many(self, keys: Sequence[DocKey]) -> dict[DocKey, Stored]:
        """The value and version of each key that exists (a query per 1,000 keys)."""
        self._check_open("load_many()")
        out: dict[DocKey, Stored] = {}
        todo = list(dict.fromkeys(k for k in keys if not _has_nul(k)))
        for i in range(0, len(todo), KEYS_PER_QUERY):
            chunk = todo[i:i + KEYS_PER_QUERY]
            rows = self._run("load_many()", lambda conn, c=chunk: conn.execute(
                _LOAD_MANY, _columns(c)).fetchall())
            current: DocKey | None = None
            value: Any = None
            for space, scope, id_, version, text, patch in rows:
                key = DocKey(space, scope, id_)
                if key != current:
                    current, value = key, self._decode(key, text)
                if patch is not None:
                    value = apply_patch(key, value, self._decode(key, patch),
                                        copy_values=False)
                out[key] = Stored(value, version)
        return out

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[Changes | None]]:
        """Follow the ``celldialog`` channel on a connection of its own (``pg_feed``)."""
        self._check_open("watch()")
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

    def _run(self, what: str, op: Callable[[Any], T], *, retry: bool = True) -> T:
        """``op(conn)`` on a pooled connection. A connection found dead is retried once, on
        a connection the pool has just checked, when ``op`` is safe to repeat (a read, or a
        commit that never reached ``COMMIT``: ``_commit`` raises ``_Unsent`` then). Driver
        errors come out as ``StorageError``."""
        psycopg = self._psycopg
        for attempt in (1, 2):
            try:
                with self._pool.connection() as conn:
                    return op(conn)
            except _Unsent as e:
                if attempt == 2:
                    raise self._error(what, e.error) from None
                self._dead(what, e.error)
            except psycopg.OperationalError as e:
                if not retry or attempt == 2 or not _is_disconnect(e):
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
                           ).fetchone()
        return any(v is None for v in row)

    # -- reading -----------------------------------------------------------------------

    def _read(self, conn: Any, key: DocKey) -> tuple[Any, int] | None:
        rows = conn.execute(_LOAD, key).fetchall()
        if not rows:
            return None
        version, text = rows[0][0], rows[0][1]
        value = self._decode(key, text)
        for _, _, patch in rows:
            if patch is not None:
                value = apply_patch(key, value, self._decode(key, patch), copy_values=False)
        return value, version

    def _decode(self, key: DocKey, text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError as e:
            raise StorageError(f"PostgreSQL store {self.url}: {describe(key)} holds text "
                               f"that is not JSON: {e}") from e

    # -- writing -----------------------------------------------------------------------

    def _plan(self, writes: Sequence[Write]) -> list[_Step]:
        """The writes as steps, serialised and checked before the transaction, in key order
        (one key's writes in their order), so concurrent commits lock rows in one order.
        A patch is checked against the value it applies to, taken out of the cache (this
        commit owns it: another thread never patches the same object) or read."""
        plan: list[_Step] = []
        state: dict[DocKey, tuple[int | None, Any]] = {}  # this commit's view of each key
        last: dict[DocKey, _Step] = {}  # each key's latest patch step in this commit
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
                    plan.append(_Step("put", w, _dumps(key, w.value)))
                    last.pop(key, None)
                    if again:  # its base (a version unknown before the write when expect
                        # is None: the SQL checks the next write's expect)
                        state[key] = (None if w.expect is None else w.expect + 1,
                                      copy_value(w.value))
                    continue
                base = state.get(key)
                if base is None or (base[0] is not None and base[0] != w.expect):
                    base = (w.expect, self._current(key, w.expect))  # type: ignore[arg-type]
                elif key in last:  # patched again: the earlier step's base text, now
                    last[key].snapshot = _dumps(key, base[1])
                try:
                    value = apply_patch(key, base[1], w.patch, undo)
                except StorageError:
                    self._stale(key, w.expect)  # type: ignore[arg-type]
                    raise
                if base[1] is MISSING:  # a new document: its first write is a base
                    plan.append(_Step("put", w, _dumps(key, value)))
                    state[key] = (1, value)
                    continue
                state[key] = (w.expect + 1, value)  # type: ignore[operator]
                step = last[key] = _Step("patch", w, _dumps(key, [[list(p), v]
                                                                  for p, v in w.patch]), value)
                plan.append(step)
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

    def _current(self, key: DocKey, version: int) -> Any:
        """The value at ``version``, MISSING for version 0; taken out of the cache or read.
        Another version in the database is a conflict, raised now."""
        if version == 0:
            return MISSING
        with self._cache_lock:
            cached = self._cache.pop(key, None)
        if cached is not None and cached[0] == version:
            return cached[1]
        found = self._run("commit()", lambda conn: self._read(conn, key))
        have = found[1] if found else 0
        if found is None or have != version:
            raise conflict(key, have, version)
        return found[0]

    def _commit(self, conn: Any, plan: list[_Step]) -> dict[DocKey, int]:
        psycopg = self._psycopg
        out: dict[DocKey, int] = {}
        try:
            conn.execute("BEGIN")
            if not self.options.prepare:  # behind a transaction pooler: this transaction's
                conn.execute(f"SET LOCAL lock_timeout = {self._lock_ms}")
        except psycopg.OperationalError as e:
            if _is_disconnect(e):
                raise _Unsent(e) from e
            raise
        try:
            for step in plan:
                w, text, key = step.write, step.text, step.write.key
                if step.kind == "put":
                    if w.expect is None:
                        row = conn.execute(_UPSERT, (*key, len(text), text, *key)).fetchone()
                    elif w.expect == 0:
                        row = conn.execute(_CREATE, (*key, len(text), text)).fetchone()
                    else:
                        row = conn.execute(_PUT, (len(text), text, *key, w.expect, *key)
                                           ).fetchone()
                else:
                    row = conn.execute(_APPEND, (len(text), *key, w.expect, *key, text)
                                       ).fetchone()
                    if row is not None and row[1] > row[2]:  # the log outgrew the base
                        base = step.snapshot or _dumps(key, step.value)
                        conn.execute(_COMPACT, (len(base), base, *key, *key))
                if row is None:
                    have = conn.execute(f"SELECT version FROM celldialog_docs WHERE {_KEY}",
                                        key).fetchone()
                    raise conflict(key, have[0] if have else 0, w.expect or 0)
                out[key] = row[0]
            for payload in payloads(out):
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
        except psycopg.OperationalError as e:
            if _is_disconnect(e):
                raise _Unsent(e) from e  # COMMIT was never sent: nothing happened
            _rollback(conn)
            raise
        except BaseException:
            _rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except psycopg.OperationalError as e:
            if _is_disconnect(e):
                raise StorageError(
                    f"PostgreSQL store {self.url}: the connection was lost while committing; "
                    f"the commit may or may not have been stored. Load the documents to see "
                    f"({self._why(e)})") from None
            raise
        return out


class _Step:
    """One write of a commit, ready before ``BEGIN``: ``put`` a whole value (``text``) or
    append a ``patch`` (``text``; ``value`` is the document after it, for the cache and a
    compaction; ``snapshot`` that value as text, when a later patch of this commit changes
    the same object before the compaction would serialise it)."""

    __slots__ = ("kind", "snapshot", "text", "value", "write")

    def __init__(self, kind: str, write: Write, text: str, value: Any = None) -> None:
        self.kind = kind
        self.write = write
        self.text = text
        self.value = value
        self.snapshot: str | None = None


class _Unsent(Exception):
    """The connection died before ``COMMIT`` was sent: safe to run the commit again."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _rollback(conn: Any) -> None:
    try:
        conn.execute("ROLLBACK")
    except Exception:  # the connection is gone: the server rolled back
        pass


def _is_disconnect(e: BaseException) -> bool:
    conn_error = getattr(e, "sqlstate", None)
    return conn_error is None or conn_error.startswith(("08", "57P"))




