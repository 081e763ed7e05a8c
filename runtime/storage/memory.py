"""In-memory store: the default, for tests and throwaway runs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .base import ConflictError, DocKey, Stored, Write


class MemoryStore:
    def __init__(self) -> None:
        self._docs: dict[DocKey, Stored] = {}

    def load(self, key: DocKey) -> Stored | None:
        return self._docs.get(key)

    def commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        for w in writes:
            current = self._docs.get(w.key)
            have = current.version if current else 0
            if w.expect is not None and w.expect != have:
                raise ConflictError(f"{w.key} is at version {have}, the write expected {w.expect}")
        out: dict[DocKey, int] = {}
        for w in writes:
            current = self._docs.get(w.key)
            version = (current.version if current else 0) + 1
            self._docs[w.key] = Stored(w.value, version)
            out[w.key] = version
        return out

    def keys(self, space: str) -> Iterable[DocKey]:
        return [k for k in self._docs if k.space == space]

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._docs)} documents)"
