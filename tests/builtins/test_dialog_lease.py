"""Turns owned by a process lease (defect 8 of issue 14): a live owner keeps its turn however
long it is silent; a dead owner's turn is recovered within about the lease's TTL, with a
valid history; a paused owner that comes back is fenced."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

import anyio
import pytest

from runtime import Runtime
from runtime.llm import ScriptedModel

from ..children import send, start, value
from .lease_agent import lease_agent
from .support import Gate, assert_valid_history, todo_agent

pytestmark = pytest.mark.anyio

WAIT = 20  # seconds: a bound on every wait, never a pause


async def test_a_live_owner_silent_far_longer_than_the_old_bound_keeps_its_turn():
    now = [1000.0]
    model = Gate(["the long answer"])
    async with Runtime(model=model, clock=lambda: now[0]) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        await inst.send("send", "one")
        with anyio.fail_after(WAIT):
            await model.started.wait()
        now[0] += 10_000  # far past the 300 s the heartbeat allowed
        await inst.send("send", "are you there?")
        assert inst.result.key("dropped").get() == 1
        assert inst.result.key("pending").get() is True
        model.opened.set()
        await rt.settled()
        texts = [m.text_content() for m in assert_valid_history(inst)]
        assert texts == ["one", "the long answer"]


async def test_another_process_leaves_a_live_turn_alone_past_several_ttls(shared_store):
    store = shared_store
    ttl = 0.4
    model = Gate(["from A"])
    async with Runtime(store=store, model=model, lease_ttl=ttl) as a_rt, \
            Runtime(store=store, model=ScriptedModel(["from B"]), lease_ttl=ttl) as b_rt:
        a = a_rt.run(todo_agent, user="u", session="s")
        b = b_rt.run(todo_agent, user="u", session="s")
        await a.send("send", "one")
        with anyio.fail_after(WAIT):
            await model.started.wait()
        await anyio.sleep(ttl * 4)  # the time under test: several TTLs of a silent owner
        await b.send("send", "while A is alive")
        assert b.result.key("dropped").get() == 1
        model.opened.set()
        await a_rt.settled()
    async with Runtime(store=store) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        assert [m.text_content() for m in assert_valid_history(inst)] == ["one", "from A"]


def _child(store: str, mode: str, ttl: float) -> subprocess.Popen[str]:
    return start("tests.builtins.lease_agent", store, mode, ttl)


async def test_a_killed_owners_turn_is_recovered_within_the_ttl_with_a_valid_history(shared_store):
    store = shared_store
    ttl = 2.0
    child = _child(store, "block", ttl)
    try:
        holder = await value(child, "blocked")
        child.send_signal(signal.SIGKILL)  # mid-turn: its step's calls have no results
        killed = time.monotonic()
        child.wait(WAIT)
    finally:
        child.kill()
    async with Runtime(store=store, model=ScriptedModel(["recovered"]), lease_ttl=ttl) as rt:
        inst = rt.run(lease_agent, user="u", session="s")
        await inst.send("send", "hello?")  # the dead owner's lease has not expired yet
        assert inst.result.key("dropped").get() == 1
        remaining = rt.store.lease_remaining(holder)
        assert remaining is not None and remaining <= ttl
        await anyio.sleep(max(0.0, remaining) + 0.05)  # until the lease's own deadline
        await inst.send("send", "again")
        recovered = time.monotonic() - killed
        await rt.settled()
        assert recovered <= ttl + 1.0, recovered
        messages = assert_valid_history(inst)
        assert [m.role.value for m in messages] == [
            "user", "assistant", "user", "assistant", "user", "assistant"]
        interrupted = messages[2].blocks
        assert len(interrupted) == 2 and all(r.is_error for r in interrupted)
        assert all("interrupted" in r.content for r in interrupted)
        assert "interrupted" in messages[3].text_content()
        assert [messages[4].text_content(), messages[5].text_content()] == [
            "again", "recovered"]
        assert inst.result.key("pending").get() is False


async def test_a_paused_owner_that_comes_back_is_fenced(shared_store):
    store = shared_store
    ttl = 1.0
    child = _child(store, "gate", ttl)
    try:
        holder = await value(child, "holder")
        await value(child, "waiting")  # its model call is open
        child.send_signal(signal.SIGSTOP)
        async with Runtime(store=store, model=ScriptedModel(["from B"]),
                           lease_ttl=ttl) as rt:
            inst = rt.run(lease_agent, user="u", session="s")
            with anyio.fail_after(WAIT):
                while (left := rt.store.lease_remaining(holder)) is not None and left > 0:
                    await anyio.sleep(left + 0.05)  # until the paused owner's deadline
            await inst.send("send", "two")
            await rt.settled()
        child.send_signal(signal.SIGCONT)
        send(child)  # A's late reply arrives
        await value(child, "done")  # its turn ended
        assert child.wait(WAIT) == 0
    finally:
        child.kill()
    async with Runtime(store=store) as rt:
        inst = rt.run(lease_agent, user="u", session="s")
        texts = [m.text_content() for m in assert_valid_history(inst)]
        assert "late from A" not in " ".join(texts)
        assert texts[0] == "one" and texts[-2:] == ["two", "from B"]


async def test_a_cancel_from_another_process_stops_the_rest_of_the_step_and_the_model(shared_store):
    """B's copy was read before A's turn began (a long-lived server): its cancel still
    reaches the turn, and A runs neither the step's later calls nor another model call."""
    from runtime.llm import Reply, call

    store = shared_store
    model = ScriptedModel([])
    async with Runtime(store=store, model=model) as a_rt, \
            Runtime(store=store, model=ScriptedModel([])) as b_rt:
        a = a_rt.run(todo_agent, user="u", session="s")
        b = b_rt.run(todo_agent, user="u", session="s")  # read before A's turn starts
        entered, hold = anyio.Event(), anyio.Event()
        real_send = a_rt.send

        async def held_send(stream: Any, event: Any) -> None:
            if stream.name == "add_item" and event["title"] == "first":
                entered.set()
                await hold.wait()  # the step's first call is in flight
            await real_send(stream, event)

        a_rt.send = held_send  # type: ignore[method-assign]
        model.add(Reply(tool_calls=[
            call("invoke", {"path": f"/{a.result.id}/add", "args": {"title": "first"}}),
            call("addItem", {"title": "mark"})]), "never asked")
        await a.send("send", "add two")
        with anyio.fail_after(WAIT):
            await entered.wait()
        assert b.result.key("pending").get() is False  # B's copy is stale
        await b.send("cancel", None)
        assert b.result.key("pending").get() is False
        hold.set()
        with anyio.fail_after(WAIT):
            await a_rt.settled()
        assert len(model.requests) == 1  # no model call after the cancel
    async with Runtime(store=store) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        assert "mark" not in inst.result.key("items").get()  # the later call never ran
        messages = assert_valid_history(inst)
        assert [m.role.value for m in messages] == ["user", "assistant", "user"]
        assert all(r.is_error for r in messages[2].blocks)
        assert inst.result.key("pending").get() is False


