"""Runtimes in several real processes on one database (SQLite file or PostgreSQL), joined by
the store's change feed: a commit in one recomputes a computed in another that never
writes; processes starting together lose nothing; contended increments lose nothing.

Every wait is bounded (``WAIT``) and waits for a line the child prints, never for time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Runtime

from .counter_agent import counter

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0
PROCESSES = 4
BUMPS = 25


@pytest.fixture(params=["sqlite", "postgres"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return request.getfixturevalue("pg_url")
    return f"sqlite:///{tmp_path / 'shared.db'}"


def _child(store: str, mode: str, n: int) -> subprocess.Popen[str]:
    code = ("import sys; from tests.storage.counter_agent import main; "
            "main(sys.argv[1], sys.argv[2], int(sys.argv[3]))")
    return subprocess.Popen([sys.executable, "-c", code, store, mode, str(n)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def _line(proc: subprocess.Popen[str], key: str) -> Any:
    assert proc.stdout is not None
    for line in proc.stdout:
        record = json.loads(line)
        if key in record:
            return record
    raise AssertionError(f"the child exited ({proc.wait()}) before printing {key!r}")


async def _read(proc: subprocess.Popen[str], key: str) -> Any:
    with anyio.fail_after(WAIT):  # a child that never prints fails the test, not hangs it
        return await anyio.to_thread.run_sync(_line, proc, key, abandon_on_cancel=True)


async def test_a_commit_in_one_process_recomputes_a_computed_in_another(shared: str) -> None:
    watcher = _child(shared, "watch", 10)
    try:
        await _read(watcher, "ready")
        async with Runtime(store=shared) as rt:
            inst = rt.run(counter)
            for _ in range(5):
                await inst.send("bump", None)
        record = await _read(watcher, "seen")
        seen = record["seen"]
        assert seen[0] == 0 and seen[-1] == 10 and seen == sorted(seen), seen
        assert record["errors"] == 0
        assert watcher.wait(WAIT) == 0
    finally:
        watcher.kill()


async def _race(shared: str, bumps: int) -> list[Any]:
    """Start ``PROCESSES`` children, release them at once, gather their reports."""
    children = [_child(shared, "bump", bumps) for _ in range(PROCESSES)]
    try:
        for child in children:  # each waits on stdin before opening the runtime
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        reports = [await _read(child, "done") for child in children]
        assert [child.wait(WAIT) for child in children] == [0] * PROCESSES
        return reports
    finally:
        for child in children:
            child.kill()


async def test_processes_starting_together_declare_once_and_lose_nothing(shared: str) -> None:
    reports = await _race(shared, 1)
    assert all(r["done"] == 1 and r["errors"] == 0 for r in reports), reports
    async with Runtime(store=shared) as rt:
        assert rt.run(counter).result.key("count").get() == PROCESSES


async def test_contended_increments_from_several_processes_lose_nothing(shared: str) -> None:
    reports = await _race(shared, BUMPS)
    assert all(r["done"] == BUMPS and r["errors"] == 0 for r in reports), reports
    async with Runtime(store=shared) as rt:
        assert rt.run(counter).result.key("count").get() == PROCESSES * BUMPS
