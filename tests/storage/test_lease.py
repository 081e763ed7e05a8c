"""``ProcessLease``, the runtime's side of the store's leases, on memory and SQLite.

Time is real and every wait is computed: the time a lease has left (``lease_remaining``),
or an event the code under test sets. The keeper runs in an anyio task group, as in a
runtime. ``Recording`` wraps a real store to count the lease calls and to inject the two
faults a keeper must survive: a busy store, and a renewal that reaches the store too late.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime.cells.lease import DEFAULT_TTL, SAFETY_MARGIN, ProcessLease
from runtime.errors import ClosedError, StoreBusyError, StoreConfigError, UsageError
from runtime.storage import MemoryStore, SQLiteStore, Store

pytestmark = pytest.mark.anyio


class Recording:
    """A store's lease calls, counted; ``busy`` fails that many renewals, ``late`` makes the
    next renewal reach the store only after the lease expired (a wait for a lock)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.renewals: list[str] = []
        self.releases: list[str] = []
        self.busy = 0
        self.late = False
        self.late_done: anyio.Event | None = None

    def renew_lease(self, holder: str, ttl: float) -> bool:
        self.renewals.append(holder)
        if self.busy:
            self.busy -= 1
            raise StoreBusyError("injected: the database is locked")
        if self.late:
            self.late = False
            wait_out_blocking(self.inner, holder)
            answer = self.inner.renew_lease(holder, ttl)
            if self.late_done is not None:
                self.late_done.set()
            return answer
        return self.inner.renew_lease(holder, ttl)

    def lease_remaining(self, holder: str) -> float | None:
        return self.inner.lease_remaining(holder)

    def release_lease(self, holder: str) -> None:
        self.releases.append(holder)
        self.inner.release_lease(holder)


def wait_out_blocking(store: Store, holder: str) -> None:
    """Block (as a renewal waiting for a lock does) until the lease has expired."""
    while (left := store.lease_remaining(holder)) is not None and left > 0:
        time.sleep(left)


async def wait_out(store: Store, holder: str, bound: float = 10.0) -> None:
    """Sleep until the store says the lease expired, for as long as it says is left."""
    give_up = time.monotonic() + bound
    while True:
        left = store.lease_remaining(holder)
        assert left is not None, f"the lease of {holder!r} vanished before it expired"
        if left <= 0:
            return
        assert time.monotonic() < give_up, f"the lease of {holder!r} never expired"
        await anyio.sleep(left)


def remaining(store: Store, holder: str) -> float:
    left = store.lease_remaining(holder)
    assert left is not None, f"no lease for {holder!r}"
    return left


