"""The llm_dialog builtin through the real runtime, against ScriptedModel (first slice of
issue 7: turns, handler tools, presentResult, cancellation, errors, scopes)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from runtime import (
    PatternError,
    Runtime,
    cell,
    handler,
    lift,
    llm_dialog,
    pattern,
    tool_result,
)
from runtime.llm import Message, Reply, Request, ScriptedModel, call

from ..llm.test_steps import assert_valid_for_both_providers
from .support import Gate

pytestmark = pytest.mark.anyio


class AddItem(BaseModel):
    title: str


@handler
def add_item(event: AddItem, items):
    items.push(event.title)


@pattern(name="todo-agent")
def todo_agent():
    items = cell([], scope="user", name="items")
    messages = cell([], scope="session", name="messages")
    chat = llm_dialog(
        messages=messages,
        system="You keep the user's todo list.",
        tools={"addItem": {"description": "Add an item", "handler": add_item(items=items)}},
        context={"items": items},
    )
    return {"items": items, "messages": messages, "pending": chat.pending,
            "send": chat.add_message, "cancel": chat.cancel_generation, "error": chat.error,
            "usage": chat.usage, "dropped": chat.dropped}


def _roles(inst: Any) -> list[str]:
    return [m["role"] for m in inst.result.key("messages").get()]


async def test_the_usage_of_the_issue_runs_as_written():
    model = ScriptedModel([Reply(tool_calls=[call("addItem", {"title": "milk"})]), "Added milk."])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="alice", session="s1")
        await inst.send("send", "add milk")
        await rt.settled()
        assert inst.result.key("items").get() == ["milk"]
        # one tool round adds exactly three messages after the user's
        assert _roles(inst) == ["user", "assistant", "user", "assistant"]
        results = inst.result.key("messages").get()[2]["blocks"]
        assert [b["kind"] for b in results] == ["tool_result"]
        assert inst.result.key("pending").get() is False
        assert inst.result.key("error").get() is None


async def test_the_second_request_carries_the_whole_history_and_the_context():
    model = ScriptedModel(["Hello.", "Still here."])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="alice", session="s1")
        inst.result.key("items").set(["eggs"])
        await inst.send("send", "hi")
        await rt.settled()
        await inst.send("send", "again")
        await rt.settled()
        _, second = model.requests
        assert [m.text_content() for m in second.messages] == ["hi", "Hello.", "again"]
        assert "# Available Cells" in second.system and '["eggs"]' in second.system
        assert second.system.startswith("You keep the user's todo list.")
        assert [t.name for t in second.tools] == [
            "addItem", "read", "invoke", "schema", "pin", "unpin", "updateArgument"]
        assert second.tools[0].input_schema["properties"]["title"]["type"] == "string"


async def test_a_message_while_pending_is_ignored_and_counted():
    model = Gate(["first answer"])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        await inst.send("send", "one")
        with anyio.fail_after(10):
            await model.started.wait()
        await inst.send("send", "two")  # ignored: the turn is pending
        assert inst.result.key("dropped").get() == 1
        model.opened.set()
        await rt.settled()
        assert [m["blocks"][0]["text"] for m in inst.result.key("messages").get()] == [
            "one", "first answer"]


async def test_cancel_while_held_sets_pending_false_at_once_and_the_late_reply_lands_nowhere():
    model = Gate(["too late"])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        await inst.send("send", "question")
        with anyio.fail_after(10):
            await model.started.wait()
        await inst.send("cancel", None)
        assert inst.result.key("pending").get() is False
        model.opened.set()
        await rt.settled()
        assert _roles(inst) == ["user"]
        # the next turn works and sees a valid history
        model.inner = ScriptedModel(["fresh"])
        await inst.send("send", "again")
        await rt.settled()
        assert [m["blocks"][0]["text"] for m in inst.result.key("messages").get()] == [
            "question", "again", "fresh"]


async def test_pending_written_false_by_a_user_leaves_the_late_reply_nowhere():
    # the dialog watches ``turn`` (written with ``pending`` by every start and end); a write
    # of ``pending`` alone reaches the turn at its next write, which finds it not pending
    model = Gate(["too late"])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        await inst.send("send", "question")
        with anyio.fail_after(10):
            await model.started.wait()
        inst.result.key("pending").set(False)
        model.opened.set()
        await rt.settled()
        assert _roles(inst) == ["user"]
        assert inst.result.key("pending").get() is False


async def test_cancel_during_the_first_of_two_tool_calls_answers_both():
    """The calls are ``invoke`` (a management tool: it awaits the handler's event, so a
    call can be in flight); a handler tool runs inside its step's commit and cannot be."""
    entered, release = anyio.Event(), anyio.Event()
    ran: list[str] = []

    @handler
    def slow(event, log):
        ran.append(event["n"])
        log.push(event["n"])

    @pattern
    def agent():
        log = cell([], name="log")
        messages = cell([], name="messages")
        chat = llm_dialog(messages)
        return {"log": log, "messages": messages, "send": chat.add_message,
                "cancel": chat.cancel_generation, "pending": chat.pending,
                "step": slow(log=log)}

    model = ScriptedModel([])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent)
        where = f"/{inst.result.id}/step"
        model.add(Reply(tool_calls=[call("invoke", {"path": where, "args": {"n": "a"}}),
                                    call("invoke", {"path": where, "args": {"n": "b"}})]),
                  "never")
        real_send = rt.send

        async def held_send(stream: Any, event: Any) -> None:
            if stream.name == "slow":  # the tool call's event: hold it in flight
                entered.set()
                await release.wait()
            await real_send(stream, event)

        rt.send = held_send  # type: ignore[method-assign]
        await inst.send("send", "go")
        with anyio.fail_after(10):
            await entered.wait()
        await inst.send("cancel", {})
        release.set()
        await rt.settled()
        assert ran == []  # neither tool ran: the first was cancelled, the second never started
        history = [Message.model_validate(m) for m in inst.result.key("messages").get()]
        calls = [b.id for b in history[1].tool_uses()]
        answered = [b for m in history[2:] for b in m.blocks if b.kind == "tool_result"]
        assert sorted(r.tool_use_id for r in answered) == sorted(calls)
        assert all(r.is_error and "cancelled" in r.content for r in answered)
        assert inst.result.key("pending").get() is False
        # the next turn's request is valid for both providers' adapters
        assert_valid_for_both_providers([*history, Message.text("user", "next")])


