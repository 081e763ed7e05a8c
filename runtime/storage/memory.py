"""In-memory store: the default, for tests and throwaway runs.

It owns its values: whole values are deep-copied in, ``load()`` hands out copies, because
the runtime changes its own copy in place after a commit and must not reach ours. A patch
is applied in place to the kept value (only its assigned values are copied), so a push to
a long list costs the same as to a short one; a commit that fails part-way undoes the
steps it took, so nothing of it is applied.

Its change feed (``runtime.storage.feed``) is in process: every ``watch()`` has an inbox the
commit fills, so two runtimes on one memory store see each other's commits.

Leases live in the store object, on this process's ``time.monotonic()``: a memory store is
the process itself, so its leases say which runtimes of the process are alive (two runtimes
on one store are two holders). They go with the store at ``close()``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager

from ..errors import StoreClosedError
from .base import (
    LEASE_COLLECT_AFTER,
    DocKey,
    Stored,
    Write,
    check_lease_holder,
    check_lease_ttl,
)
from .feed import Changes, Inbox
from .patch import MISSING, apply_patch, conflict, copy_value


class MemoryStore:
    def __init__(self) -> None:
        self._docs: dict[DocKey, Stored] = {}
        self._leases: dict[str, float] = {}  # holder -> expiry, on time.monotonic()
        self._closed = False
        self._inboxes: set[Inbox] = set()

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise StoreClosedError(
                f"{what} on a closed MemoryStore: its documents were dropped at close(); "
                f"open a new store (a memory store keeps nothing across close)"
            )

    def load(self, key: DocKey) -> Stored | None:
        self._check_open("load()")
        stored = self._docs.get(key)
        return Stored(copy_value(stored.value), stored.version) if stored else None

    def commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        self._check_open("commit()")
        docs = self._docs
        undo: list[Callable[[], None]] = []
        out: dict[DocKey, int] = {}
        try:
            for w in writes:
                current = docs.get(w.key)
                have = current.version if current else 0
                if w.expect is not None and w.expect != have:
                    raise conflict(w.key, have, w.expect)
                if w.patch is None:
                    value = copy_value(w.value)
                else:
                    value = apply_patch(w.key, current.value if current else MISSING,
                                        w.patch, undo)
                undo.append(_restore(docs, w.key, current))
                docs[w.key] = Stored(value, have + 1)
                out[w.key] = have + 1
        except BaseException:
            for step in reversed(undo):
                step()
            raise
        for inbox in self._inboxes:
            inbox.put(out)
        return out

    # -- the change feed (runtime.storage.feed) -----------------------------------------

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[Changes | None]]:
        """Every commit to this store object, from now on (its own included)."""
        self._check_open("watch()")
        inbox = Inbox()
        self._inboxes.add(inbox)
        try:
            yield inbox
        finally:
            self._inboxes.discard(inbox)
            inbox.close()

    def versions(self, keys: Sequence[DocKey]) -> dict[DocKey, int]:
        """The current version of each key that exists."""
        self._check_open("versions()")
        docs = self._docs
        return {k: docs[k].version for k in keys if k in docs}

    def load_many(self, keys: Sequence[DocKey]) -> dict[DocKey, Stored]:
        """The value (a copy) and version of each key that exists."""
        self._check_open("load_many()")
        docs = self._docs
        return {k: Stored(copy_value(docs[k].value), docs[k].version) for k in keys
                if k in docs}

    def keys(self, space: str) -> Iterable[DocKey]:
        self._check_open("keys()")
        return [k for k in self._docs if k.space == space]

    # -- leases (the contract: runtime.storage.base) -----------------------------------

    def renew_lease(self, holder: str, ttl: float) -> bool:
        self._check_open("renew_lease()")
        check_lease_holder(holder, "renew_lease()")
        check_lease_ttl(ttl, "renew_lease()")
        now = time.monotonic()
        expires = self._leases.get(holder)
        if expires is not None and expires <= now:
            return False  # lost: an expired lease is never revived
        self._leases[holder] = now + ttl
        return True

    def lease_remaining(self, holder: str) -> float | None:
        self._check_open("lease_remaining()")
        check_lease_holder(holder, "lease_remaining()")
        expires = self._leases.get(holder)
        return None if expires is None else expires - time.monotonic()

    def release_lease(self, holder: str) -> None:
        self._check_open("release_lease()")
        check_lease_holder(holder, "release_lease()")
        self._leases.pop(holder, None)
        horizon = time.monotonic() - LEASE_COLLECT_AFTER  # and forget long-dead ones
        for old in [h for h, expires in self._leases.items() if expires < horizon]:
            del self._leases[old]

    def close(self) -> None:
        self._closed = True
        self._docs = {}
        self._leases = {}
        for inbox in self._inboxes:
            inbox.close()
        self._inboxes = set()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._docs)} documents"
        return f"MemoryStore({state})"


def _restore(docs: dict[DocKey, Stored], key: DocKey, before: Stored | None) -> Callable[[], None]:
    if before is None:
        return lambda: docs.pop(key, None)
    return lambda: docs.__setitem__(key, before)