async def _until(inst: Any, name: str, want: Any) -> None:
    """Wait (bounded) until the instance's ``name`` reads ``want``: a sink, no polling."""
    seen = anyio.Event()
    stop = inst.result.key(name).sink(lambda v: seen.set() if v == want else None)
    try:
        with anyio.fail_after(WAIT):
            await seen.wait()
    finally:
        stop()


async def test_a_cancel_from_another_process_stops_the_owners_model_call_at_once(shared_store):
    """A's model is in the middle of a reply that never ends. B, another process whose copy
    was read before A's turn began, sees the turn start and its streamed text through the
    change feed, and cancels it: A's model call is cancelled at once, not at a step
    boundary that would never come."""
    child = _child(shared_store, "forever", 10.0)
    try:
        async with Runtime(store=shared_store, model=ScriptedModel([])) as rt:
            inst = rt.run(lease_agent, user="u", session="s")
            assert inst.result.key("pending").get() is False
            await value(child, "waiting")
            await _until(inst, "pending", True)  # A's commit reached B with nobody asking
            await _until(inst, "partial", "thinking about it")
            await inst.send("cancel", None)
            cancelled = await value(child, "cancelled", WAIT)  # never cancelled: fails
            assert await value(child, "done") is False
            assert child.wait(WAIT) == 0
            assert cancelled > 0
            assert inst.result.key("pending").get() is False
            assert inst.result.key("partial").get() is None
        assert rt.errors == []
    finally:
        child.kill()
    async with Runtime(store=shared_store) as rt:
        inst = rt.run(lease_agent, user="u", session="s")
        assert [m.text_content() for m in assert_valid_history(inst)] == ["one"]


async def test_a_conversation_alternating_between_processes_loses_no_reply(shared_store):
    """Each message goes to the other runtime the moment the last reply showed in the one
    that made it: the receiver's copies of the dialog's cells may be a moment behind (the
    feed is on its way), so its own commits can meet the other's. Nothing is dropped, no
    reply is lost to a conflict, and no turn stays pending."""
    from patterns.chatbot import chatbot

    replies = [f"Reply {i}." for i in range(6)]
    async with Runtime(store=shared_store, model=ScriptedModel(replies[0::2])) as a_rt, \
            Runtime(store=shared_store, model=ScriptedModel(replies[1::2])) as b_rt:
        a = a_rt.run(chatbot, user="u", session="s")
        b = b_rt.run(chatbot, user="u", session="s")
        for i in range(6):
            inst = a if i % 2 == 0 else b
            await inst.send("send", f"Message {i}")
            await _until(inst, "pending", False)
            texts = [m.text_content() for m in assert_valid_history(inst)]
            assert texts[-2:] == [f"Message {i}", replies[i]], texts
        assert a.result.key("dropped").get() == 0 and b.result.key("dropped").get() == 0
        assert a_rt.errors == [] and b_rt.errors == []
