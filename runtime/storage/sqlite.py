"""SQLite store: one file, WAL journal, one SQL transaction per commit."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from .base import ConflictError, DocKey, Stored, Write

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    space   TEXT NOT NULL,
    scope   TEXT NOT NULL,
    id      TEXT NOT NULL,
    value   TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (space, scope, id)
) WITHOUT ROWID
"""


class SQLiteStore:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None)
        except sqlite3.Error as e:
            raise type(e)(f"cannot open SQLite store {self.path!r}: {e}") from e
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
        except sqlite3.Error as e:
            self._db.close()
            raise type(e)(f"cannot open SQLite store {self.path!r}: {e}") from e

    def load(self, key: DocKey) -> Stored | None:
        row = self._db.execute(
            "SELECT value, version FROM docs WHERE space=? AND scope=? AND id=?", key
        ).fetchone()
        return Stored(json.loads(row[0]), row[1]) if row else None

    def commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        db = self._db
        out: dict[DocKey, int] = {}
        db.execute("BEGIN IMMEDIATE")
        try:
            for w in writes:
                row = db.execute(
                    "SELECT version FROM docs WHERE space=? AND scope=? AND id=?", w.key
                ).fetchone()
                have = row[0] if row else 0
                if w.expect is not None and w.expect != have:
                    raise ConflictError(
                        f"{w.key} is at version {have}, the write expected {w.expect}"
                    )
                db.execute(
                    "INSERT INTO docs (space, scope, id, value, version) VALUES (?,?,?,?,?) "
                    "ON CONFLICT (space, scope, id) DO UPDATE SET value=excluded.value, "
                    "version=excluded.version",
                    (*w.key, json.dumps(w.value, separators=(",", ":")), have + 1),
                )
                out[w.key] = have + 1
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return out

    def keys(self, space: str) -> Iterable[DocKey]:
        rows = self._db.execute("SELECT space, scope, id FROM docs WHERE space=?", (space,))
        return [DocKey(*r) for r in rows]

    def close(self) -> None:
        self._db.close()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"
