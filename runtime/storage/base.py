"""The storage port: documents by key, committed atomically, with versions.

Versions make optimistic concurrency possible: a write may name the version it read, and
the commit fails with ``ConflictError`` if another writer got there first. One process does
not need it today; several processes sharing a database (the PostgreSQL backend) will.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..errors import ConflictError

__all__ = ["ConflictError", "DocKey", "Store", "Stored", "Write"]


class DocKey(NamedTuple):
    """Where a document lives: its space, its scope key ("" shared, "user:<u>",
    "session:<s>") and its cause-derived id."""

    space: str
    scope: str
    id: str


class Stored(NamedTuple):
    value: Any
    version: int


@dataclass(frozen=True, slots=True)
class Write:
    key: DocKey
    value: Any
    expect: int | None = None  # the version this write was based on; None: unconditional


class Store(Protocol):
    def load(self, key: DocKey) -> Stored | None: ...

    def commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        """Apply every write or none; return the new version of each written key."""
        ...

    def keys(self, space: str) -> Iterable[DocKey]: ...

    def close(self) -> None: ...
