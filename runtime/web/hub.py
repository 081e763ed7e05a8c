"""One running instance as its open tabs see it, and the one task that sends their patches.

A ``Hub`` subscribes once to each of the instance's result cells (``Cell.sink``, which runs
in the commit that changed the cell) and keeps two values per cell: the ``latest`` committed
and the one ``sent`` to the tabs. A commit only marks the hub dirty; the ``Broadcaster``
gathers what is dirty for ``coalesce`` seconds, then each dirty hub diffs ``sent`` against
``latest`` once, frames the patch once and offers the same bytes to every tab. So the cost of
a commit is one diff per instance, not per tab, and a tab's cost is a queue slot.

A tab (``Tab``) is a bounded queue. A tab that cannot keep up (its queue is full) is closed:
its stream ends, the browser reconnects and starts from a snapshot, and nothing it missed
is queued for it meanwhile. A joining tab gets ``sent`` as its snapshot and every patch after
it, with no await between the two, so the snapshot and the patches never overlap or gap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .wire import VERSION, diff, frame, to_json

if TYPE_CHECKING:
    from ..cells import Cell, Instance

__all__ = ["Broadcaster", "Hub", "Tab"]

log = logging.getLogger("celldialog.web")


class Tab:
    """One open event stream: a bounded queue of framed patches."""

    __slots__ = ("dropped", "receive", "send")

    def __init__(self, size: int) -> None:
        self.send: MemoryObjectSendStream[bytes]
        self.receive: MemoryObjectReceiveStream[bytes]
        self.send, self.receive = anyio.create_memory_object_stream[bytes](size)
        self.dropped = False

    def offer(self, payload: bytes) -> None:
        """Queue ``payload``; a full queue closes the tab (it reconnects to a snapshot)."""
        if self.dropped:
            return
        try:
            self.send.send_nowait(payload)
        except anyio.WouldBlock:
            self.close()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.dropped = True

    def close(self) -> None:
        """End the tab's stream after what is queued (the reader sees the end)."""
        self.dropped = True
        self.send.close()


class Hub:
    """An instance's result cells, as last committed and as last sent to its tabs."""

    def __init__(self, inst: Instance, cells: dict[str, Cell], describe: dict[str, Any],
                 queue: int, dirty: Callable[[Hub], None]) -> None:
        self.inst = inst
        self.describe = describe  # the snapshot's fixed part: streams, chat, state
        self.queue = queue
        self.tabs: set[Tab] = set()
        self._dirty = dirty
        self.latest: dict[str, Any] = {}
        self.changed: dict[str, None] = {}  # names changed since the last flush, in order
        self._unsubscribe = [cell.sink(self._sink(name)) for name, cell in cells.items()]
        self.sent: dict[str, Any] = dict(self.latest)
        self.changed.clear()
        self.closed = False

    def _sink(self, name: str) -> Callable[[Any], None]:
        def changed(value: Any) -> None:
            self.latest[name] = value
            if not self.changed:
                self._dirty(self)
            self.changed[name] = None
        return changed

    def join(self, retry_ms: int) -> tuple[Tab, bytes]:
        """A new tab and its snapshot (framed), consistent with every patch it will get."""
        tab = Tab(self.queue)
        self.tabs.add(tab)
        body = {"v": VERSION, **self.describe, "cells": self.sent}
        return tab, frame("snapshot", to_json(body), retry_ms=retry_ms)

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
    """The one task that flushes dirty hubs, ``coalesce`` seconds after the first change."""

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
            await self._wake.wait()
            if self.coalesce:
                await anyio.sleep(self.coalesce)  # the window: commits meanwhile join it
            self._wake = anyio.Event()
            hubs, self._dirty = self._dirty, {}
            for hub in hubs:
                try:
                    hub.flush()
                except Exception:  # one instance's bad value must not stop everyone's patches
                    log.exception("patching the tabs of %r failed: they are closed and "
                                  "reconnect to a snapshot", hub.inst)
                    hub.close()