@pytest.fixture(params=["memory", "sqlite"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """Two handles on one lease table, as two runtimes have: one MemoryStore object shared
    by both (one process), or two SQLite connections to one file (two processes)."""
    if request.param == "memory":
        one = MemoryStore()
        yield one, one
        one.close()
        return
    a, b = SQLiteStore(tmp_path / "leases.db"), SQLiteStore(tmp_path / "leases.db")
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def store(stores: tuple[Store, Store]) -> Store:
    return stores[0]


# ------------------------------------------------------------------------ turns held


async def test_hold_takes_the_lease_and_drop_counts_down(store: Store) -> None:
    rec = Recording(store)
    lease = ProcessLease(rec, ttl=30)  # type: ignore[arg-type]
    holder = lease.holder
    assert not lease.valid() and store.lease_remaining(holder) is None  # nothing until a turn
    assert lease.hold() == holder and lease.held == 1
    assert lease.valid() and lease.valid(holder) and 29 < remaining(store, holder) <= 30
    assert lease.hold() == holder and lease.held == 2
    assert rec.renewals == [holder]  # more than half the ttl was left: no second write
    assert lease.ensure() == holder and lease.held == 2  # ensure() counts nothing
    lease.drop()
    lease.drop()
    assert lease.held == 0 and lease.valid()  # dropped is not released: it runs out
    with pytest.raises(UsageError, match=r"drop\(\) without a hold\(\)"):
        lease.drop()
    assert rec.renewals == [holder] and rec.releases == []


async def test_hold_renews_only_once_less_than_half_the_ttl_is_left(store: Store) -> None:
    rec = Recording(store)
    ttl = 0.4
    lease = ProcessLease(rec, ttl=ttl)  # type: ignore[arg-type]
    holder = lease.hold()
    # the local deadline is never later than the store's: once the store has less than
    # half the ttl (and the margin) left, so has the lease
    await anyio.sleep(remaining(store, holder) - ttl * (0.5 + SAFETY_MARGIN) + 0.02)
    assert lease.valid()
    assert lease.hold() == holder  # still valid: renewed, not replaced
    assert rec.renewals == [holder, holder]
    assert remaining(store, holder) > ttl * 0.9


# ------------------------------------------------------------------------ the keeper


async def test_the_keeper_keeps_a_held_lease_alive_past_several_ttls(store: Store) -> None:
    rec = Recording(store)
    ttl = 0.3
    lease = ProcessLease(rec, ttl=ttl)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(lease.keep)
        holder = lease.hold()
        started = time.monotonic()
        for _ in range(5):  # five deadlines in a row, each pushed back while it ran
            await anyio.sleep(remaining(store, holder))
            assert remaining(store, holder) > 0 and lease.valid(holder)
        elapsed = time.monotonic() - started
        assert elapsed > 3 * ttl
        assert lease.holder == holder and set(rec.renewals) == {holder}
        # every ttl/3, not in a loop: at most one more than the ticks that fit
        assert 3 <= len(rec.renewals) <= elapsed / (ttl / 3) + 2
        lease.close()  # the keeper returns: the task group ends without a cancel
    assert store.lease_remaining(holder) is None and not lease.valid()


async def test_a_turn_held_after_another_ended_is_kept_alive_too(store: Store) -> None:
    """A turn that starts while the keeper waits for its next renewal (the last turn ended
    a moment ago) does not wake it, and is kept alive by that renewal and the next ones;
    a turn that starts while the keeper waits with nothing held wakes it."""
    rec = Recording(store)
    lease = ProcessLease(rec, ttl=0.3)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(lease.keep)
        while not lease._idle:  # the keeper waits, nothing held
            await anyio.lowlevel.checkpoint()
        holder = lease.hold()  # wakes it
        while lease._idle or lease._wake is None:  # it waits for the renewal now
            await anyio.lowlevel.checkpoint()
        lease.drop()
        waiting = lease._wake
        assert lease.hold() == holder  # the next turn, a moment later: no wake
        assert lease._wake is waiting and not waiting.is_set()
        for _ in range(4):  # several deadlines in a row, each pushed back by the keeper
            await anyio.sleep(remaining(store, holder))
            assert remaining(store, holder) > 0 and lease.valid(holder)
        assert set(rec.renewals) == {holder} and len(rec.renewals) >= 3
        lease.close()


async def test_a_dropped_lease_is_not_renewed_and_expires(stores: tuple[Store, Store]) -> None:
    store, other_store = stores
    rec = Recording(store)
    lease = ProcessLease(rec, ttl=0.3)  # type: ignore[arg-type]
    other = ProcessLease(other_store, ttl=0.3)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lease.keep)
        holder = lease.hold()
        lease.drop()
        writes = len(rec.renewals)
        assert other.is_live(holder)
        await wait_out(store, holder)
        assert len(rec.renewals) == writes  # idle: the keeper wrote nothing
        assert not lease.valid() and not other.is_live(holder)
        # the next turn takes a new holder: the old one is never renewed again
        again = lease.hold()
        assert again != holder and lease.valid(again) and not lease.valid(holder)
        assert rec.renewals[writes:] == [again] and rec.releases == [holder]
        assert other.is_live(again) and not lease.is_live(holder)
        lease.close()


async def test_a_lost_lease_moves_to_a_new_holder(stores: tuple[Store, Store]) -> None:
    """The keeper's renewal reaches the store after the lease expired (it waited for a
    lock): the store says lost, the lease takes a new holder, the old one is dead."""
    store, other_store = stores
    rec = Recording(store)
    rec.late_done = anyio.Event()
    lease = ProcessLease(rec, ttl=0.3)  # type: ignore[arg-type]
    other = ProcessLease(other_store, ttl=0.3)
    async with anyio.create_task_group() as tg:
        holder = lease.hold()
        rec.late = True
        tg.start_soon(lease.keep)
        await rec.late_done.wait()
        assert rec.renewals[:2] == [holder, holder]  # taken, then the late renewal
        new = lease.holder
        assert new != holder and lease.held == 1
        assert not lease.valid(holder) and lease.valid() and lease.valid(new)
        assert not lease.is_live(holder) and not other.is_live(holder)
        assert other.is_live(new) and remaining(store, new) > 0
        assert holder in rec.releases
        lease.close()


async def test_a_holder_past_its_deadline_is_given_up_not_renewed(store: Store) -> None:
    """No keeper ran (a paused process): past its own deadline the lease never sends the
    old holder to the store again, even before the store would answer that it is lost."""
    rec = Recording(store)
    lease = ProcessLease(rec, ttl=0.3)  # type: ignore[arg-type]
    holder = lease.hold()
    await anyio.sleep(remaining(store, holder) - 0.3 * SAFETY_MARGIN + 0.01)
    assert not lease.valid()  # locally dead, though the store may still say alive
    new = lease.hold()
    assert new != holder and rec.renewals == [holder, new]
    assert rec.releases == [holder] and store.lease_remaining(holder) is None


async def test_a_busy_store_is_retried_at_the_next_tick(store: Store) -> None:
    rec = Recording(store)
    ttl = 1.0
    lease = ProcessLease(rec, ttl=ttl)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        holder = lease.hold()
        first = remaining(store, holder)
        rec.busy = 1  # the keeper's first renewal fails
        tg.start_soon(lease.keep)
        await anyio.sleep(first)  # the first lease's deadline
        assert rec.busy == 0 and len(rec.renewals) >= 3  # taken, failed, retried
        assert lease.holder == holder and lease.valid() and remaining(store, holder) > 0
        lease.close()


async def test_keep_returns_when_the_store_closes(store: Store) -> None:
    lease = ProcessLease(store, ttl=0.3)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            lease.hold()
            tg.start_soon(lease.keep)
            await anyio.lowlevel.checkpoint()
            store.close()  # the keeper's next renewal finds it closed and returns


async def test_keep_runs_once(store: Store) -> None:
    lease = ProcessLease(store, ttl=0.3)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lease.keep)
        await anyio.lowlevel.checkpoint()
        with pytest.raises(UsageError, match="already running"):
            await lease.keep()
        lease.close()