async def test_a_step_of_handler_tools_is_one_commit_seen_whole_by_observers():
    """The assistant's calls, what the handlers wrote and their results land together:
    an observer of the messages never sees a call without its result, and the caller's
    list changes in the same commit."""
    seen: list[tuple[int, int, bool]] = []

    @pattern
    def agent():
        items = cell([], name="items")
        messages = cell([], name="messages")
        chat = llm_dialog(messages, tools={"addItem": add_item(items=items)},
                          builtin_tools=False)
        return {"items": items, "messages": messages, "send": chat.add_message,
                "pending": chat.pending}

    model = ScriptedModel([Reply(tool_calls=[call("addItem", {"title": "a"}),
                                             call("addItem", {"title": "b"})]),
                           Reply(tool_calls=[call("addItem", {"title": "c"})]), "done"])
    # the turn's clock stands still: on a loaded machine a turn past PARTIAL_INTERVAL would
    # flush its streamed text in a commit of its own (the partial text), which this does
    # not count
    async with Runtime(model=model, clock=lambda: 1000.0) as rt:
        inst = rt.run(agent)
        history, items = inst.result.key("messages"), inst.result.key("items")
        commits = 0

        def on_commit(records: Any) -> None:
            nonlocal commits
            commits += 1
            h = [Message.model_validate(m) for m in history.get()]
            calls = {b.id for m in h for b in m.tool_uses()}
            answered = {b.tool_use_id for m in h for b in m.blocks if b.kind == "tool_result"}
            seen.append((len(h), len(items.get()), calls == answered))

        stop = rt.on_commit(on_commit)
        await inst.send("send", "go")
        await rt.settled()
        stop()
        assert items.get() == ["a", "b", "c"]
        assert all(valid for _, _, valid in seen), seen  # never a call without its result
        lengths = [(n, k) for n, k, _ in seen]
        # user message (acceptance), then each step whole: 3 messages + 2 items, 5 + 3,
        # then the final reply ending the turn
        assert (3, 2) in lengths and (5, 3) in lengths and (6, 3) in lengths
        assert (2, 0) not in lengths and (2, 2) not in lengths  # no half step ever
        assert commits == 4, seen  # accept, step 1, step 2, final reply + end


