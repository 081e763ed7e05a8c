"""Runtimes in several real processes on one database (SQLite file or PostgreSQL), joined by
the store's change feed: a commit in one recomputes a computed in another that never
writes; processes starting together lose nothing; contended increments lose nothing.

Every wait is bounded (``WAIT``) and waits for a line the child prints, never for time.
"""

from __future__ import annotations

from typing import Any

import pytest

from runtime import Runtime

from ..children import WAIT, read, send, start
from .counter_agent import counter

pytestmark = pytest.mark.anyio
AGENT = "tests.storage.counter_agent"
PROCESSES = 4
BUMPS = 25


async def test_a_commit_in_one_process_recomputes_a_computed_in_another(
    shared_store: str,
) -> None:
    watcher = start(AGENT, shared_store, "watch", 10)
    try:
        await read(watcher, "ready")
        async with Runtime(store=shared_store) as rt:
            inst = rt.run(counter)
            for _ in range(5):
                await inst.send("bump", None)
        record = await read(watcher, "seen")
        seen = record["seen"]
        assert seen[0] == 0 and seen[-1] == 10 and seen == sorted(seen), seen
        assert record["errors"] == 0
        assert watcher.wait(WAIT) == 0
    finally:
        watcher.kill()


async def _race(shared: str, bumps: int) -> list[Any]:
    """Start ``PROCESSES`` children, release them at once, gather their reports."""
    children = [start(AGENT, shared, "bump", bumps) for _ in range(PROCESSES)]
    try:
        for child in children:  # each waits on stdin before opening the runtime
            send(child)
        reports = [await read(child, "done") for child in children]
        assert [child.wait(WAIT) for child in children] == [0] * PROCESSES
        return reports
    finally:
        for child in children:
            child.kill()


async def test_processes_starting_together_declare_once_and_lose_nothing(shared_store: str) -> None:
    reports = await _race(shared_store, 1)
    assert all(r["done"] == 1 and r["errors"] == 0 for r in reports), reports
    async with Runtime(store=shared_store) as rt:
        assert rt.run(counter).result.key("count").get() == PROCESSES


async def test_contended_increments_from_several_processes_lose_nothing(shared_store: str) -> None:
    reports = await _race(shared_store, BUMPS)
    assert all(r["done"] == BUMPS and r["errors"] == 0 for r in reports), reports
    async with Runtime(store=shared_store) as rt:
        assert rt.run(counter).result.key("count").get() == PROCESSES * BUMPS
