"""``Runtime(freeze_gc=True)``: live objects leave the collector's sight after enough
instances start, frozen cycles that became garbage are collected at the next refreeze, and
closing the runtime hands everything back."""

from __future__ import annotations

import gc
import weakref

import anyio
import pytest

from runtime import Runtime, cell, computed, pattern
from runtime.cells import collector


class Payload:
    """Something an instance's graph holds, in a reference cycle (only the collector
    frees it)."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _thawed():
    yield
    gc.unfreeze()  # whatever a failing test left frozen goes back to the collector


def test_refreezes_as_instances_double_and_thaws_at_close(monkeypatch) -> None:
    monkeypatch.setattr(collector, "FLOOR", 4)
    held: list[weakref.ref[Payload]] = []

    @pattern(name="gc-counter")
    def counter():
        payload = Payload()
        held.append(weakref.ref(payload))
        n = cell(0, name="n")
        # the instance's graph keeps it alive (a computed's closure holds it)
        shown = computed(lambda: n.get() if payload.me else None, name="shown")
        return {"n": n, "shown": shown}

    async def main() -> None:
        async with Runtime(store="memory", freeze_gc=True) as rt:
            assert rt.collector is not None
            insts = [rt.run(counter, session=f"s{i}") for i in range(3)]
            assert gc.get_freeze_count() == 0 and rt.collector.refreezes == 0
            insts.append(rt.run(counter, session="s3"))  # the 4th: the first refreeze
            assert rt.collector.refreezes == 1 and gc.get_freeze_count() > 0
            for inst in insts:
                rt.stop(inst)
            del inst, insts
            gc.collect()  # frozen cycles are out of the collector's sight
            assert held[0]() is not None
            for i in range(4):  # as many started again as were running: refreeze
                rt.run(counter, session=f"t{i}")
            assert rt.collector.refreezes == 2
            assert all(ref() is None for ref in held[:4])  # the stopped ones' cycles freed
            assert all(ref() is not None for ref in held[4:])  # the running ones kept
        assert gc.get_freeze_count() == 0  # closed: everything back with the collector

    anyio.run(main)


def test_off_by_default() -> None:
    @pattern(name="gc-plain")
    def plain():
        return {"n": cell(0, name="n")}

    async def main() -> None:
        async with Runtime(store="memory") as rt:
            assert rt.collector is None
            for i in range(5):
                rt.run(plain, session=f"s{i}")
            assert gc.get_freeze_count() == 0

    anyio.run(main)


def test_young_collections_are_rarer_while_a_policy_runtime_is_open() -> None:
    """While a ``freeze_gc`` runtime is open the youngest generation is collected every
    ``YOUNG`` allocations; the last one closed puts back the thresholds it found, and a
    runtime without the policy leaves them alone."""
    found = gc.get_threshold()
    gc.set_threshold(500, 7, 9)
    try:
        async def main() -> None:
            async with Runtime(store="memory") as plain:
                assert gc.get_threshold() == (500, 7, 9)
                async with Runtime(store="memory", freeze_gc=True):
                    assert gc.get_threshold() == (collector.YOUNG, 7, 9)
                    async with Runtime(store="memory", freeze_gc=True):
                        assert gc.get_threshold() == (collector.YOUNG, 7, 9)
                    assert gc.get_threshold() == (collector.YOUNG, 7, 9)  # one still open
                assert gc.get_threshold() == (500, 7, 9)
                assert plain.collector is None

        anyio.run(main)
        gc.set_threshold(50_000, 7, 9)  # a larger one of the application's own is kept

        async def larger() -> None:
            async with Runtime(store="memory", freeze_gc=True):
                assert gc.get_threshold() == (50_000, 7, 9)
            assert gc.get_threshold() == (50_000, 7, 9)

        anyio.run(larger)
    finally:
        gc.set_threshold(*found)


def test_the_thresholds_go_back_when_the_store_fails_to_close() -> None:
    from runtime.storage import MemoryStore

    class Failing(MemoryStore):
        def close(self) -> None:
            raise OSError("the disk went away")

    found = gc.get_threshold()
    try:
        gc.set_threshold(600, 10, 10)

        async def main() -> None:
            async with Runtime(store=Failing(), freeze_gc=True):
                assert gc.get_threshold() == (collector.YOUNG, 10, 10)

        with pytest.raises(OSError, match="disk"):
            anyio.run(main)
        assert gc.get_threshold() == (600, 10, 10) and collector._open == 0
    finally:
        gc.set_threshold(*found)


def test_policies_opened_and_closed_in_threads_put_the_thresholds_back() -> None:
    import sys
    import threading

    found, interval = gc.get_threshold(), sys.getswitchinterval()
    try:
        gc.set_threshold(700, 10, 10)
        sys.setswitchinterval(1e-6)  # switch threads as often as can be

        def churn() -> None:
            for _ in range(20_000):
                policy = collector.FreezePolicy(lambda: 0)
                policy.open()
                policy.close()

        threads = [threading.Thread(target=churn) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert gc.get_threshold() == (700, 10, 10) and collector._open == 0
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*found)


def test_thresholds_the_application_set_while_a_policy_was_open_stay() -> None:
    found = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        policy = collector.FreezePolicy(lambda: 0)
        policy.open()
        gc.set_threshold(3000, 20, 20)  # the application's own, meanwhile
        policy.close()
        assert gc.get_threshold() == (3000, 20, 20)
    finally:
        gc.set_threshold(*found)
