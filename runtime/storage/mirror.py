"""The store of a runtime that is its only writer: versions here, values with the writer.

``Runtime(store="memory")`` makes a memory store nobody else can reach. Its values would be
a second copy of what the runtime already holds (every committed value lives in the
runtime's kernel), and keeping that copy cost every commit a deep copy or a patch replay
and every session about a quarter of its memory. This store keeps only each document's
version, so commits are still checked (a transaction based on an old version conflicts, a
create-if-absent finds the document there), and reads ask the writer for a copy of its
committed value.

Nothing here applies to a store others can write: ``MemoryStore()`` passed in, SQLite and
PostgreSQL keep their values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .base import DocKey, Stored, Write
from .memory import MemoryStore
from .patch import conflict

Reader = Callable[[DocKey], Any]
"""A copy of the writer's committed value of a document this store has a version of."""


class MirrorStore(MemoryStore):
    """A ``MemoryStore`` whose values are its one writer's (``attach``)."""

    def __init__(self) -> None:
        super().__init__()
        self._versions: dict[DocKey, int] = {}
        self._read: Reader | None = None

    def attach(self, read: Reader) -> None:
        """Where values come from: the writer, which keeps every document it committed.
        Once: the store has one writer, for good."""
        if self._read is not None:
            raise RuntimeError("this MirrorStore already has its writer: it is the private "
                               "store of one runtime; give another runtime a MemoryStore() "
                               "to share, or its own \"memory\"")
        self._read = read

    def _value(self, key: DocKey) -> Any:
        if self._read is None:
            raise RuntimeError("MirrorStore used before attach(): its writer holds the values")
        return self._read(key)

    def load(self, key: DocKey) -> Stored | None:
        self._check_open("load()")
        version = self._versions.get(key)
        return None if version is None else Stored(self._value(key), version)

    def commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        """Check every write's expected version, then move them all on: all or nothing,
        with nothing to copy (the writer has checked and keeps the values)."""
        self._check_open("commit()")
        versions = self._versions
        out: dict[DocKey, int] = {}
        for w in writes:
            have = out.get(w.key, versions.get(w.key, 0))
            if w.expect is not None and w.expect != have:
                raise conflict(w.key, have, w.expect)
            out[w.key] = have + 1
        versions.update(out)
        for inbox in self._inboxes:
            inbox.put(out)
        return out

    def versions(self, keys: Sequence[DocKey]) -> dict[DocKey, int]:
        self._check_open("versions()")
        versions = self._versions
        return {k: versions[k] for k in keys if k in versions}

    def load_many(self, keys: Sequence[DocKey]) -> dict[DocKey, Stored]:
        self._check_open("load_many()")
        versions = self._versions
        return {k: Stored(self._value(k), versions[k]) for k in keys if k in versions}

    def keys(self, space: str) -> Iterable[DocKey]:
        self._check_open("keys()")
        return [k for k in self._versions if k.space == space]

    def close(self) -> None:
        super().close()
        self._versions = {}
        self._read = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._versions)} documents"
        return f"MirrorStore({state})"
