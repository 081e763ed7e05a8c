"""A counter for the tests of several processes on one database, importable by a test and
by the processes it starts (the same pattern names the same documents in all of them)."""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from runtime import Runtime, cell, computed, handler, pattern
from runtime.errors import ConflictError


@handler
def bump(event: Any, count: Any) -> None:
    count.set(count.get() + 1)


@pattern(name="process-counter")
def counter() -> dict[str, Any]:
    count = cell(0, name="count")
    doubled = computed(lambda: count.get() * 2, name="doubled")
    return {"count": count, "doubled": doubled, "bump": bump(count=count)}


def say(**record: Any) -> None:
    print(json.dumps(record), flush=True)


async def _bump(store: str, times: int) -> None:
    """Wait for a line on stdin (the test releases every process at once), then bump
    ``times`` times; an event whose commit kept meeting others' is sent again."""
    await anyio.to_thread.run_sync(sys.stdin.readline)
    async with Runtime(store=store) as rt:
        inst = rt.run(counter)
        conflicts = 0
        done = 0
        while done < times:
            try:
                await inst.send("bump", None)
            except ConflictError:
                conflicts += 1
                continue
            done += 1
        say(done=done, conflicts=conflicts, errors=len(rt.errors))


async def _watch(store: str, until: int) -> None:
    """Print every value of ``doubled`` this process sees until it reaches ``until``; it
    never writes, so only the change feed can bring them."""
    async with Runtime(store=store) as rt:
        inst = rt.run(counter)
        seen: list[Any] = []
        reached = anyio.Event()

        def sink(value: Any) -> None:
            seen.append(value)
            if value == until:
                reached.set()

        inst.result.key("doubled").sink(sink)
        say(ready=True)
        await reached.wait()
        say(seen=seen, errors=len(rt.errors))


def main(store: str, mode: str, n: str) -> None:
    anyio.run(_bump if mode == "bump" else _watch, store, int(n))
