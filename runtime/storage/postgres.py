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
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

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
from .feed import RECHECK, Changes, merge
from .patch import MISSING, apply_patch, conflict, copy_value, describe

__all__ = ["CHANNEL", "NOTIFY_LIMIT", "PostgresStore", "redact"]

log = logging.getLogger("celldialog.postgres")
T = TypeVar("T")

CHANNEL = "celldialog"
NOTIFY_LIMIT = 7900  # bytes of one notification's payload (PostgreSQL's limit is 8,000)
CACHED_DOCS = 256  # documents whose current value is kept to check patches against
DEFAULT_POOL_SIZE = 4
DEFAULT_BUSY_TIMEOUT = 5.0
MAX_IDLE = 300.0  # seconds before an idle pooled connection is closed
KEYS_PER_QUERY = 1000
_OPTIONS = ("pool_size", "prepare", "busy_timeout", "listen_url")
_KEEPALIVE = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10",
              "keepalives_count": "3"}

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


def redact(url: str) -> str:
    """``url`` with its password (in the authority or the query) shown as ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a PostgreSQL URL that cannot be parsed>"
    netloc = parts.netloc
    if "@" in netloc:
        auth, _, host = netloc.rpartition("@")
        if ":" in auth:
            auth = auth.split(":", 1)[0] + ":***"
        netloc = f"{auth}@{host}"
    query = re.sub(r"(?i)(^|&)([^=&]*password)=[^&]*", r"\1\2=***", parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url  # nothing secret in it: as given
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _dumps(key: DocKey, value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise StorageError(f"cannot store {describe(key)}: the value is not JSON ({e})") from e


def _has_nul(key: DocKey) -> bool:
    return "\x00" in key.space or "\x00" in key.scope or "\x00" in key.id


def _columns(keys: Sequence[DocKey]) -> tuple[list[str], list[str], list[str]]:
    return [k.space for k in keys], [k.scope for k in keys], [k.id for k in keys]


def parse_url(url: str) -> tuple[str, dict[str, Any]]:
    """The libpq URL without our options, and our options, checked."""
    parts = urlsplit(url)
    ours: dict[str, Any] = {"pool_size": DEFAULT_POOL_SIZE, "prepare": True,
                            "busy_timeout": DEFAULT_BUSY_TIMEOUT, "listen_url": None}
    rest: list[tuple[str, str]] = []
    for name, text in parse_qsl(parts.query, keep_blank_values=True):
        if name not in _OPTIONS:
            rest.append((name, text))
            continue
        shown = redact(url)
        if name == "listen_url":
            if not text.startswith(("postgresql://", "postgres://")):
                raise StoreConfigError(f"listen_url in store {shown!r} is a libpq URL "
                                       f"(percent-encoded), 'postgresql://...'; got "
                                       f"{redact(text)!r}")
            ours[name] = parse_url(text)[0]
        elif name == "pool_size":
            if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 100):
                raise StoreConfigError(f"pool_size in store {shown!r} is the number of "
                                       f"pooled connections, 1 to 100; got {text!r}")
            ours[name] = int(text)
        elif name == "prepare":
            if text.lower() not in ("on", "off", "true", "false", "1", "0"):
                raise StoreConfigError(f"prepare in store {shown!r} is on or off (off for "
                                       f"PgBouncer in transaction mode); got {text!r}")
            ours[name] = text.lower() in ("on", "true", "1")
        else:
            try:
                seconds = float(text)
            except ValueError:
                seconds = -1.0
            if not 0 <= seconds < math.inf:
                raise StoreConfigError(f"busy_timeout in store {shown!r} is the seconds to "
                                       f"wait for a locked row, a number >= 0; got {text!r}")
            ours[name] = seconds
    host = dict(rest).get("host", parts.hostname or "")
    if not host.startswith("/"):  # TCP: keepalives, unless the URL says otherwise
        have = {n for n, _ in rest}
        rest += [(n, v) for n, v in _KEEPALIVE.items() if n not in have]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest),
                       parts.fragment)), ours


class PostgresStore:
    def __init__(self, url: str, *, pool_size: int | None = None, prepare: bool | None = None,
                 busy_timeout: float | None = None, listen_url: str | None = None) -> None:
        psycopg = _psycopg()
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise StoreConfigError("a PostgreSQL store takes a libpq URL: "
                                   "'postgresql://user@host:5432/dbname'")
        self.url = redact(url)
        self._conninfo, options = parse_url(url)
        if pool_size is not None:
            options["pool_size"] = pool_size
        if prepare is not None:
            options["prepare"] = prepare
        if busy_timeout is not None:
            options["busy_timeout"] = busy_timeout
        if listen_url is not None:
            options["listen_url"] = parse_url(listen_url)[0]
        self._listen = options.pop("listen_url") or self._conninfo
        self.options = options
        self._psycopg = psycopg
        self._cache: OrderedDict[DocKey, tuple[int, Any]] = OrderedDict()
        self._closed = False
        self._kwargs: dict[str, Any] = {
            "autocommit": True, "prepare_threshold": 5 if options["prepare"] else None}
        try:
            with psycopg.connect(self._conninfo, **self._kwargs) as conn:
                self._migrate(conn)
        except psycopg.Error as e:
            raise StorageError(f"cannot open PostgreSQL store {self.url}: {_why(e)}") from e
        from psycopg_pool import ConnectionPool

        self._pool = ConnectionPool(
            self._conninfo, kwargs=self._kwargs, min_size=1,
            max_size=options["pool_size"], configure=self._configure, open=False,
            name="celldialog", max_idle=MAX_IDLE, timeout=30.0, num_workers=1)
        try:
            self._pool.open(wait=True, timeout=30.0)
        except Exception as e:
            self._pool.close()
            raise StorageError(f"cannot open PostgreSQL store {self.url}: {e}") from e

    # -- the port ---------------------------------------------------------------------

    def load(self, key: DocKey) -> Stored | None:
        self._check_open("load()")
        if _has_nul(key):
            return None  # PostgreSQL text cannot hold NUL: no such document can exist
        found = self._run("load()", lambda conn: self._read(conn, key))
        return Stored(*found) if found else None

    def commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        self._check_open("commit()")
        if not writes:
            return {}
        plan = self._plan(writes)
        touched = [step[1].key for step in plan if step[0] == "patch"]
        try:
            versions = self._run("commit()", lambda conn: self._commit(conn, plan),
                                 retry=False)
        except BaseException:
            for key in touched:  # patched in place: no longer what the database holds
                self._cache.pop(key, None)
            raise
        for kind, w, _, value in plan:
            if kind == "patch":
                self._cache[w.key] = (versions[w.key], value)
                self._cache.move_to_end(w.key)
            else:
                self._cache.pop(w.key, None)
        while len(self._cache) > CACHED_DOCS:
            self._cache.popitem(last=False)
        return versions

    def keys(self, space: str) -> Iterable[DocKey]:
        self._check_open("keys()")
        if "\x00" in space:
            return []
        rows = self._run("keys()", lambda conn: conn.execute(
            "SELECT space, scope, id FROM celldialog_docs WHERE space = %s", (space,)
        ).fetchall())
        return [DocKey(*r) for r in rows]

    def renew_lease(self, holder: str, ttl: float) -> bool:
        self._check_open("renew_lease()")
        check_lease_holder(holder, "renew_lease()")
        check_lease_ttl(ttl, "renew_lease()")
        return self._run("renew_lease()", lambda conn: conn.execute(
            _RENEW, (holder, float(ttl))).rowcount == 1)

    def lease_remaining(self, holder: str) -> float | None:
        self._check_open("lease_remaining()")
        check_lease_holder(holder, "lease_remaining()")
        row = self._run("lease_remaining()", lambda conn: conn.execute(
            _REMAINING, (holder,)).fetchone())
        return None if row is None else float(row[0])

    def release_lease(self, holder: str) -> None:
        self._check_open("release_lease()")
        check_lease_holder(holder, "release_lease()")
        self._run("release_lease()", lambda conn: conn.execute(
            _RELEASE, (holder, LEASE_COLLECT_AFTER)))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._cache.clear()
        self._pool.close()

    def __repr__(self) -> str:
        return f"PostgresStore({self.url!r}{', closed' if self._closed else ''})"

    # -- the change feed (runtime.storage.feed) -----------------------------------------

    def versions(self, keys: Sequence[DocKey]) -> dict[DocKey, int]:
        self._check_open("versions()")
        out: dict[DocKey, int] = {}
        keys = [k for k in keys if not _has_nul(k)]
        for i in range(0, len(keys), KEYS_PER_QUERY):
            chunk = keys[i:i + KEYS_PER_QUERY]
            rows = self._run("versions()", lambda conn, c=chunk: conn.execute(
                _VERSIONS, _columns(c)).fetchall())
            out.update((DocKey(s, sc, i_), v) for s, sc, i_, v in rows)
        return out

    def load_many(self, keys: Sequence[DocKey]) -> dict[DocKey, Stored]:
        self._check_open("load_many()")
        out: dict[DocKey, Stored] = {}
        keys = [k for k in keys if not _has_nul(k)]
        for i in range(0, len(keys), KEYS_PER_QUERY):
            chunk = keys[i:i + KEYS_PER_QUERY]
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
        """Follow the ``celldialog`` channel on a connection of its own (see the module)."""
        self._check_open("watch()")
        listener = _Listener(self._psycopg, self._listen, redact(self._listen))
        try:
            yield listener
        finally:
            with anyio.CancelScope(shield=True):
                await listener.aclose()

    # -- connections --------------------------------------------------------------------

    def _configure(self, conn: Any) -> None:
        conn.execute(f"SET lock_timeout = {int(self.options['busy_timeout'] * 1000)}")

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise StoreClosedError(
                f"{what} on PostgreSQL store {self.url} after close(); open the store again "
                f"(PostgresStore(url) or open_store('postgresql://...'))"
            )

    def _run(self, what: str, op: Callable[[Any], T], *, retry: bool = True) -> T:
        """``op(conn)`` on a pooled connection; a connection found dead is retried once on
        a new one when ``op`` is safe to repeat (a read, or a commit that never reached
        ``COMMIT``: ``_commit`` raises ``_Unsent`` for that). Driver errors come out as
        ``StorageError``."""
        psycopg = self._psycopg
        for attempt in (1, 2):
            try:
                with self._pool.connection() as conn:
                    return op(conn)
            except _Unsent as e:
                if attempt == 2:
                    raise self._error(what, e.error) from e.error
                log.info("PostgreSQL store %s: %s found its connection dead; retrying on a "
                         "new one: %s", self.url, what, e.error)
            except psycopg.OperationalError as e:
                if not retry or attempt == 2 or not _is_disconnect(e):
                    raise self._error(what, e) from e
                log.info("PostgreSQL store %s: %s found its connection dead; retrying on a "
                         "new one: %s", self.url, what, e)
            except psycopg.Error as e:
                raise self._error(what, e) from e
            except StorageError:
                raise
            except Exception as e:  # the pool's own (PoolTimeout, PoolClosed)
                if self._closed:
                    raise StoreClosedError(f"{what} on PostgreSQL store {self.url} after "
                                           f"close()") from e
                raise StorageError(f"PostgreSQL store {self.url}: {what} failed: {e}") from e
        raise AssertionError("unreachable")

    def _error(self, what: str, e: BaseException) -> StorageError:
        errors = self._psycopg.errors
        if isinstance(e, errors.LockNotAvailable):
            return StoreBusyError(
                f"PostgreSQL store {self.url}: {what} waited "
                f"{self.options['busy_timeout']:g} s (busy_timeout) for a row another "
                f"transaction holds; nothing was committed. Retry later, or wait longer: "
                f"'postgresql://...?busy_timeout=30'")
        if isinstance(e, errors.ProgramLimitExceeded):
            return StorageError(
                f"PostgreSQL store {self.url}: {what} failed: a document's key is too long "
                f"for PostgreSQL's index (space, scope and id together must stay under about "
                f"2,700 bytes); nothing was committed ({_why(e)})")
        return StorageError(f"PostgreSQL store {self.url}: {what} failed: {_why(e)}")

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

    def _plan(self, writes: Sequence[Write]) -> list[tuple[str, Write, str, Any]]:
        """Each write as ``(kind, write, text, value)``, serialised and checked before the
        transaction: ``put`` a whole value (``text``), ``patch`` (``text`` the patch,
        ``value`` the document after it, for the cache). In key order (the order of one
        key's writes kept), so concurrent commits lock rows in one order."""
        plan: list[tuple[str, Write, str, Any]] = []
        state: dict[DocKey, tuple[int, Any]] = {}  # this commit's view of patched keys
        undo: list[Callable[[], None]] = []
        ordered = sorted(writes, key=lambda w: w.key)
        try:
            for i, w in enumerate(ordered):
                key = w.key
                if _has_nul(key):
                    raise StoreConfigError(
                        f"cannot store {describe(key)!r}: PostgreSQL text cannot hold the "
                        f"NUL character (\\x00); use keys without it")
                if w.patch is None:
                    state.pop(key, None)
                    plan.append(("put", w, _dumps(key, w.value), None))
                    nxt = ordered[i + 1] if i + 1 < len(ordered) else None
                    if nxt is not None and nxt.key == key and nxt.patch is not None:
                        # patched next in this commit: its base is this value (a version
                        # unknown before the write when expect is None: the SQL checks it)
                        state[key] = (None if w.expect is None else w.expect + 1,
                                      copy_value(w.value))
                    continue
                base = state.get(key)
                if base is None or (base[0] is not None and base[0] != w.expect):
                    base = (w.expect, self._current(key, w.expect))  # type: ignore[arg-type]
                value = apply_patch(key, base[1], w.patch, undo)
                if base[1] is MISSING:  # a new document: its first write is a base
                    state.pop(key, None)
                    plan.append(("put", w, _dumps(key, value), None))
                    continue
                state[key] = (w.expect + 1, value)  # type: ignore[operator]
                text = _dumps(key, [[list(p), v] for p, v in w.patch])
                plan.append(("patch", w, text, value))
        except BaseException:
            for step in reversed(undo):
                step()
            raise
        return plan

    def _current(self, key: DocKey, version: int) -> Any:
        """The value at ``version``, owned by the cache (patched in place); MISSING for
        version 0. Another version in the database is a conflict, raised now."""
        if version == 0:
            return MISSING
        cached = self._cache.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        found = self._run("commit()", lambda conn: self._read(conn, key))
        have = found[1] if found else 0
        if found is None or have != version:
            self._cache.pop(key, None)
            raise conflict(key, have, version)
        self._cache[key] = (have, found[0])
        return found[0]

    def _commit(self, conn: Any, plan: list[tuple[str, Write, str, Any]]) -> dict[DocKey, int]:
        psycopg = self._psycopg
        out: dict[DocKey, int] = {}
        try:
            conn.execute("BEGIN")
        except psycopg.OperationalError as e:
            if _is_disconnect(e):
                raise _Unsent(e) from e
            raise
        try:
            for kind, w, text, value in plan:
                key = w.key
                if kind == "put":
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
                        base = _dumps(key, value)
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
                    f"({_why(e)})") from e
            raise
        return out


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


