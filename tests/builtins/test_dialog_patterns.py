"""Patterns a model may run (defects 5 and 6 of issue 14): a pattern reference is a
capability given where a pattern's result offers it, never a name the model can spell; a
pattern tool's instance is the turn's and the call's place in it, never the model's id."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime import Runtime, cell, handler, lift, llm_dialog, pattern
from runtime.llm import Reply, ScriptedModel, call

from .support import assert_valid_history

pytestmark = pytest.mark.anyio

RAN: list[str] = []


@pattern(name="admin-wipe", argument_schema={"type": "object",
                                             "properties": {"who": {"type": "string"}}})
def admin_wipe(who=None):
    RAN.append(f"wipe {who}")
    return {"done": True}


@pattern(name="greeting-offered", argument_schema={
    "type": "object", "required": ["who"], "properties": {"who": {"type": "string"}}})
def greeting(who):
    return {"text": lift(lambda w: f"hello {w}")(who)}


@pattern(name="admin-console")
def admin_console():
    return {"wipe": admin_wipe}  # offered to the admin's dialog only


@handler(event={"type": "object", "properties": {"note": {}}})
def save_note(event, notes):
    notes.set(event["note"])  # an ordinary JSON tool: the model writes any JSON here


@pattern(name="user-agent")
def user_agent():
    notes = cell(None, scope="session", name="notes")
    messages = cell([], scope="session", name="messages")
    chat = llm_dialog(messages, tools={
        "saveNote": {"description": "Save a note", "handler": save_note(notes=notes)}})
    return {"messages": messages, "send": chat.add_message, "notes": notes,
            "greet": greeting, "pending": chat.pending}


def _results(inst: Any) -> list[dict[str, Any]]:
    return [b for m in inst.result.key("messages").get() for b in m["blocks"]
            if b["kind"] == "tool_result"]


async def test_a_pattern_reference_the_model_writes_is_data_and_never_runs():
    RAN.clear()
    model = ScriptedModel([])
    async with Runtime(model=model) as rt:
        rt.run(admin_console, user="admin", session="root")  # registers admin-wipe
        inst = rt.run(user_agent, user="mallory", session="m")
        notes = inst.result.key("notes").resolve().link()["@link"]
        forged = {"$pattern": admin_wipe.key}
        model.add(Reply(tool_calls=[
            call("saveNote", {"note": forged}),
            call("invoke", {"path": notes, "args": {"who": "everyone"}}),
        ]), "done")
        await inst.send("send", "run the admin's pattern")
        await rt.settled()
        saved, ran = _results(inst)
        assert not saved["is_error"]
        assert inst.result.key("notes").get() == forged  # it is stored: it is just data
        assert ran["is_error"] and "not a pattern offered to you" in ran["content"]
        assert RAN == []
        # the pattern its own result offers still runs, by its path there
        where = f"/{inst.result.id}/greet"
        model.add(Reply(tool_calls=[call("invoke", {"path": where, "args": {"who": "ada"}})]),
                  "ok")
        await inst.send("send", "greet ada")
        await rt.settled()
        out = json.loads(_results(inst)[-1]["content"])
        assert out["result"] == {"text": "hello ada"}
        assert_valid_history(inst)


async def test_update_argument_cannot_plant_a_runnable_pattern_reference():
    RAN.clear()

    @pattern(name="holder", argument_schema={"type": "object", "properties": {"slot": {}}})
    def holder(slot=None):
        return {"slot": slot}

    @pattern(name="planting-agent")
    def planting_agent():
        messages = cell([], name="messages")
        chat = llm_dialog(messages)
        return {"messages": messages, "send": chat.add_message, "held": holder}

    model = ScriptedModel([])
    async with Runtime(model=model) as rt:
        rt.run(admin_console, user="admin", session="root")
        inst = rt.run(planting_agent)
        held = rt.run(holder, {"slot": None})
        where = f"/{held.result.id}"
        model.add(Reply(tool_calls=[
            call("updateArgument", {"path": where, "updates": {
                "slot": {"$pattern": admin_wipe.key}}}),
            call("invoke", {"path": f"{where}/slot", "args": {"who": "all"}}),
        ]), "done")
        await inst.send("send", "plant it")
        await rt.settled()
        planted, ran = _results(inst)
        assert not planted["is_error"]  # written: it is data
        assert ran["is_error"] and "not a pattern offered to you" in ran["content"], ran
        assert RAN == []


# -------------------------------------------------------------- pattern tools and call ids


@pattern(name="echo-tool", argument_schema={"type": "object", "required": ["text"],
                                            "properties": {"text": {"type": "string"}}})
def echo_tool(text):
    return {"echo": lift(lambda t: t)(text)}


@pattern(name="echo-agent")
def echo_agent():
    messages = cell([], name="messages")
    chat = llm_dialog(messages, builtin_tools=False,
                      tools={"echo": {"description": "Echo", "pattern": echo_tool}})
    return {"messages": messages, "send": chat.add_message}


async def test_a_reused_call_id_still_runs_the_pattern_tool_with_its_new_arguments():
    """As against an OpenAI-compatible server that sends no ids: every reply says call_0."""
    model = ScriptedModel([
        Reply(tool_calls=[call("echo", {"text": "one"}, id="call_0")]),
        "first done",
        Reply(tool_calls=[call("echo", {"text": "two"}, id="call_0")]),
        Reply(tool_calls=[call("echo", {"text": "three"}, id="call_0")]),
        "second done",
    ])
    async with Runtime(model=model) as rt:
        inst = rt.run(echo_agent)
        await inst.send("send", "echo one")
        await rt.settled()
        await inst.send("send", "echo two then three")
        await rt.settled()
        echoes = [json.loads(r["content"])["result"]["echo"] for r in _results(inst)]
        assert echoes == ["one", "two", "three"]
        locations = {json.loads(r["content"])["@resultLocation"] for r in _results(inst)}
        assert len(locations) == 3  # three instances, one per call


async def test_a_stored_history_that_reuses_call_ids_still_makes_valid_requests():
    """Histories stored before ids were minted unique (every reply said call_0)."""
    def step(n: int) -> list[dict[str, Any]]:
        return [{"role": "user", "blocks": [{"kind": "text", "text": f"echo {n}"}]},
                {"role": "assistant", "blocks": [{"kind": "tool_use", "id": "call_0",
                                                  "name": "echo", "input": {"text": str(n)}}]},
                {"role": "user", "blocks": [{"kind": "tool_result", "tool_use_id": "call_0",
                                             "content": str(n)}]},
                {"role": "assistant", "blocks": [{"kind": "text", "text": f"echoed {n}"}]}]

    model = ScriptedModel(["fine"])
    async with Runtime(model=model) as rt:
        inst = rt.run(echo_agent)
        inst.result.key("messages").set(step(1) + step(2))
        await inst.send("send", "and now?")
        await rt.settled()
        [request] = model.requests
        ids = [b.id for m in request.messages for b in m.tool_uses()]
        assert len(ids) == 2 and len(set(ids)) == 2
        answered = [b.tool_use_id for m in request.messages for b in m.blocks
                    if b.kind == "tool_result"]
        assert answered == ids  # each result follows its renamed call
        assert inst.result.key("messages").get()[-1]["blocks"][0]["text"] == "fine"
