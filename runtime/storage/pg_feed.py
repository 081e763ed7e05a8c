"""The PostgreSQL change feed: ``pg_notify`` payloads, and the connection that listens.

Each write of a commit notifies channel ``celldialog`` with its key and new version, as
``[[space, scope, id, version]]`` (``payload``), in the commit's transaction: delivered
only if it commits, and then together. A key too long for one notification (PostgreSQL
refuses 8,000 bytes) sends ``"*"`` instead: readers then compare everything they hold
(``RECHECK``).

Anyone who may connect may ``NOTIFY`` (PostgreSQL has no privilege for it), so what arrives
is checked: a payload that is not ours is ignored, and a ``"*"`` arriving less than
``RECHECK_EVERY`` seconds after the last recheck waits that long, so nobody can make every
process re-read everything it holds many times a second.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio

from .base import DocKey
from .feed import RECHECK, Changes, merge
from .pg_url import redact, scrub, secrets_of

__all__ = ["CHANNEL", "NOTIFY_LIMIT", "Listener", "parse_payload", "payload"]

log = logging.getLogger("celldialog.postgres")

CHANNEL = "celldialog"
NOTIFY_LIMIT = 7900  # bytes of one notification's payload (PostgreSQL's limit is 8,000)
RECHECK_EVERY = 1.0  # seconds: the most often a "*" makes readers compare everything
HEALTHY_AFTER = 5.0  # seconds a connection must last before the backoff starts again
_NOT_OURS: Any = object()


def payload(key: DocKey, version: int | None) -> str | None:
    """One write's notification, ``[[space, scope, id, version]]``; ``"*"`` for a key too
    long to send; None when the version is known only to the server (it writes the same
    shape itself)."""
    entry = json.dumps([[key.space, key.scope, key.id, version or 10**18]],
                       separators=(",", ":"))
    if len(entry.encode()) >= NOTIFY_LIMIT:
        return "*"
    return None if version is None else entry


def parse_payload(payload: str) -> Changes | Any | None:
    """A notification's keys and versions; ``RECHECK`` for ``"*"``; ``_NOT_OURS`` for
    anything else (``payload`` never writes it: someone else's, ignored)."""
    if payload == "*":
        return RECHECK
    try:
        entries = json.loads(payload)
    except (ValueError, RecursionError):
        return _NOT_OURS
    if not isinstance(entries, list):
        return _NOT_OURS
    out: Changes = {}
    for entry in entries:
        if (not isinstance(entry, list) or len(entry) != 4
                or not all(isinstance(p, str) for p in entry[:3])
                or type(entry[3]) is not int):
            return _NOT_OURS
        merge(out, {DocKey(entry[0], entry[1], entry[2]): entry[3]})
    return out


class Listener:
    """The feed of one ``watch()``: a connection that ``LISTEN``s, reconnected with backoff
    when lost (reset only once a connection has lasted ``HEALTHY_AFTER``, so one that keeps
    dying is retried less and less often). Each (re)connect yields ``RECHECK`` first
    (``NOTIFY`` is not durable: what was sent while nobody listened is gone); then each
    batch is everything pending: one wait for a notification, then every one already
    received, each packet consumed whole (leaving psycopg's ``notifies()`` early drops the
    rest of a packet). Ends when ``closed()`` says the store closed."""

    def __init__(self, psycopg: Any, conninfo: str, closed: Any = lambda: False) -> None:
        self._psycopg = psycopg
        self._conninfo = conninfo
        self._shown = redact(conninfo)
        self._secrets = secrets_of(conninfo)
        self._closed = closed
        self._conn: Any = None
        self._backoff = 0.0
        self._connected = 0.0
        self._last_recheck = -RECHECK_EVERY

    def __aiter__(self) -> AsyncIterator[Changes | None]:
        return self

    async def __anext__(self) -> Changes | None:
        psycopg = self._psycopg
        while not self._closed():
            if self._conn is None:
                await self._connect()
                return await self._recheck()
            batch: Changes = {}
            recheck = False
            try:
                async for n in self._conn.notifies(stop_after=1):
                    recheck |= self._take(batch, n.payload)
                async for n in self._conn.notifies(timeout=0):
                    recheck |= self._take(batch, n.payload)
            except psycopg.Error as e:
                log.warning("PostgreSQL store %s: the change feed's connection was lost; "
                            "reconnecting: %s", self._shown, self._why(e))
                await self._drop()
                continue
            if recheck:
                return await self._recheck()
            if batch:
                return batch
        await self._drop()
        raise StopAsyncIteration

    def _take(self, batch: Changes, payload: str) -> bool:
        got = parse_payload(payload)
        if got is RECHECK:
            return True
        if got is _NOT_OURS:
            log.debug("PostgreSQL store %s: ignored a notification that is not ours: %.80r",
                      self._shown, payload)
            return False
        merge(batch, got)
        return False

    async def _recheck(self) -> None:
        wait = self._last_recheck + RECHECK_EVERY - time.monotonic()
        if wait > 0:
            await anyio.sleep(wait)  # a rate limit, not a wait for something
        self._last_recheck = time.monotonic()
        return RECHECK

    async def _connect(self) -> None:
        psycopg = self._psycopg
        while True:
            if self._backoff:
                await anyio.sleep(self._backoff)  # a backoff between attempts
            try:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                await conn.execute(f"LISTEN {CHANNEL}")
            except psycopg.Error as e:
                self._grow()
                log.warning("PostgreSQL store %s: the change feed cannot connect (retrying "
                            "in %.2f s): %s", self._shown, self._backoff, self._why(e))
                continue
            self._conn, self._connected = conn, time.monotonic()
            return

    def _why(self, e: BaseException) -> str:
        return scrub(" ".join(str(e).split()), self._secrets)

    def _grow(self) -> None:
        self._backoff = min(max(self._backoff * 2, 0.05), 5.0)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if time.monotonic() - self._connected >= HEALTHY_AFTER:
            self._backoff = 0.0  # it lasted: the next attempt is at once
        self._grow()
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # already gone
                pass

    async def aclose(self) -> None:
        """Close the listening connection (the watch ended)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # already gone
                pass
