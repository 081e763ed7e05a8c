"""Document storage backends. Every backend passes ``tests/test_storage.py``."""

from __future__ import annotations

from .base import ConflictError, DocKey, Store, Stored, Write
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = [
    "ConflictError",
    "DocKey",
    "MemoryStore",
    "SQLiteStore",
    "Store",
    "Stored",
    "Write",
    "open_store",
]


def open_store(spec: str | Store) -> Store:
    """``"memory"`` or ``"sqlite:///path/to/file.db"`` (or a ready ``Store``)."""
    if not isinstance(spec, str):
        if all(callable(getattr(spec, m, None)) for m in ("load", "commit", "keys", "close")):
            return spec
        raise TypeError(
            f"store must be 'memory', 'sqlite:///path/to/file.db' or a Store, "
            f"got {type(spec).__name__} {spec!r}"
        )
    if spec == "memory":
        return MemoryStore()
    if spec.startswith("sqlite:///"):
        path = spec[len("sqlite:///"):]
        if not path:
            raise ValueError("sqlite store needs a path: 'sqlite:///app.db'")
        return SQLiteStore(path)
    raise ValueError(
        f"unknown store {spec!r}: use 'memory' or 'sqlite:///path/to/file.db'"
    )
