"""``Runtime.call_later``: calls at a later time kept by one task per runtime (a heap entry
each, not a task), in order, cancellable, reported when they fail, never waited for by
``settled()``."""

from __future__ import annotations

import math

import anyio
import pytest

from runtime import Runtime
from runtime.errors import ClosedError

pytestmark = pytest.mark.anyio


async def test_timers_are_called_when_due_in_the_order_of_their_times() -> None:
    calls: list[str] = []
    done = anyio.Event()
    async with Runtime() as rt:
        rt.call_later(0.06, lambda: (calls.append("late"), done.set()))
        rt.call_later(0.02, lambda: calls.append("early"))  # sooner: wakes the timer task
        rt.call_later(0.0, lambda: calls.append("now"))
        dropped = rt.call_later(0.01, lambda: calls.append("cancelled"))
        dropped.cancel()
        dropped.cancel()  # idempotent
        assert dropped.cancelled
        with anyio.fail_after(5):
            await done.wait()
    assert calls == ["now", "early", "late"]


async def test_a_timer_set_by_a_timer_runs_and_ties_keep_their_order() -> None:
    calls: list[int] = []
    done = anyio.Event()
    async with Runtime() as rt:
        def first() -> None:
            calls.append(1)
            for i in (2, 3, 4):  # the same delay: in the order asked
                rt.call_later(0.0, lambda i=i: calls.append(i))
            rt.call_later(0.01, done.set)

        rt.call_later(0.0, first)
        with anyio.fail_after(5):
            await done.wait()
    assert calls == [1, 2, 3, 4]


async def test_a_failing_call_is_reported_and_the_next_ones_still_run() -> None:
    done = anyio.Event()
    async with Runtime() as rt:
        rt.call_later(0.0, lambda: 1 / 0)
        rt.call_later(0.01, done.set)
        with anyio.fail_after(5):
            await done.wait()
        assert [type(e) for _, e in rt.errors] == [ZeroDivisionError]
        assert "call_later" in rt.errors[0][0]


async def test_settled_does_not_wait_for_a_timer_and_closing_drops_it() -> None:
    calls: list[str] = []
    async with Runtime() as rt:
        timer = rt.call_later(600, lambda: calls.append("late"))
        await rt.settled()  # returns with the timer pending (it is no work in flight)
        assert not timer.cancelled and calls == []
    assert calls == [] and rt.errors == []


@pytest.mark.parametrize("delay", [-1.0, math.nan, math.inf, -math.inf])
async def test_a_delay_that_is_not_a_finite_time_to_come_is_refused(delay: float) -> None:
    async with Runtime() as rt:
        with pytest.raises(ValueError, match="finite delay of 0 seconds or more"):
            rt.call_later(delay, lambda: None)


async def test_call_later_needs_a_running_runtime() -> None:
    rt = Runtime()
    with pytest.raises(ClosedError, match="running runtime"):
        rt.call_later(1, lambda: None)
    async with rt:
        pass
    with pytest.raises(ClosedError, match="after the runtime closed"):
        rt.call_later(1, lambda: None)


async def test_a_timer_due_before_the_time_the_task_sleeps_to_wakes_it() -> None:
    """The task drops a cancelled timer first in line but sleeps until its time (so that
    timers of the same delay asked for meanwhile wake nobody): one due sooner wakes it."""
    done = anyio.Event()
    async with Runtime() as rt:
        started = anyio.Event()
        rt.call_later(0.0, started.set)
        with anyio.fail_after(5):
            await started.wait()
        rt.call_later(600, lambda: None).cancel()
        while len(rt._timers):  # the task woke, dropped it, and sleeps until its time
            await anyio.lowlevel.checkpoint()
        assert rt._timers._until > 500
        rt.call_later(0.01, done.set)
        with anyio.fail_after(5):
            await done.wait()


async def test_a_timer_runs_in_a_context_of_its_own_not_the_first_setters() -> None:
    """The timers' task starts with the first ``call_later``; if that came from a handler,
    the task must not carry the handler's transaction: a later timer's writes and events
    land (they were refused, or silently lost, before)."""
    from runtime import cell, current_runtime, handler, pattern

    @handler
    def arm(event: None, seen):
        current_runtime().call_later(0.0, lambda: None)  # the first timer: in a handler
        seen.set(seen.get() + 1)

    @handler
    def add(event: str, items):
        items.push(event)

    @pattern
    def box():
        items = cell([], name="items")
        seen = cell(0, name="seen")
        return {"items": items, "seen": seen, "arm": arm(seen=seen), "add": add(items=items)}

    done = anyio.Event()
    async with Runtime() as rt:
        inst = rt.run(box)
        await inst.send("arm", None)
        items, add_stream = inst.result.key("items"), inst.stream("add")

        def later() -> None:
            with rt.transaction():
                items.push("written")
            add_stream.send("sent")  # queued from outside a handler
            done.set()

        rt.call_later(0.0, later)
        with anyio.fail_after(5):
            await done.wait()
        await rt.settled()
        assert items.get() == ["written", "sent"] and rt.errors == []


async def test_cancelled_timers_do_not_pile_up_in_the_heap() -> None:
    """A long delay set and cancelled again and again (an idle timeout re-armed): the heap
    is rebuilt without them once most of it is cancelled."""
    async with Runtime() as rt:
        keep = rt.call_later(600, lambda: None)
        for _ in range(10_000):
            rt.call_later(600, lambda: None).cancel()
        assert len(rt._timers) <= 2 * rt._timers.COMPACT_AT + 1
        assert not keep.cancelled


async def test_an_async_function_is_refused_when_called_not_left_unawaited() -> None:
    done = anyio.Event()
    ran: list[str] = []

    async def work() -> None:  # pragma: no cover - never awaited, by design
        ran.append("work")

    async with Runtime() as rt:
        rt.call_later(0.0, work)  # type: ignore[arg-type]
        rt.call_later(0.01, done.set)
        with anyio.fail_after(5):
            await done.wait()
        assert ran == []
        [(where, error)] = rt.errors
        assert "call_later" in where
        assert isinstance(error, TypeError) and "rt.spawn()" in str(error)


async def test_call_later_while_the_runtime_closes_is_a_closed_error() -> None:
    raised: list[BaseException] = []

    async def work() -> None:
        try:
            await anyio.sleep_forever()
        finally:  # cancelled by the runtime's close
            try:
                rt.call_later(1, lambda: None)
            except Exception as e:  # what it raises is the point
                raised.append(e)

    async with Runtime() as rt:
        rt.spawn(work)
        await anyio.lowlevel.checkpoint()
    assert [type(e) for e in raised] == [ClosedError]
