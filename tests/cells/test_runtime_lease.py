"""The runtime's process lease (issue 14, defect 8, the runtime's side): ``rt.lease`` is a
``ProcessLease`` in the runtime's store, its keeper runs in the runtime's task group without
counting as work ``settled()`` or ``idle()`` waits for, and closing the runtime stops the
keeper and releases the lease. (The lease itself: tests/storage/test_lease.py.)"""

from __future__ import annotations

import anyio
import pytest

from runtime.cells import Runtime, UsageError, cell, pattern
from runtime.cells.lease import DEFAULT_TTL, ProcessLease
from runtime.errors import StoreConfigError
from runtime.storage import open_store

pytestmark = pytest.mark.anyio


@pattern
def counter():
    return {"n": cell(0, name="n")}


async def test_the_lease_lives_in_the_runtimes_store_with_the_ttl_given():
    rt = Runtime()
    assert isinstance(rt.lease, ProcessLease) and rt.lease.ttl == DEFAULT_TTL
    assert Runtime(lease_ttl=2.5).lease.ttl == 2.5
    with pytest.raises(StoreConfigError):
        Runtime(lease_ttl=0)


async def test_the_keeper_runs_with_the_runtime_and_settled_does_not_wait_for_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'app.db'}"
    with anyio.fail_after(10):  # a deadline, not a wait: a keeper counted as work would hang
        async with Runtime(store=url) as rt:
            with pytest.raises(UsageError, match="already running"):
                await rt.lease.keep()  # the runtime started it
            holder = rt.lease.hold()  # a turn owns the lease: the keeper renews it
            assert rt.store.lease_remaining(holder) > 0
            inst = rt.run(counter)
            inst.result.key("n").set(1)
            await rt.settled()
            await rt.idle()
            rt.lease.drop()
            await rt.settled()
        # the runtime closed: the keeper was cancelled and the lease released in the store
        assert not rt.lease.valid()
        store = open_store(url)
        try:
            assert store.lease_remaining(holder) is None
        finally:
            store.close()


async def test_a_runtime_whose_body_raises_still_releases_its_lease(tmp_path):
    url = f"sqlite:///{tmp_path / 'app.db'}"
    with pytest.raises(RuntimeError, match="body"):
        async with Runtime(store=url) as rt:
            holder = rt.lease.hold()
            raise RuntimeError("body")
    store = open_store(url)
    try:
        assert store.lease_remaining(holder) is None
    finally:
        store.close()
