"""Calls at a later time, kept by one task per runtime (``Runtime.call_later``).

Work that may have to happen a moment later, and usually does not (text a dialog held back
to write a few times a second is written by its reply's commit long before the moment
comes), should not cost a task each time: a task, its cancel scope and the event it waits
on were about a twentieth of a dialog step's instructions. A ``Timer`` is one entry in a
heap; one task per runtime sleeps until the earliest is due and calls what is due, in
order. A cancelled timer stays in the heap, emptied, until it comes first when the task
goes to sleep (then it is dropped) or its time comes: timers set and cancelled a few
milliseconds later, turn after turn, wake the task about once per delay, not once each.
When cancelled timers are most of a large heap, it is rebuilt without them.

Times are the event loop's (``anyio.current_time()``): real seconds, not the runtime's
injectable ``clock``. Timers are not work that ``Runtime.settled()`` waits for: whoever
starts one is running, and cancels it when it stops needing it.
"""

from __future__ import annotations

import heapq
import inspect
import itertools
import math
from collections.abc import Callable

import anyio

__all__ = ["Timer", "Timers"]


class Timer:
    """A call due at ``deadline`` (``anyio.current_time()``), until ``cancel()``."""

    __slots__ = ("_timers", "deadline", "fn")

    def __init__(self, deadline: float, fn: Callable[[], None], timers: Timers) -> None:
        self.deadline = deadline
        self.fn: Callable[[], None] | None = fn
        self._timers = timers

    @property
    def cancelled(self) -> bool:
        """Cancelled, or called already: it will not be called (again)."""
        return self.fn is None

    def cancel(self) -> None:
        """Do not call it. Idempotent; what it would have called is let go now."""
        if self.fn is not None:
            self.fn = None
            self._timers.cancelled()


class Timers:
    """The heap of one runtime's timers and the task that calls them (``run``)."""

    __slots__ = ("_cancelled", "_heap", "_report", "_seq", "_until", "_wake")

    COMPACT_AT = 1024  # cancelled timers in the heap before it may be rebuilt without them

    def __init__(self, report: Callable[[BaseException, str], None]) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()  # ties in time go in the order they were asked
        self._report = report  # where a failing call is told (the runtime's errors)
        self._wake: anyio.Event | None = None  # set when a timer is due before ``_until``
        self._until = math.inf  # when the task wakes by itself
        self._cancelled = 0  # cancelled timers still in the heap

    def __len__(self) -> int:
        """Timers in the heap (cancelled ones included until they are dropped)."""
        return len(self._heap)

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        if not delay >= 0 or delay == math.inf:  # NaN and infinity included
            raise ValueError(f"call_later() takes a finite delay of 0 seconds or more, "
                             f"got {delay!r}")
        timer = Timer(anyio.current_time() + delay, fn, self)
        heapq.heappush(self._heap, (timer.deadline, next(self._seq), timer))
        if timer.deadline < self._until and (wake := self._wake) is not None:
            wake.set()
        return timer

    def cancelled(self) -> None:
        """A timer in the heap was cancelled. When most of a large heap is cancelled timers
        (a long delay set and cancelled again and again), it is rebuilt without them: what
        the heap holds stays proportional to the timers that may still run."""
        self._cancelled += 1
        heap = self._heap
        if self._cancelled >= self.COMPACT_AT and 2 * self._cancelled > len(heap):
            heap[:] = [entry for entry in heap if entry[2].fn is not None]
            heapq.heapify(heap)
            self._cancelled = 0

    def _pop(self) -> Timer:
        timer = heapq.heappop(self._heap)[2]
        if timer.fn is None:
            self._cancelled -= 1
        return timer

    async def run(self) -> None:
        """Call every timer when it is due, for the runtime's life (cancelled at close)."""
        heap = self._heap
        while True:
            self._wake = None  # calls below may add timers: looked at before sleeping
            now = anyio.current_time()
            if heap and heap[0][0] <= now:
                while heap and heap[0][0] <= now:
                    timer = self._pop()
                    fn, timer.fn = timer.fn, None
                    if fn is not None:
                        self._call(fn)
                # the calls took time: look at the clock again, after letting others run
                await anyio.lowlevel.checkpoint()
                continue
            # cancelled timers first in line are dropped, not slept for; if none is left,
            # the task still sleeps until the last one's time, so timers asked for meanwhile
            # with the same delay (turn after turn) wake it once per delay, not each
            until = math.inf
            while heap and heap[0][2].fn is None:
                until = self._pop().deadline
            self._until = heap[0][0] if heap else until
            wake = self._wake = anyio.Event()
            if self._until < math.inf:
                with anyio.move_on_after(self._until - now):
                    await wake.wait()
            else:
                await wake.wait()
            self._until = math.inf

    def _call(self, fn: Callable[[], None]) -> None:
        try:
            result: object = fn()
        except Exception as e:
            self._report(e, "a timer's call (Runtime.call_later)")
            return
        if inspect.isawaitable(result):  # an async function: nothing would await it
            close = getattr(result, "close", None)
            if close is not None:
                close()
            self._report(TypeError(
                "call_later() calls a plain function; it got an async one, whose coroutine "
                "nothing would await: start async work with rt.spawn() instead"),
                "a timer's call (Runtime.call_later)")