@pytest.mark.parametrize("script, expect", [
    ([""], "empty reply"),
    ([RuntimeError("boom")], "boom"),
    ([Reply(tool_calls=[call("addItem", {"title": "x"})])] * 3, "max_steps"),
])
async def test_every_failure_ends_the_turn_with_an_error_message_never_pending(script, expect):
    @pattern
    def agent():
        items = cell([], name="items")
        messages = cell([], name="messages")
        chat = llm_dialog(messages, tools={"addItem": add_item(items=items)}, max_steps=2)
        return {"messages": messages, "send": chat.add_message, "pending": chat.pending,
                "error": chat.error}

    async with Runtime(model=ScriptedModel(script)) as rt:
        inst = rt.run(agent)
        await inst.send("send", "go")
        await rt.settled()
        assert inst.result.key("pending").get() is False
        last = inst.result.key("messages").get()[-1]
        assert last["role"] == "assistant"
        assert last["blocks"][0]["text"].startswith("I encountered an error generating a response")
        assert expect in (inst.result.key("error").get() or "")


async def test_bad_tool_calls_become_error_results_and_the_turn_goes_on():
    model = ScriptedModel([
        Reply(tool_calls=[call("nope", {}), call("addItem", {"title": 5})]),
        Reply(tool_calls=[call("addItem", {"title": {"@link": "/victim"}})]),
        "Sorry.",
    ])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        await inst.send("send", "go")
        await rt.settled()
        history = inst.result.key("messages").get()
        results = [b for m in history for b in m["blocks"] if b["kind"] == "tool_result"]
        assert len(results) == 3 and all(r["is_error"] for r in results)
        assert inst.result.key("items").get() == []
        # the link the model wrote is kept as text in the history, never as a live link
        assert history[3]["blocks"][0]["input"]["title"] == '{"@link": "/victim"}'
        assert history[-1]["blocks"][0]["text"] == "Sorry."


async def test_present_result_stores_its_input_and_reserved_names_raise():
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "required": ["name"]}

    @pattern
    def extract():
        messages = cell([], name="messages")
        chat = llm_dialog(messages, builtin_tools=False, result_schema=schema)
        return {"send": chat.add_message, "result": chat.result, "messages": messages}

    model = ScriptedModel([Reply(tool_calls=[call("presentResult", {"name": "Ada"})]), "Done."])
    async with Runtime(model=model) as rt:
        inst = rt.run(extract)
        await inst.send("send", "Ada Lovelace wrote the first program.")
        await rt.settled()
        assert inst.result.key("result").get() == {"name": "Ada"}
        assert [t.name for t in model.requests[0].tools] == ["presentResult"]
        assert "# Cells" not in model.requests[0].system  # no guide with built-ins off

    @pattern
    def clash():
        messages = cell([], name="m")
        chat = llm_dialog(messages, tools={"read": add_item(items=cell([], name="i"))})
        return {"send": chat.add_message}

    @pattern
    def clash_always():
        messages = cell([], name="m")
        chat = llm_dialog(messages, builtin_tools=False,
                          tools={"presentResult": add_item(items=cell([], name="i"))})
        return {"send": chat.add_message}

    async with Runtime(model=model) as rt:
        with pytest.raises(PatternError, match="builtin_tools=False"):
            rt.run(clash)
        with pytest.raises(PatternError, match="reserved"):
            rt.run(clash_always)


