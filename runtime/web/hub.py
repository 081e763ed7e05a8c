"""One running instance as its open tabs see it, and the one task that sends their patches.

A ``Hub`` subscribes once to each of the instance's result cells (``Cell.sink``, which runs
in the commit that changed the cell) and keeps two values per cell: the ``latest`` committed
and the one ``sent`` to the tabs. A commit only marks the hub dirty; the ``Broadcaster``
gathers what is dirty for ``coalesce`` seconds, then each dirty hub diffs ``sent`` against
``latest`` once, frames the patch once and offers the same bytes to every tab. So the cost of
a commit is one diff per instance, not per tab, and a tab's cost is a queue slot.

A tab (``Tab``) is a bounded queue. A tab that cannot keep up (its queue is full) is closed:
its stream ends, the browser reconnects and starts from a snapshot, and nothing it missed
is queued for it meanwhile. The first change after a quiet spell is sent at once; only
what follows it within the window waits. A joining tab gets ``sent`` as its snapshot and
every patch after it, with no await between the two, so the snapshot and the patches never
overlap or gap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from .wire import VERSION, diff, frame, to_json

if TYPE_CHECKING:
    from ..cells import Cell, Instance

__all__ = ["Broadcaster", "Hub", "Tab"]

log = logging.getLogger("celldialog.web")


class Tab:
    """One open event stream: a bounded queue of framed events, read as an async iterator
    (``async for chunk in tab``). What is waiting when the reader comes is sent as one
    chunk, so a busy tab costs one send per wake-up, not one per patch. A full queue closes
    the tab at once: its stream ends and the browser reconnects to a snapshot."""

    __slots__ = ("closed", "limit", "limit_bytes", "queued", "size", "waiter")

    def __init__(self, limit: int, limit_bytes: int, first: bytes) -> None:
        self.limit = limit
        self.limit_bytes = limit_bytes
        self.queued: list[bytes] = [first]
        self.size = 0  # bytes of the patches queued (the snapshot is not counted)
        self.waiter: anyio.Event | None = None
        self.closed = False

    def offer(self, payload: bytes) -> None:
        """Queue ``payload``; past either limit the tab is closed (nothing more is sent)."""
        if self.closed:
            return
        if len(self.queued) >= self.limit or self.size + len(payload) > self.limit_bytes:
            self.close()
            return
        self.queued.append(payload)
        self.size += len(payload)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self.queued.clear()
        self.size = 0
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None:
            self.waiter.set()
            self.waiter = None

    def __aiter__(self) -> Tab:
        return self

    async def __anext__(self) -> bytes:
        while not self.queued:
            if self.closed:
                raise StopAsyncIteration
            self.waiter = waiter = anyio.Event()
            await waiter.wait()
        queued = self.queued
        chunk = queued[0] if len(queued) == 1 else b"".join(queued)
        queued.clear()
        self.size = 0
        return chunk


class Hub:
    """An instance's result cells, as last committed and as last sent to its tabs."""

    def __init__(self, inst: Instance, cells: dict[str, Cell], describe: dict[str, Any],
                 queue: int, queue_bytes: int, dirty: Callable[[Hub], None]) -> None:
        self.inst = inst
        self.describe = describe  # the snapshot's fixed part: streams, chat, state
        self.queue = queue
        self.queue_bytes = queue_bytes
        self._snapshot: bytes | None = None  # framed, until the next patch
        self.tabs: set[Tab] = set()
        self._dirty = dirty
        self.latest: dict[str, Any] = {}
        self.changed: dict[str, None] = {}  # names changed since the last flush, in order
        self._unsubscribe = [cell.sink(self._sink(name)) for name, cell in cells.items()]
        self.sent: dict[str, Any] = dict(self.latest)
        self.changed.clear()
        self.closed = False
        self.flushed_at = -float("inf")  # the broadcaster's: when its last patch went

    def _sink(self, name: str) -> Callable[[Any], None]:
        def changed(value: Any) -> None:
            self.latest[name] = value
            if not self.changed:
                self._dirty(self)
            self.changed[name] = None
        return changed

    def join(self, retry_ms: int) -> Tab:
        """A new tab, its snapshot first: consistent with every patch it will get. The
        framed snapshot is kept until the next patch, so tabs (re)connecting together cost
        one encoding."""
        if self._snapshot is None:
            body = {"v": VERSION, **self.describe, "cells": self.sent}
            self._snapshot = frame("snapshot", to_json(body), retry_ms=retry_ms)
        tab = Tab(self.queue, self.queue_bytes, self._snapshot)
        self.tabs.add(tab)
        return tab

    def leave(self, tab: Tab) -> None:
        self.tabs.discard(tab)
        tab.close()

    def flush(self) -> None:
        """Send the tabs what changed since the last flush: one patch, framed once."""
        if not self.changed:
            return
        ops: list[dict[str, Any]] = []
        for name in self.changed:
            new = self.latest[name]
            ops.extend(diff(self.sent[name], new, (name,)))
            self.sent[name] = new
        self.changed.clear()
        if ops:
            self._snapshot = None
        if ops and self.tabs:
            payload = frame("patch", to_json(ops))
            for tab in list(self.tabs):
                tab.offer(payload)

    def close(self) -> None:
        """Unsubscribe from the cells and end every tab's stream."""
        self.closed = True
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        for tab in list(self.tabs):
            self.leave(tab)


class Broadcaster:
    """The one task that flushes dirty hubs. A hub's first change after a quiet spell goes
    out at once (once the commit that made it has finished); changes that follow within
    ``coalesce`` seconds of its last flush are gathered into its next one. So a burst on
    one session costs a few patches, and a lone event, on any session, no wait: the window
    is each hub's own."""

    def __init__(self, coalesce: float) -> None:
        self.coalesce = coalesce
        self._dirty: dict[Hub, None] = {}
        self._wake = anyio.Event()

    def mark(self, hub: Hub) -> None:
        """Called from a sink, inside the commit: only note it (flushing is the task's)."""
        self._dirty[hub] = None
        self._wake.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        while True:
            if not self._dirty:
                await self._wake.wait()
            self._wake = anyio.Event()  # marks from now on wake the next wait
            now = anyio.current_time()
            due = [h for h in self._dirty if h.flushed_at + self.coalesce <= now]
            for hub in due:
                del self._dirty[hub]
                hub.flushed_at = now
                try:
                    hub.flush()
                except Exception:  # one instance's bad value must not stop everyone's patches
                    log.exception("patching the tabs of %r failed: they are closed and "
                                  "reconnect to a snapshot", hub.inst)
                    hub.close()
            if self._dirty:  # the rest are inside their window: until the first is due
                first = min(h.flushed_at for h in self._dirty) + self.coalesce
                with anyio.move_on_after(max(first - anyio.current_time(), 0)):
                    await self._wake.wait()  # or a new mark, which may be due at once
            else:
                await anyio.lowlevel.checkpoint()
