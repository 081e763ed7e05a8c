"""The storage port: documents by key, committed atomically, with versions.

Versions make optimistic concurrency possible: a write may name the version it read, and
the commit fails with ``ConflictError`` if another writer got there first. Several runtimes
(processes) sharing one SQLite file rely on it today; a PostgreSQL backend will too.

Every error a store raises is a ``StorageError`` (``runtime.errors``): ``ConflictError``
(re-read and retry), ``StoreBusyError`` (locked longer than the backend waits),
``StoreClosedError`` (used after ``close()``); a driver's own errors never escape bare.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..errors import ConflictError, StorageError, StoreBusyError, StoreClosedError, StoreConfigError

__all__ = [
    "ConflictError",
    "DocKey",
    "StorageError",
    "Store",
    "StoreBusyError",
    "StoreClosedError",
    "Stored",
    "Write",
]


class DocKey(NamedTuple):
    """Where a document lives: its space, its scope key ("" shared, "user:<u>",
    "session:<s>") and its cause-derived id."""

    space: str
    scope: str
    id: str


class Stored(NamedTuple):
    value: Any
    version: int


Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Write:
    """One document's change in a commit.

    ``expect`` is the version the change was based on: ``None`` writes unconditionally, ``0``
    creates the document only if it does not exist yet, ``n`` requires version ``n``.

    ``patch``, when given, is the same change as a sequence of ``(path, value)``
    assignments to the document at version ``expect`` (parents exist; a list index equal to
    the length appends; the empty path replaces the whole value). A store may persist the
    patch instead of the whole value, so a write costs what it changes, not the size of the
    document. A patch needs ``expect`` (it applies to a known version) and ``value`` is then
    ignored (pass ``None``). Stores never keep a reference to a value handed to them, nor
    hand out one they keep: the runtime changes its own copy in place after a commit.
    """

    key: DocKey
    value: Any
    expect: int | None = None
    patch: tuple[tuple[Path, Any], ...] | None = None

    def __post_init__(self) -> None:
        if self.patch is not None and self.expect is None:
            raise StoreConfigError(
                f"Write.patch needs expect: a patch applies to a known version of "
                f"{self.key}; pass expect=<the version the patch was computed from> "
                f"(0 for a new document), or write the whole value without a patch"
            )


class Store(Protocol):
    def load(self, key: DocKey) -> Stored | None: ...

    def commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        """Apply every write or none; return the new version of each written key."""
        ...

    def keys(self, space: str) -> Iterable[DocKey]: ...

    def close(self) -> None: ...
