"""Parking a dialog (``Runtime.park``): only between turns; the next message brings it back
and its turn runs as any other; the management tools reach a parked instance's streams,
result and argument as a running one's."""

from __future__ import annotations

import json

import anyio
import pytest

from runtime import Runtime, generate_text, pattern
from runtime.builtins.management import Management, ToolOutcome
from runtime.cells.scope import Scope
from runtime.llm import Reply, ScriptedModel, call

from .support import Gate, assert_valid_history, todo_agent
from .test_management import host, todo

pytestmark = pytest.mark.anyio


async def test_a_dialog_parks_between_turns_and_its_next_turn_runs() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("addItem", {"title": "milk"})]), "Added.",
                           Reply(tool_calls=[call("addItem", {"title": "eggs"})]), "Added."])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="alice", session="s1")
        await inst.send("send", "add milk")
        await rt.settled()
        assert rt.park(inst)
        await inst.send("send", "add eggs")
        await rt.settled()
        assert inst.result.key("items").get() == ["milk", "eggs"]
        assert inst.result.key("pending").get() is False
        messages = assert_valid_history(inst)
        assert [m.text_content() for m in messages
                if m.role == "user" and m.text_content()] == ["add milk", "add eggs"]
        # the second turn's request carried the whole history, as without parking
        assert len(model.requests[-1].messages) == 7


async def test_a_dialog_in_a_turn_is_not_parked() -> None:
    gate = Gate(["Hello."])
    async with Runtime(model=gate) as rt:
        inst = rt.run(todo_agent, user="alice", session="s1")
        await inst.send("send", "hi")
        await gate.started.wait()
        assert rt.park(inst) is False  # its turn runs: nothing of it leaves
        assert rt.park_idle() == 0
        gate.opened.set()
        await rt.settled()
        assert rt.park(inst) is True
        assert inst.result.key("messages").get()[-1]["blocks"][0]["text"] == "Hello."


async def test_management_tools_reach_a_parked_instance() -> None:
    with anyio.fail_after(10):
        async with Runtime() as rt:
            inst = rt.run(todo, user="alice")
            pins = rt.run(host, user="alice").result.key("pins").resolve()
            m = Management(rt, space="default", scope=Scope.of("alice").key, pins=pins)
            assert rt.park(inst)
            out = await m.call("invoke", {"path": "/" + inst.result.id + "/add",
                                          "args": {"title": "eggs"}})
            assert isinstance(out, ToolOutcome) and not out.is_error, out.text
            assert inst.result.key("items").get() == ["eggs"]
            assert rt.park(inst)
            out = await m.call("updateArgument", {"path": "/" + inst.result.id,
                                                  "updates": {"title": "Groceries"}})
            assert not out.is_error, out.text
            assert inst.argument.key("title").get() == "Groceries"
            assert rt.park(inst)
            out = await m.call("read", {"path": "/" + inst.result.id + "/label"})
            assert not out.is_error and json.loads(out.text) == "Groceries: 1 (None)"


async def test_park_idle_from_a_commit_listener_never_loses_a_turn() -> None:
    model = ScriptedModel(["Hello."])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="alice", session="s1")
        rt.on_commit(lambda _: rt.park_idle())  # tried after every commit, the turn's too
        await inst.send("send", "hi")
        with anyio.fail_after(5):
            await rt.settled()
        assert rt.errors == []
        assert len(model.requests) == 1
        assert inst.result.key("messages").get()[-1]["blocks"][0]["text"] == "Hello."


@pattern(name="park-writer")
def writer(prompt: str = ""):
    gen = generate_text(prompt, system="Be brief.")
    return {"pending": gen.pending, "result": gen.result}


async def test_an_idle_generation_parks_and_comes_back_without_a_new_call() -> None:
    model = ScriptedModel(["Paris."])
    async with Runtime(model=model) as rt:
        inst = rt.run(writer, {"prompt": "Capital of France?"}, session="s")
        await rt.settled()
        assert inst.result.key("result").get() == "Paris."
        assert rt.park(inst) is True  # its own sink on its inputs does not hold it
        assert inst.result.key("result").get() == "Paris."
        await rt.settled()
        assert len(model.requests) == 1
