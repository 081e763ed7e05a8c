"""Parking a dialog (``Runtime.park``): only between turns; the next message brings it back
and its turn runs as any other; the management tools reach a parked instance's streams,
result and argument as a running one's."""

from __future__ import annotations

import json

import anyio
import pytest

from runtime import Runtime
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