async def test_sessions_own_independent_turns():
    model = Gate(["for s1", "for s2"])
    async with Runtime(model=model) as rt:
        a = rt.run(todo_agent, user="u", session="s1")
        b = rt.run(todo_agent, user="u", session="s2")
        await a.send("send", "one")
        with anyio.fail_after(10):
            await model.started.wait()
        await b.send("send", "two")  # not dropped: another session's dialog
        await a.send("cancel", None)
        assert a.result.key("pending").get() is False
        assert b.result.key("pending").get() is True
        model.opened.set()
        await rt.settled()
        assert _roles(b) == ["user", "assistant"] and _roles(a) == ["user"]


async def test_no_model_anywhere_is_a_clear_error_when_a_turn_starts():
    async with Runtime() as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        await inst.send("send", "hi")
        await rt.settled()
        assert "Runtime(model=...)" in inst.result.key("error").get()
        assert inst.result.key("pending").get() is False


async def test_add_message_refuses_what_is_not_a_user_message():
    async with Runtime(model=ScriptedModel(["x"])) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        for bad in (5, {"role": "assistant", "blocks": []}, "   "):
            with pytest.raises(PatternError, match="add_message"):
                await inst.send("send", bad)
        await inst.send("send", Message.text("user", "fine").model_dump(mode="json"))
        await rt.settled()
        assert _roles(inst) == ["user", "assistant"]


async def test_stopping_the_instance_cancels_its_turn():
    model = Gate(["never lands"])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        await inst.send("send", "hi")
        with anyio.fail_after(10):
            await model.started.wait()
        rt.stop(inst)
        assert inst.result.key("pending").get() is False  # not left pending for a rerun
        model.opened.set()
        await rt.settled()
        assert _roles(inst) == ["user"]
        again = rt.run(todo_agent, user="u", session="s")
        model.inner = ScriptedModel(["after the restart"])
        await again.send("send", "hello again")
        await rt.settled()
        assert _roles(again) == ["user", "user", "assistant"]


async def test_usage_is_summed_over_the_model_calls():
    from runtime.llm import Usage

    model = ScriptedModel([
        Reply(tool_calls=[call("addItem", {"title": "a"})], usage=Usage(input_tokens=10,
                                                                         output_tokens=2)),
        Reply(text="ok", usage=Usage(input_tokens=15, output_tokens=3, cache_read_tokens=9)),
    ])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        await inst.send("send", "go")
        await rt.settled()
        assert inst.result.key("usage").get() == {"input_tokens": 25, "output_tokens": 5,
                                                   "cache_read_tokens": 9,
                                                   "cache_write_tokens": 0}


async def test_management_tools_work_inside_a_turn_and_pins_reach_the_next_step():
    async with Runtime() as rt:
        inst = rt.run(todo_agent, user="alice", session="s1")
        items_path = inst.result.raw()["items"]["@link"]
        inst.result.key("items").set(["eggs"])
        model = ScriptedModel([
            Reply(tool_calls=[call("read", {"path": items_path}),
                              call("pin", {"path": items_path, "name": "todo"})]),
            "Pinned.",
        ])
        rt.model = model
        await inst.send("send", "pin my list")
        await rt.settled()
        results = [b for m in inst.result.key("messages").get() for b in m["blocks"]
                   if b["kind"] == "tool_result"]
        assert [r["is_error"] for r in results] == [False, False]
        assert '["eggs"]' in results[0]["content"]
        assert "## todo" not in model.requests[0].system
        assert "## todo" in model.requests[1].system  # the pin shows from the next step on
        bob = rt.run(todo_agent, user="bob", session="s1")
        rt.model = ScriptedModel([Reply(tool_calls=[call("read", {
            "path": {"@link": items_path, "scope": inst.result.key("items").scope}})]), "no"])
        await bob.send("send", "read alice's list")
        await rt.settled()
        [refused] = [b for m in bob.result.key("messages").get() for b in m["blocks"]
                     if b["kind"] == "tool_result"]
        assert refused["is_error"] and "eggs" not in refused["content"]