# ----------------------------------------------------------------------------- others


async def test_is_live_of_another_holder(stores: tuple[Store, Store]) -> None:
    one, two = ProcessLease(stores[0]), ProcessLease(stores[1])
    assert one.ttl == DEFAULT_TTL and one.holder != two.holder  # two runtimes, two holders
    theirs = one.holder
    assert not two.is_live(theirs)  # not taken yet
    one.hold()
    assert two.is_live(theirs) and one.is_live(theirs)
    assert not one.is_live(two.holder)  # two holds no turn: never taken
    for junk in (None, "", "a/b", 42, "x" * 1_000_000, {"holder": theirs}):
        assert not two.is_live(junk)  # a damaged turn record belongs to no live process
    one.close()
    assert not two.is_live(theirs)  # released: recoverable at once, not after the ttl
    assert stores[1].lease_remaining(theirs) is None


async def test_close_releases_and_ends_the_lease(store: Store) -> None:
    lease = ProcessLease(store, ttl=30)
    holder = lease.hold()
    lease.close()
    assert store.lease_remaining(holder) is None and not lease.valid()
    lease.close()  # twice is fine
    lease.drop()  # a turn ending after close is not an error
    for call in (lease.hold, lease.ensure):
        with pytest.raises(ClosedError, match=r"after close\(\)"):
            call()
    ProcessLease(store, ttl=30).close()  # never taken: nothing to release


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), 4000, "10", True])
async def test_a_bad_ttl_is_refused(ttl: Any) -> None:
    with pytest.raises(StoreConfigError, match=r"ProcessLease\(ttl=...\).*ttl"):
        ProcessLease(MemoryStore(), ttl=ttl)


# ------------------------------------------------------------- a real second process

_KEEPER_CHILD = """
import sys
import anyio
from runtime.cells.lease import ProcessLease
from runtime.storage import SQLiteStore

async def main() -> None:
    lease = ProcessLease(SQLiteStore(sys.argv[1]), ttl=float(sys.argv[2]))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lease.keep)
        print(lease.hold(), flush=True)  # a turn held, until the process is killed
        await anyio.sleep_forever()

anyio.run(main)
"""


async def test_a_killed_runtime_is_live_while_it_runs_and_dead_within_the_ttl(
    tmp_path: Path,
) -> None:
    path, ttl = tmp_path / "procs.db", 0.5
    store = SQLiteStore(path)
    watcher = ProcessLease(store, ttl=ttl)
    proc = subprocess.Popen([sys.executable, "-c", _KEEPER_CHILD, str(path), str(ttl)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(proc.stdout.readline()),  # type: ignore
                         daemon=True).start()
        try:
            holder = (await anyio.to_thread.run_sync(lambda: lines.get(timeout=30))).strip()
        except queue.Empty:
            pytest.fail("the child never held its lease")
        assert holder, f"the child failed: {proc.stderr.read() if proc.stderr else ''}"
        started = time.monotonic()
        while time.monotonic() - started < 3 * ttl:  # three deadlines, each renewed away
            await anyio.sleep(remaining(store, holder))
            assert watcher.is_live(holder), "the live child's keeper did not renew"
        proc.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(lambda: proc.wait(timeout=30))
        killed = time.monotonic()
        await wait_out(store, holder)
        assert not watcher.is_live(holder)
        assert time.monotonic() - killed <= ttl + 0.5  # within the ttl (+ scheduling)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        store.close()