def _why(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def payloads(changes: Changes) -> list[str]:
    """``changes`` as ``pg_notify`` payloads, each under ``NOTIFY_LIMIT`` bytes: JSON lists
    of ``[space, scope, id, version]``. An entry too large for one notification makes the
    payload ``"*"`` instead: readers then re-check everything they hold."""
    out: list[str] = []
    chunk: list[str] = []
    size = 2
    for key, version in changes.items():
        entry = json.dumps([key.space, key.scope, key.id, version], separators=(",", ":"))
        if len(entry) + 2 > NOTIFY_LIMIT:
            return ["*"]
        if size + len(entry) + 1 > NOTIFY_LIMIT:
            out.append("[" + ",".join(chunk) + "]")
            chunk, size = [], 2
        chunk.append(entry)
        size += len(entry) + 1
    if chunk:
        out.append("[" + ",".join(chunk) + "]")
    return out


def parse_payload(payload: str) -> Changes | None:
    """A notification's keys and versions; None (re-check everything) for ``"*"`` or
    anything that is not what ``payloads`` writes."""
    try:
        entries = json.loads(payload)
    except (ValueError, RecursionError):
        return RECHECK
    if not isinstance(entries, list):
        return RECHECK
    out: Changes = {}
    for entry in entries:
        if (not isinstance(entry, list) or len(entry) != 4
                or not all(isinstance(p, str) for p in entry[:3])
                or type(entry[3]) is not int):
            return RECHECK
        merge(out, {DocKey(entry[0], entry[1], entry[2]): entry[3]})
    return out


class _Listener:
    """The feed of one ``watch()``: a connection that ``LISTEN``s, reconnected with backoff
    when lost. Each (re)connect yields ``RECHECK`` first (``NOTIFY`` is not durable: what
    was sent while nobody listened is gone); then each batch is everything pending:
    one wait for a notification, then every one already received, each packet consumed
    whole (leaving psycopg's ``notifies()`` early drops the rest of a packet)."""

    def __init__(self, psycopg: Any, conninfo: str, shown: str) -> None:
        self._psycopg = psycopg
        self._conninfo = conninfo
        self._shown = shown
        self._conn: Any = None
        self._backoff = 0.0

    def __aiter__(self) -> AsyncIterator[Changes | None]:
        return self

    async def __anext__(self) -> Changes | None:
        psycopg = self._psycopg
        while True:
            if self._conn is None:
                await self._connect()
                return RECHECK
            batch: Changes = {}
            recheck = False
            try:
                async for n in self._conn.notifies(stop_after=1):
                    got = parse_payload(n.payload)
                    if got is None:
                        recheck = True
                    else:
                        merge(batch, got)
                async for n in self._conn.notifies(timeout=0):
                    got = parse_payload(n.payload)
                    if got is None:
                        recheck = True
                    else:
                        merge(batch, got)
            except psycopg.Error as e:
                log.warning("PostgreSQL store %s: the change feed's connection was lost; "
                            "reconnecting: %s", self._shown, _why(e))
                await self._drop()
                continue
            if recheck:
                return RECHECK
            if batch:
                return batch

    async def _connect(self) -> None:
        psycopg = self._psycopg
        while True:
            if self._backoff:
                await anyio.sleep(self._backoff)  # a backoff between attempts, not a wait
            try:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                await conn.execute(f"LISTEN {CHANNEL}")
            except psycopg.Error as e:
                self._backoff = min(max(self._backoff * 2, 0.05), 5.0)
                log.warning("PostgreSQL store %s: the change feed cannot connect (retrying "
                            "in %.2f s): %s", self._shown, self._backoff, _why(e))
                continue
            self._conn, self._backoff = conn, 0.0
            return

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if self._backoff == 0.0:
            self._backoff = 0.05
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # already gone
                pass

    async def aclose(self) -> None:
        await self._drop()