async def test_the_request_prefix_is_byte_identical_across_steps_and_turns():
    import json as _json

    model = ScriptedModel([Reply(tool_calls=[call("addItem", {"title": "a"})]), "ok", "again"])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="u", session="s")
        await inst.send("send", "go")
        await rt.settled()
        first, second = model.requests  # two steps of one turn; the tool changed `items`
        assert first.tools == second.tools and first.cache == second.cache
        assert first.cache.prefix and first.cache.key
        await inst.send("send", "more")  # a new turn, context unchanged since the last step
        await rt.settled()
        third = model.requests[2]

        def prefix(r: Request) -> str:
            return _json.dumps([r.system, [t.model_dump(mode="json") for t in r.tools]])

        assert prefix(third) == prefix(second)
        assert prefix(first) != prefix(second)  # the context value changed in between
        assert third.cache.key == first.cache.key


async def test_a_handler_tool_answers_with_what_it_writes_to_its_result_cell():
    from runtime import tool_result

    @handler
    def add_counted(event: AddItem, items):
        items.push(event.title)
        tool_result().set({"added": event.title, "count": len(items.get())})

    @pattern
    def agent():
        items = cell(["x"], name="items")
        messages = cell([], name="messages")
        chat = llm_dialog(messages, tools={"addItem": add_counted(items=items)},
                          builtin_tools=False)
        return {"messages": messages, "send": chat.add_message, "add": add_counted(items=items)}

    model = ScriptedModel([Reply(tool_calls=[call("addItem", {"title": "milk"})]), "ok"])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent)
        written: list[tuple[str, str]] = []
        rt.on_commit(lambda changes: written.extend((c.id, c.path) for c in changes))
        await inst.send("send", "add milk")
        await rt.settled()
        [result] = [b for m in inst.result.key("messages").get() for b in m["blocks"]
                    if b["kind"] == "tool_result"]
        assert not result["is_error"] and '"count":2' in result["content"].replace(" ", "")
        # the answer reached the model within the step's own commit: the place holding
        # answers of tools that commit on their own was never written
        [answers] = [k for k in rt.store.keys("default")
                     if rt.docs.doc(k).label.endswith(".turn")]
        assert any(i == answers.id for i, _ in written)  # the turn's record was written
        assert not [p for i, p in written if i == answers.id and p.startswith("/tool_output")]
        with pytest.raises(PatternError, match="only known while a dialog runs"):
            await inst.send("add", {"title": "direct"})  # not a tool call: no result cell


async def test_the_pattern_pins_cells_and_unpins_them_all():
    @pattern
    def agent():
        notes = cell("call me Ada", name="notes")
        messages = cell([], name="messages")
        chat = llm_dialog(messages)
        return {"notes": notes, "send": chat.add_message, "pin": chat.pin_cell,
                "unpin_all": chat.unpin_all_cells, "pinned": chat.pinned_cells}

    model = ScriptedModel(["one", "two"])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent)
        notes_link = inst.result.key("notes").link()
        await inst.send("pin", {"path": notes_link, "name": "notes"})
        await inst.send("pin", {"path": notes_link, "name": "notes"})  # twice: one pin
        assert len(inst.result.key("pinned").get()) == 1
        await inst.send("send", "hi")
        await rt.settled()
        assert "## notes" in model.requests[0].system and "call me Ada" in model.requests[0].system
        await inst.send("unpin_all", None)
        await inst.send("send", "again")
        await rt.settled()
        assert "call me Ada" not in model.requests[1].system
        with pytest.raises(PatternError, match="pin_cell takes"):
            await inst.send("pin", {"path": 5})


