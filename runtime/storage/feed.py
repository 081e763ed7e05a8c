"""The change feed: what any writer committed to a store, as keys and new versions.

A runtime keeps its own copy of the documents it has loaded. Another process writing the
same database changes them behind its back; without a feed the runtime would only find out
when its next commit conflicts, so a computed never recomputes and a cancel sent from one
process never reaches a turn running in another. A store that can tell what changed is a
``WatchableStore``: besides the port (``base.Store``) it has

- ``watch()``: an async context manager giving an async iterator of batches. A batch is
  ``{key: version}``, the highest version committed to each key since the last batch, by
  anyone (this process's own commits too: a reader skips versions it already has). A batch
  of ``RECHECK`` (None) means "anything may have changed": it comes first, and again
  whenever the feed may have missed something (a reconnect, a lost notification, an
  entry too large to send); the reader then compares the versions of everything it holds.
- ``versions(keys)``: the current version of each key that exists, in one read;
- ``load_many(keys)``: the current value and version of each key that exists, in one read.

The feed carries no values: a reader fetches only the documents it holds, in one query,
however many processes write. Each backend says how its feed is made (memory: in process;
SQLite: a poll of ``PRAGMA data_version`` and a table of changes; PostgreSQL: ``NOTIFY``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeGuard

import anyio

from .base import DocKey, Store, Stored

__all__ = ["RECHECK", "Changes", "Inbox", "WatchableStore", "can_watch", "merge"]

Changes = dict[DocKey, int]
RECHECK: None = None  # the batch that says: compare every version you hold


class WatchableStore(Store, Protocol):
    def watch(self) -> AbstractAsyncContextManager[AsyncIterator[Changes | None]]: ...

    def versions(self, keys: Sequence[DocKey]) -> dict[DocKey, int]: ...

    def load_many(self, keys: Sequence[DocKey]) -> dict[DocKey, Stored]: ...


def can_watch(store: Any) -> TypeGuard[WatchableStore]:
    """Does ``store`` have a change feed? (A store written before feeds works without.)"""
    return all(callable(getattr(store, m, None)) for m in ("watch", "versions", "load_many"))


def merge(into: Changes, changes: Changes) -> None:
    """Add ``changes`` to ``into``, keeping the highest version of each key."""
    for key, version in changes.items():
        if into.get(key, -1) < version:
            into[key] = version


class Inbox:
    """One reader's batches, filled synchronously by a writer in the same process and
    drained by the reader's task: whatever arrived while the reader was busy comes as one
    batch (the highest version per key), so a slow reader costs memory per key, not per
    commit."""

    def __init__(self) -> None:
        self._pending: Changes = {}
        self._recheck = True  # the first batch: compare what you hold
        self._ready: anyio.Event | None = None
        self.closed = False

    def put(self, changes: Changes) -> None:
        """A commit's keys and versions (called by the writer, synchronously)."""
        merge(self._pending, changes)
        self._wake()

    def close(self) -> None:
        """End the reader's iteration (the store closed, or the watch ended)."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        ready, self._ready = self._ready, None
        if ready is not None:
            ready.set()

    def __aiter__(self) -> AsyncIterator[Changes | None]:
        return self

    async def __anext__(self) -> Changes | None:
        while not self.closed:
            if self._recheck:
                self._recheck = False
                self._pending = {}  # a recheck covers them
                return RECHECK
            if self._pending:
                batch, self._pending = self._pending, {}
                return batch
            ready = self._ready = anyio.Event()
            await ready.wait()
        raise StopAsyncIteration
