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