async def test_an_explicit_input_schema_wins_over_the_event_schema():
    explicit = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 5}},
                "required": ["title"]}

    @pattern
    def agent():
        items = cell([], name="items")
        messages = cell([], name="messages")
        chat = llm_dialog(messages, builtin_tools=False, tools={
            "addItem": {"handler": add_item(items=items), "input_schema": explicit}})
        return {"send": chat.add_message, "items": items, "messages": messages}

    model = ScriptedModel([Reply(tool_calls=[call("addItem", {"title": "too long"})]), "ok"])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent)
        await inst.send("send", "go")
        await rt.settled()
        assert model.requests[0].tools[0].input_schema == explicit
        [result] = [b for m in inst.result.key("messages").get() for b in m["blocks"]
                    if b["kind"] == "tool_result"]
        assert result["is_error"] and inst.result.key("items").get() == []


async def test_a_pattern_tool_runs_fresh_and_cannot_write_the_callers_cells():
    @pattern(name="shout")
    def shout(text: str):
        loud = lift(lambda t: t.upper())(text)
        return {"loud": loud}

    @pattern
    def agent():
        items = cell(["keep"], name="items")
        messages = cell([], name="messages")
        chat = llm_dialog(messages, builtin_tools=False,
                          tools={"shout": {"description": "Shout", "pattern": shout}})
        return {"send": chat.add_message, "items": items, "messages": messages}

    async with Runtime() as rt:
        inst = rt.run(agent)
        items_link = inst.result.raw()["items"]
        rt.model = ScriptedModel([
            Reply(tool_calls=[call("shout", {"text": "hi"}),
                              call("shout", {"text": items_link})]),
            "done",
        ])
        await inst.send("send", "shout")
        await rt.settled()
        first, second = [b for m in inst.result.key("messages").get() for b in m["blocks"]
                         if b["kind"] == "tool_result"]
        assert not first["is_error"] and '"loud":"HI"' in first["content"].replace(" ", "")
        assert "@resultLocation" in first["content"]
        assert second["is_error"]  # a link to the caller's cell is refused as an argument
        assert inst.result.key("items").get() == ["keep"]
        assert rt.model.requests[0].tools[0].input_schema["required"] == ["text"]


# -------------------------------------------------- links in the model's input: live cells


@handler(event={"type": "object", "required": ["target", "title"],
                "properties": {"target": {"asCell": True}, "title": {"type": "string"}}})
def add_to(event, log):
    target = event["target"]  # a live Cell: the schema asks for one
    target.push(event["title"])  # writes the list the model pointed at
    log.push(repr(type(target).__name__))


@pattern(name="linking-agent")
def linking_agent():
    groceries = cell([], scope="user", name="groceries")
    chores = cell([], scope="user", name="chores")
    log = cell([], name="log")
    messages = cell([], scope="session", name="messages")
    chat = llm_dialog(messages, tools={"addTo": {"description": "Add to a list",
                                                 "handler": add_to(log=log)}})
    return {"groceries": groceries, "chores": chores, "log": log, "messages": messages,
            "send": chat.add_message, "pending": chat.pending}


async def test_links_in_the_model_input_become_live_cells_and_stay_in_scope():
    model = ScriptedModel([])
    async with Runtime(model=model) as rt:
        bob = rt.run(linking_agent, user="bob", session="b")
        inst = rt.run(linking_agent, user="alice", session="a")
        groceries = inst.result.key("groceries").resolve()
        chores = inst.result.key("chores").resolve()
        bobs = bob.result.key("groceries").link()  # another user's cell, scope explicit
        model.add(Reply(tool_calls=[
            call("addTo", {"target": {"@link": f"/{groceries.id}"}, "title": "milk"}),
            # a JSON string holding a link, and a bare path: both name a cell
            call("addTo", {"target": f'{{"@link": "/{chores.id}"}}', "title": "sweep"}),
            call("addTo", {"target": f"/{groceries.id}", "title": "eggs"}),
            call("addTo", {"target": bobs, "title": "stolen"}),
        ]), "done")
        await inst.send("send", "go")
        await rt.settled()
        assert inst.result.key("groceries").get() == ["milk", "eggs"]
        assert inst.result.key("chores").get() == ["sweep"]
        assert inst.result.key("log").get() == ["'Cell'"] * 3
        assert bob.result.key("groceries").get() == []  # never reached
        results = [b for m in inst.result.key("messages").get() for b in m["blocks"]
                   if b["kind"] == "tool_result"]
        assert [r["is_error"] for r in results] == [False, False, False, True]
        assert "cannot be reached" in results[3]["content"]


