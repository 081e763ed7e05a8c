"""Document storage backends, with the leases that say which processes are alive. Every
backend passes ``tests/storage/test_conformance.py`` (the contract: ``base.py``).

``open_store`` turns the ``store=`` string a ``Runtime`` takes into a backend, so options a
deployment needs (how long to wait for a shared SQLite file) fit in that one string.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from ..errors import StorageError, StoreBusyError, StoreClosedError, StoreConfigError
from .base import (
    LEASE_HOLDER_MAX,
    LEASE_TTL_MAX,
    ConflictError,
    DocKey,
    Store,
    Stored,
    Write,
)
from .feed import RECHECK, Changes, WatchableStore, can_watch
from .memory import MemoryStore
from .pg_url import redact
from .postgres import PostgresStore
from .sqlite import SQLiteStore

__all__ = [
    "LEASE_HOLDER_MAX",
    "LEASE_TTL_MAX",
    "RECHECK",
    "Changes",
    "ConflictError",
    "DocKey",
    "MemoryStore",
    "PostgresStore",
    "SQLiteStore",
    "StorageError",
    "Store",
    "StoreBusyError",
    "StoreClosedError",
    "Stored",
    "WatchableStore",
    "Write",
    "can_watch",
    "open_store",
    "redact",
]

_SQLITE_OPTIONS = ("busy_timeout", "feed_interval")
_PORT = ("load", "commit", "keys", "renew_lease", "lease_remaining", "release_lease", "close")


def open_store(spec: str | Store) -> Store:
    """``"memory"``, ``"sqlite:///path/to/file.db"``, ``"postgresql://user@host/db"`` (or a
    ready ``Store``).

    A SQLite URL takes options as a query: ``"sqlite:///app.db?busy_timeout=30"`` waits up
    to 30 s for a database another process has locked (default 5 s), ``feed_interval=0.02``
    polls for other processes' commits every 20 ms (default 50; see ``SQLiteStore``). A
    PostgreSQL URL is libpq's, with ``pool_size``, ``prepare``, ``busy_timeout`` and
    ``listen_url`` added (see ``PostgresStore``; it needs the ``postgres`` extra).
    """
    if not isinstance(spec, str):
        missing = [m for m in _PORT if not callable(getattr(spec, m, None))]
        if not missing:
            return spec
        if len(missing) < len(_PORT):  # meant as a store: say what it lacks
            raise StoreConfigError(
                f"{type(spec).__name__} is not a Store: it lacks {', '.join(missing)} "
                f"(the port, runtime.storage.base.Store, has {', '.join(_PORT)})"
            )
        raise StoreConfigError(
            f"store must be 'memory', 'sqlite:///path/to/file.db', "
            f"'postgresql://user@host/dbname' or a Store, "
            f"got {type(spec).__name__} {spec!r}"
        )
    if spec == "memory":
        return MemoryStore()
    if spec.startswith("sqlite:///"):
        path, _, query = spec[len("sqlite:///"):].partition("?")
        if not path:
            raise StoreConfigError("sqlite store needs a path: 'sqlite:///app.db'")
        return SQLiteStore(path, **_sqlite_options(spec, query))
    if spec.startswith(("postgresql://", "postgres://")):
        return PostgresStore(spec)
    raise StoreConfigError(
        f"unknown store {redact(spec)!r}: use 'memory', 'sqlite:///path/to/file.db' or "
        f"'postgresql://user@host/dbname'"
    )


def _sqlite_options(spec: str, query: str) -> dict[str, float]:
    options: dict[str, float] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        pairs = [("", query)]
    for name, text in pairs:
        if name not in _SQLITE_OPTIONS:
            raise StoreConfigError(
                f"unknown option {name!r} in store {spec!r}: a sqlite store takes "
                f"{', '.join(_SQLITE_OPTIONS)} ('sqlite:///app.db?busy_timeout=30')"
            )
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if name == "feed_interval" and not 0 < seconds <= 60:
            raise StoreConfigError(
                f"feed_interval in store {spec!r} is the seconds between polls for other "
                f"processes' commits, a number > 0 and <= 60; got {text!r}"
            )
        if not 0 <= seconds < float("inf"):
            raise StoreConfigError(
                f"busy_timeout in store {spec!r} is the seconds to wait for a locked "
                f"database, a number >= 0; got {text!r}"
            )
        options[name] = seconds
    return options
