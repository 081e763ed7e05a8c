"""The awaited event path (``await inst.send``): it runs in the sender's task, after what was
queued before it, wakes no other task, yields to others at least every ``SEND_YIELD_EVERY``
seconds and is a cancellation point every time. What it leaves queued (an error that
escaped a handler run) the pump still runs."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from runtime import Runtime, StreamError, cell, current_instance, current_runtime, handler, pattern
from runtime.cells import runtime as runtime_module

pytestmark = pytest.mark.anyio


class Escape(BaseException):
    """Not an ``Exception``: no handler run catches it, so it leaves the drain."""


@pattern
def journal():
    """``go`` logs ``event["t"]`` and sends on each of ``event["then"]`` to itself (after it
    commits); ``fail``/``escape`` make it raise instead. ``work`` starts async work that
    waits for ``gate``."""
    log = cell([], name="log")
    me: dict[str, Any] = {}

    @handler
    def go(event: dict[str, Any], log: Any) -> None:
        if event.get("escape"):
            raise Escape(event["t"])
        if event.get("fail"):
            raise RuntimeError(f"failed {event['t']}")
        log.push(event["t"])
        for then in event.get("then", []):
            me["go"].send(then)

    @handler
    def work(event: dict[str, Any], log: Any) -> None:
        log.push("work")
        current_runtime().spawn(wait_for_gate, owner=current_instance())

    me["go"] = go(log=log)
    return {"log": log, "go": me["go"], "work": work(log=log)}


_gate: dict[str, anyio.Event] = {}


async def wait_for_gate() -> None:
    await _gate["open"].wait()


def log_of(inst: Any) -> list[str]:
    return inst.result.key("log").get()


async def test_an_awaited_send_runs_what_was_queued_first_then_itself_and_its_sends():
    async with Runtime() as rt:
        inst = rt.run(journal)
        inst.stream("go").send({"t": "queued 1"})
        inst.stream("go").send({"t": "queued 2", "then": [{"t": "from queued 2"}]})
        await inst.send("go", {"t": "awaited", "then": [{"t": "from awaited"}]})
        # all in the sender's task, in FIFO order, each handler's sends after it committed
        assert log_of(inst) == ["queued 1", "queued 2", "awaited", "from queued 2",
                                "from awaited"]
        assert not rt.scheduler.queue


async def test_the_awaited_event_raises_to_its_sender_and_a_queued_one_to_rt_errors():
    async with Runtime() as rt:
        inst = rt.run(journal)
        inst.stream("go").send({"t": "q", "fail": True})  # nobody awaits it
        with pytest.raises(RuntimeError, match="failed a"):
            await inst.send("go", {"t": "a", "fail": True})
        assert [str(e) for _, e in rt.errors] == ["failed q"]
        await inst.send("go", {"t": "b"})
        assert log_of(inst) == ["b"]


async def test_events_queued_after_many_awaited_sends_still_run_on_the_pump():
    async with Runtime() as rt:
        inst = rt.run(journal)
        for i in range(50):  # none of these wakes the pump
            await inst.send("go", {"t": str(i)})
        committed = anyio.Event()
        rt.on_commit(lambda changes: committed.set())
        inst.stream("go").send({"t": "queued"})  # nobody calls idle(): the pump runs it
        with anyio.fail_after(10):
            await committed.wait()
        assert log_of(inst)[-1] == "queued"


async def test_events_left_queued_by_an_escaping_error_run_on_the_pump():
    async with Runtime() as rt:
        inst = rt.run(journal)
        ran = anyio.Event()
        rt.on_commit(lambda changes: log_of(inst)[-1:] == ["after"] and ran.set())
        # "first" commits and sends two events; the first of them escapes the drain (a
        # BaseException reaches the sender), leaving "after" queued with no task draining
        with pytest.raises(Escape):
            await inst.send("go", {"t": "first", "then": [{"t": "x", "escape": True},
                                                           {"t": "after"}]})
        assert log_of(inst) == ["first"]
        with anyio.fail_after(10):
            await ran.wait()
        assert log_of(inst) == ["first", "after"]


async def test_a_send_is_a_cancellation_point_even_when_it_does_not_yield(monkeypatch):
    monkeypatch.setattr(runtime_module, "SEND_YIELD_EVERY", 3600.0)
    async with Runtime() as rt:
        inst = rt.run(journal)
        await inst.send("go", {"t": "a"})  # the first send yields; none after it does
        reached = False
        with anyio.CancelScope() as scope:
            scope.cancel()
            await inst.send("go", {"t": "b"})
            reached = True
        assert not reached
        assert scope.cancelled_caught
        # as at any checkpoint after the work: the event ran and committed first
        assert log_of(inst) == ["a", "b"]


async def test_sends_within_the_yield_budget_switch_to_no_other_task(monkeypatch):
    monkeypatch.setattr(runtime_module, "SEND_YIELD_EVERY", 3600.0)
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with Runtime() as rt, anyio.create_task_group() as tg:
        inst = rt.run(journal)
        await inst.send("go", {"t": "first"})  # yields (the budget starts here)
        tg.start_soon(other)
        for i in range(20):
            await inst.send("go", {"t": str(i)})
        assert ran == []  # no send gave the loop away
        await anyio.lowlevel.checkpoint()
        assert ran == ["other"]


async def test_with_no_yield_budget_every_send_yields(monkeypatch):
    monkeypatch.setattr(runtime_module, "SEND_YIELD_EVERY", 0.0)
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with Runtime() as rt, anyio.create_task_group() as tg:
        inst = rt.run(journal)
        await inst.send("go", {"t": "first"})
        tg.start_soon(other)
        await inst.send("go", {"t": "second"})
        assert ran == ["other"]


async def test_a_task_sending_in_a_loop_still_leaves_the_loop_to_others():
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with Runtime() as rt, anyio.create_task_group() as tg:
        inst = rt.run(journal)
        await inst.send("go", {"t": "first"})  # the first send yields: not what is tested
        tg.start_soon(other)
        give_up = time.monotonic() + 10 + runtime_module.SEND_YIELD_EVERY
        sent = 0
        while not ran and time.monotonic() < give_up:
            await inst.send("go", {"t": "again"})
            sent += 1
        assert ran == ["other"], f"no other task ran in {sent:,} sends"


async def test_settled_in_another_task_waits_through_awaited_sends_for_their_work():
    _gate["open"] = anyio.Event()
    done: list[str] = []

    async def wait_settled(rt: Runtime) -> None:
        await rt.settled()
        done.append("settled")

    async with Runtime() as rt, anyio.create_task_group() as tg:
        inst = rt.run(journal)
        await inst.send("work", {})  # its work starts once the handler commits
        tg.start_soon(wait_settled, rt)
        for i in range(5):
            await inst.send("go", {"t": str(i)})
            await anyio.lowlevel.checkpoint()
        assert done == []  # the work still waits for the gate
        _gate["open"].set()
        with anyio.fail_after(10):
            while not done:
                await anyio.lowlevel.checkpoint()
        assert log_of(inst) == ["work", "0", "1", "2", "3", "4"]


async def test_an_awaited_send_to_a_stopped_instance_and_queued_events_it_outlived():
    async with Runtime() as rt:
        a = rt.run(journal)
        b = rt.run(journal, cause="b")
        a.stream("go").send({"t": "queued for a"})
        rt.stop(a)
        with pytest.raises(StreamError, match="stopped"):
            await a.send("go", {"t": "late"})
        await b.send("go", {"t": "for b"})  # drains the queue: a's event is refused there
        assert log_of(b) == ["for b"]
        assert log_of(a) == []
        assert [type(e) for _, e in rt.errors] == [StreamError]
        assert "stopped before its event ran" in str(rt.errors[0][1])