# ------------------------------------------- invoke: running a pattern, not the dialog itself


@pattern(name="greeting", argument_schema={"type": "object", "required": ["who"],
                                           "properties": {"who": {"type": "string"}}})
def greeting(who):
    return {"text": lift(lambda w: f"hello {w}")(who)}


@pattern(name="invoking-agent")
def invoking_agent():
    messages = cell([], scope="session", name="messages")
    chat = llm_dialog(messages)
    return {"messages": messages, "send": chat.add_message, "cancel": chat.cancel_generation,
            "pending": chat.pending, "greet": greeting}


def _results(inst: Any) -> list[dict[str, Any]]:
    return [b for m in inst.result.key("messages").get() for b in m["blocks"]
            if b["kind"] == "tool_result"]


async def test_invoke_runs_a_pattern_a_result_names_and_returns_where_its_result_lives():
    model = ScriptedModel([])
    async with Runtime(model=model) as rt:
        inst = rt.run(invoking_agent, user="alice", session="a")
        where = f"/{inst.result.id}/greet"
        model.add(Reply(tool_calls=[call("read", {"path": where}),
                                    call("invoke", {"path": where, "args": {"who": "ada"}}),
                                    call("invoke", {"path": where, "args": {"who": 7}})]),
                  "done")
        await inst.send("send", "greet ada")
        await rt.settled()
        read, ran, bad = _results(inst)
        assert not read["is_error"] and '"$pattern": "greeting"' in read["content"]
        assert not ran["is_error"], ran
        out = json.loads(ran["content"])
        assert out["result"] == {"text": "hello ada"}
        # the location is a real result: the model can read it again
        loc = out["@resultLocation"]
        model.add(Reply(tool_calls=[call("read", {"path": loc})]), "ok")
        await inst.send("send", "read it")
        await rt.settled()
        assert json.loads(_results(inst)[-1]["content"]) == {"text": "hello ada"}
        assert bad["is_error"] and "who" in bad["content"]  # the argument schema speaks


async def test_the_model_cannot_send_to_its_own_dialog_streams():
    model = ScriptedModel([])
    async with Runtime(model=model) as rt:
        inst = rt.run(invoking_agent, user="alice", session="a")
        calls = [call("invoke", {"path": f"/{inst.result.id}/{name}", "args": "hi"})
                 for name in ("send", "cancel")]
        model.add(Reply(tool_calls=calls), "done")
        await inst.send("send", "go")
        await rt.settled()
        results = _results(inst)
        assert [r["is_error"] for r in results] == [True, True]
        assert all("own inputs" in r["content"] for r in results)
        texts = [m for m in inst.result.key("messages").get() if m["role"] == "user"
                 and m["blocks"][0]["kind"] == "text"]
        assert len(texts) == 1  # no message sent by the model to itself
        assert inst.result.key("pending").get() is False


async def test_system_may_be_a_cell_read_at_every_step():
    @pattern
    def agent():
        persona = cell("You are terse.", name="persona")
        messages = cell([], name="messages")
        chat = llm_dialog(messages, system=persona, builtin_tools=False)
        return {"persona": persona, "messages": messages, "send": chat.add_message}

    model = ScriptedModel(["one", "two"])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent)
        await inst.send("send", "hi")
        await rt.settled()
        inst.result.key("persona").set("You are verbose.")
        await inst.send("send", "again")
        await rt.settled()
        assert [r.system for r in model.requests] == ["You are terse.", "You are verbose."]

    with pytest.raises(PatternError, match="string or a Cell"):
        async with Runtime(model=model) as rt:

            @pattern
            def bad():
                return {"chat": llm_dialog(cell([], name="m"), system=42).pending}

            rt.run(bad)


@handler
def retone(event, persona):
    persona.set(event["to"])


