"""The dialog's ``stop_reason`` output: why the last model call of the last turn stopped (the
port's ``StopReason`` as a string), written once, with the commit that ends the turn."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from runtime import Runtime, cell, llm_dialog, pattern
from runtime.llm import LLMError, Reply, ScriptedModel, StopReason, call, delayed
from runtime.llm.errors import Fault

from .support import add_item

pytestmark = pytest.mark.anyio


@pattern(name="stop-reason-agent")
def agent():
    messages = cell([], name="messages")
    chat = llm_dialog(messages, builtin_tools=False)
    return {"messages": messages, "send": chat.add_message, "cancel": chat.cancel_generation,
            "pending": chat.pending, "error": chat.error, "stop_reason": chat.stop_reason}


@pattern(name="stop-reason-todo-agent")
def todo_agent_with_stop():
    items = cell([], scope="user", name="items")
    messages = cell([], scope="session", name="messages")
    chat = llm_dialog(messages, builtin_tools=False,
                      tools={"addItem": {"description": "Add an item",
                                         "handler": add_item(items=items)}})
    return {"items": items, "messages": messages, "send": chat.add_message,
            "pending": chat.pending, "error": chat.error, "stop_reason": chat.stop_reason}


def _watch(rt: Runtime, inst: Any) -> list[tuple[bool, Any]]:
    """(pending, stop_reason) after every commit."""
    seen: list[tuple[bool, Any]] = []
    pending, stop = inst.result.key("pending"), inst.result.key("stop_reason")
    rt.on_commit(lambda changes: seen.append((pending.get(), stop.get())))
    return seen


async def test_a_reply_cut_at_max_tokens_says_so_and_the_next_turn_clears_it():
    model = ScriptedModel([Reply(text="Once upon a ti", stop_reason=StopReason.MAX_TOKENS),
                           delayed(0.05, "Done.")])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent)
        stop = inst.result.key("stop_reason")
        assert stop.get() is None  # before any turn
        seen = _watch(rt, inst)
        await inst.send("send", "tell a story")
        await rt.settled()
        assert stop.get() == "max_tokens" == StopReason.MAX_TOKENS.value
        assert inst.result.key("error").get() is None  # cut short is not an error
        # written in the commit that ends the turn, not after it
        assert seen[-1] == (False, "max_tokens") and (True, "max_tokens") not in seen
        await inst.send("send", "go on")
        assert inst.result.key("pending").get() is True
        assert stop.get() is None  # while a turn runs: that turn's is not known yet
        await rt.settled()
        assert stop.get() == "end_turn"


async def test_it_is_written_once_a_turn_not_at_every_step():
    model = ScriptedModel([Reply(tool_calls=[call("addItem", {"title": "a"})]),
                           Reply(tool_calls=[call("addItem", {"title": "b"})]), "Added both."])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent_with_stop, user="u", session="s")
        seen = _watch(rt, inst)
        await inst.send("send", "add a and b")
        await rt.settled()
        assert inst.result.key("items").get() == ["a", "b"]
        assert len(seen) == 4  # accept, two steps, the final reply
        # the steps' "tool_use" replies are never written: only the end of the turn writes
        assert [s for _, s in seen] == [None, None, None, "end_turn"]


async def test_a_turn_at_max_steps_ends_on_tool_use_with_its_error():
    model = ScriptedModel([Reply(tool_calls=[call("addItem", {"title": "x"})])] * 50)
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent_with_stop, user="u", session="s")
        await inst.send("send", "loop")
        await rt.settled()
        assert "max_steps" in inst.result.key("error").get()
        assert inst.result.key("stop_reason").get() == "tool_use"


@pytest.mark.parametrize("script", [
    [LLMError("overloaded", fault=Fault.TERMINAL, provider="scripted")],
    [RuntimeError("boom")],
])
async def test_a_call_that_gave_no_reply_leaves_none(script):
    model = ScriptedModel([Reply(text="Hi.", stop_reason=StopReason.MAX_TOKENS), *script])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent)
        await inst.send("send", "one")
        await rt.settled()
        assert inst.result.key("stop_reason").get() == "max_tokens"
        await inst.send("send", "two")
        await rt.settled()
        assert inst.result.key("error").get() is not None
        assert inst.result.key("stop_reason").get() is None


async def test_an_empty_reply_keeps_why_the_model_stopped():
    model = ScriptedModel([Reply(text="", stop_reason=StopReason.CONTEXT_EXCEEDED)])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent)
        await inst.send("send", "a very long question")
        await rt.settled()
        assert "empty reply" in inst.result.key("error").get()
        assert inst.result.key("stop_reason").get() == "context_exceeded"


async def test_a_cancelled_turn_leaves_none():
    model = ScriptedModel([Reply(text="Hi.", stop_reason=StopReason.MAX_TOKENS),
                           delayed(60, Reply(text="Too late.", stop_reason=StopReason.MAX_TOKENS))])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent)
        await inst.send("send", "one")
        await rt.settled()
        assert inst.result.key("stop_reason").get() == "max_tokens"
        await inst.send("send", "two")
        with anyio.fail_after(5):
            while len(model.requests) < 2:  # the second call is in flight
                await anyio.sleep(0.01)
        await inst.send("cancel", None)
        await rt.settled()
        assert inst.result.key("pending").get() is False
        assert inst.result.key("error").get() is None
        assert inst.result.key("stop_reason").get() is None  # no reply ended it