async def test_a_system_prompt_edited_mid_turn_goes_with_the_next_step():
    """A turn's later requests are its first one with the history and the system prompt
    changed (not validated again): an edit by a tool applies from the next model call, and
    every request is one the constructor would make."""
    @pattern
    def agent():
        persona = cell("You are terse.", name="persona")
        messages = cell([], name="messages")
        chat = llm_dialog(messages, system=persona, builtin_tools=False, tools={
            "retone": {"description": "Change the tone.", "handler": retone(persona=persona)}})
        return {"persona": persona, "messages": messages, "send": chat.add_message}

    model = ScriptedModel([Reply(tool_calls=[call("retone", {"to": "You are verbose."})]),
                           Reply(tool_calls=[call("retone", {"to": "Sé bref ✓"})]),
                           "done"])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent)
        await inst.send("send", "hi")
        await rt.settled()
        assert inst.result.key("persona").get() == "Sé bref ✓"
    systems = [r.system for r in model.requests]
    assert systems == ["You are terse.", "You are verbose.", "Sé bref ✓"]
    assert [len(r.messages) for r in model.requests] == [1, 3, 5]
    for r in model.requests:
        assert Request.model_validate(r.model_dump()) == r


@handler
def note(event):
    tool_result().set("noted")


async def test_a_link_the_model_nests_in_a_link_shaped_object_is_stored_as_text_too():
    """``{"@link": {"@link": "/q"}}`` is plain data until its inner link becomes text;
    then it is link-shaped itself, so it becomes text as well: the history holds no link
    the model made up, and the next request carries the call as stored, not a None a
    link that cannot be followed would read as."""
    @pattern
    def noter():
        messages = cell([], name="messages")
        chat = llm_dialog(messages, builtin_tools=False, tools={
            "note": {"description": "Note anything.", "handler": note()}})
        return {"messages": messages, "send": chat.add_message, "error": chat.error}

    nested = {"x": {"@link": {"@link": "/q"}}, "y": [{"@link": {"@link": "/r", "scope": ""}}]}
    model = ScriptedModel([Reply(tool_calls=[call("note", nested)]), "done", "again"])
    async with Runtime(model=model) as rt:
        inst = rt.run(noter)
        await inst.send("send", "go")
        await rt.settled()
        assert inst.result.key("error").get() is None
        stored = inst.result.key("messages").raw()
        [use] = [b for b in stored[1]["blocks"] if b["kind"] == "tool_use"]
        assert use["input"] == {
            "x": json.dumps({"@link": json.dumps({"@link": "/q"})}, sort_keys=True),
            "y": [json.dumps({"@link": json.dumps({"@link": "/r", "scope": ""},
                                                 sort_keys=True)}, sort_keys=True)]}
        assert inst.result.key("messages").get() == stored  # nothing reads as a link
        await inst.send("send", "more")
        await rt.settled()
        [again] = [b for m in model.requests[-1].messages for b in m.blocks
                   if getattr(b, "kind", "") == "tool_use"]
        assert again.input == use["input"]


async def test_a_link_the_model_writes_is_stored_as_text_never_as_a_live_link():
    model = ScriptedModel([])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="alice", session="s1")
        items = inst.result.key("items").resolve()
        forged = {"@link": f"/{items.id}"}
        model.add(Reply(text="see {\"@link\": \"/x\"}",
                        tool_calls=[call("addItem", {"title": forged})]), "done")
        await inst.send("send", "go")
        await rt.settled()
        stored = inst.result.key("messages").raw()  # as the document holds it
        [use] = [b for b in stored[1]["blocks"] if b["kind"] == "tool_use"]
        assert use["input"]["title"] == json.dumps(forged, sort_keys=True)  # text, inert
        assert "@link" in stored[1]["blocks"][0]["text"]  # a text block is left as written
        [result] = [b for b in stored[2]["blocks"] if b["kind"] == "tool_result"]
        assert result["is_error"]  # the call itself was refused: title must be a string
        assert inst.result.key("items").get() == []
