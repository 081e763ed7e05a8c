"""The bundled dialog patterns (chatbot, todo agent, extraction) through the real Runtime,
against ScriptedModel: what each module's docstring promises."""

from __future__ import annotations

import importlib
import itertools
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from patterns.chatbot import DEFAULT_SYSTEM, chatbot
from patterns.extract import SYSTEM as EXTRACT_SYSTEM
from patterns.extract import extract
from patterns.todo_agent import todo_agent
from runtime import Runtime
from runtime.llm import Reply, Request, ScriptedModel, StreamEvent, ToolError, Usage, call
from runtime.llm.events import Stop

pytestmark = pytest.mark.anyio


class Held:
    """A scripted model whose first reply streams its text, then waits for ``opened``
    before it ends (a reply held open mid-stream); later replies run straight through."""

    provider = "scripted"
    name = "held"

    def __init__(self, script: list[Any]) -> None:
        self.inner = ScriptedModel(script)
        self.held = anyio.Event()
        self.opened = anyio.Event()

    @property
    def requests(self) -> list[Request]:
        return self.inner.requests

    async def generate(self, request: Request) -> Any:  # pragma: no cover - streams only
        raise NotImplementedError

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        async for event in self.inner.stream(request):
            if isinstance(event, Stop) and not self.opened.is_set():
                self.held.set()
                await self.opened.wait()
            yield event


def history(inst: Any) -> list[tuple[str, str]]:
    """(role, text) per message; a message without text shows its block kinds."""
    out = []
    for m in inst.result.key("messages").get():
        texts = [b["text"] for b in m["blocks"] if b["kind"] == "text"]
        out.append((m["role"], " ".join(texts) or "+".join(b["kind"] for b in m["blocks"])))
    return out


def shown(system: str, key: str) -> Any:
    """The value of context cell ``key`` as the system prompt shows it under
    ``# Available Cells`` (its ``## key`` section's ``value:`` line, as JSON)."""
    cells = system.split("# Available Cells\n", 1)[1]
    section = cells.split(f"## {key}\n", 1)[1].split("\n## ", 1)[0]
    line = next(x for x in section.splitlines() if x.startswith("value: "))
    return json.loads(line.removeprefix("value: "))


def tool_results(inst: Any) -> list[dict[str, Any]]:
    return [b for m in inst.result.key("messages").get() for b in m["blocks"]
            if b["kind"] == "tool_result"]


# ---------------------------------------------------------------------------- chatbot


async def test_chatbot_a_turn_appends_the_reply_and_the_next_request_carries_the_history():
    model = ScriptedModel([
        Reply(text="Hello, Ada.", usage=Usage(input_tokens=7, output_tokens=3)),
        Reply(text="Still here.", usage=Usage(input_tokens=12, output_tokens=2)),
    ])
    async with Runtime(model=model) as rt:
        inst = rt.run(chatbot, user="ada", session="s1")
        await inst.send("send", "hi")
        await rt.settled()
        assert history(inst) == [("user", "hi"), ("assistant", "Hello, Ada.")]
        assert inst.result.key("pending").get() is False
        assert inst.result.key("partial").get() is None
        assert inst.result.key("error").get() is None
        await inst.send("send", "still there?")
        await rt.settled()
        first, second = model.requests
        assert [m.text_content() for m in second.messages] == ["hi", "Hello, Ada.",
                                                               "still there?"]
        assert first.tools == () and second.tools == ()  # a plain chat: no tools at all
        assert history(inst)[-1] == ("assistant", "Still here.")
        assert inst.result.key("usage").get() == {"input_tokens": 19, "output_tokens": 5,
                                                   "cache_read_tokens": 0,
                                                   "cache_write_tokens": 0}
        assert inst.result.key("dropped").get() == 0
    model.assert_complete()


async def test_chatbot_shows_the_users_notes_under_available_cells_at_every_call():
    model = ScriptedModel(["Noted.", "Kilometres, then.", "Hi again."])
    async with Runtime(model=model) as rt:
        inst = rt.run(chatbot, {"system": "You are terse."}, user="ada", session="s1")
        await inst.send("set_notes", "Prefers metric units.")
        await inst.send("send", "how far is it?")
        await rt.settled()
        system = model.requests[0].system
        assert system.startswith("You are terse.\n\n# Available Cells\n## notes\n")
        assert 'schema: {"type": "string"}' in system
        assert shown(system, "notes") == "Prefers metric units."
        inst.result.key("notes").set("Prefers metric units. Lives in Lyon.")  # a UI's edit
        await inst.send("send", "and from Lyon?")
        await rt.settled()
        assert shown(model.requests[1].system, "notes") == "Prefers metric units. Lives in Lyon."
        # the notes are the user's: another session of hers sees them, with its own history
        other = rt.run(chatbot, {"system": "You are terse."}, user="ada", session="s2")
        assert other.result.key("notes").get() == "Prefers metric units. Lives in Lyon."
        await other.send("send", "hello")
        await rt.settled()
        assert shown(model.requests[2].system, "notes") == "Prefers metric units. Lives in Lyon."
        assert [m.text_content() for m in model.requests[2].messages] == ["hello"]
        # another user has notes of their own (empty), and the default prompt
        bob = rt.run(chatbot, user="bob", session="s1")
        assert bob.result.key("notes").get() == ""
        assert bob.result.key("messages").get() == []


async def test_chatbot_streams_partial_text_and_cancel_ends_the_turn_at_once():
    model = Held(["Hello there", "Fresh answer."])
    ticks = itertools.count()  # every clock read is a second later: no partial is coarsened
    async with Runtime(model=model, clock=lambda: float(next(ticks))) as rt:
        inst = rt.run(chatbot, user="ada", session="s1")
        await inst.send("send", "question")
        with anyio.fail_after(10):
            await model.held.wait()
        assert inst.result.key("pending").get() is True
        assert inst.result.key("partial").get() == "Hello there"
        await inst.send("cancel", None)
        assert inst.result.key("pending").get() is False  # at once, not when the reply ends
        assert inst.result.key("partial").get() is None
        model.opened.set()
        await rt.settled()
        assert history(inst) == [("user", "question")]  # the late reply landed nowhere
        assert inst.result.key("error").get() is None
        await inst.send("send", "again")
        await rt.settled()
        assert history(inst) == [("user", "question"), ("user", "again"),
                                 ("assistant", "Fresh answer.")]


async def test_chatbot_a_message_sent_while_a_turn_runs_is_dropped_and_counted():
    model = Held(["One answer."])
    async with Runtime(model=model) as rt:
        inst = rt.run(chatbot, user="ada", session="s1")
        await inst.send("send", "first")
        with anyio.fail_after(10):
            await model.held.wait()
        await inst.send("send", "second")
        assert inst.result.key("dropped").get() == 1
        model.opened.set()
        await rt.settled()
        assert history(inst) == [("user", "first"), ("assistant", "One answer.")]


async def test_chatbot_history_and_notes_survive_a_restart(tmp_path):
    store = f"sqlite:///{tmp_path / 'chat.db'}"
    async with Runtime(store, model=ScriptedModel(["Hello."])) as rt:
        inst = rt.run(chatbot, user="ada", session="s1")
        await inst.send("set_notes", "Likes tea.")
        await inst.send("send", "hi")
        await rt.settled()
    model = ScriptedModel(["Welcome back."])
    async with Runtime(store, model=model) as rt:
        inst = rt.run(chatbot, user="ada", session="s1")  # same pattern, same documents
        assert history(inst) == [("user", "hi"), ("assistant", "Hello.")]
        await inst.send("send", "back")
        await rt.settled()
        assert [m.text_content() for m in model.requests[0].messages] == ["hi", "Hello.", "back"]
        assert model.requests[0].system.startswith(DEFAULT_SYSTEM)
        assert shown(model.requests[0].system, "notes") == "Likes tea."


# ---------------------------------------------------------------------------- todo agent


def item(title: str, done: bool = False) -> dict[str, Any]:
    return {"title": title, "done": done}


async def test_todo_two_sessions_of_one_user_share_the_items_but_not_the_history():
    model = ScriptedModel([
        Reply(tool_calls=[call("addItem", {"title": "milk"})]), "Added milk.",
        Reply(tool_calls=[call("markDone", {"title": "milk"})]), "Done.",
    ])
    async with Runtime(model=model) as rt:
        s1 = rt.run(todo_agent, user="ada", session="s1")
        s2 = rt.run(todo_agent, user="ada", session="s2")
        await s1.send("send", "add milk")
        await rt.settled()
        assert s2.result.key("items").get() == [item("milk")]  # her list, in every session
        assert s2.result.key("messages").get() == []  # but not that conversation
        await s2.send("send", "I bought the milk")
        await rt.settled()
        assert shown(model.requests[2].system, "items") == [item("milk")]  # the shared list
        assert [m.text_content() for m in model.requests[2].messages] == ["I bought the milk"]
        assert s1.result.key("items").get() == [item("milk", True)]
        assert s1.result.key("open").get() == 0
        assert len(s1.result.key("messages").get()) == 4  # untouched by s2's turn
        assert history(s2)[0] == ("user", "I bought the milk")
        bob = rt.run(todo_agent, user="bob", session="s1")
        assert bob.result.key("items").get() == []


async def test_todo_each_tool_edits_the_list_and_the_model_sees_it_at_every_call():
    model = ScriptedModel([
        Reply(tool_calls=[call("addItem", {"title": "milk"}), call("addItem", {"title": "eggs"})]),
        Reply(tool_calls=[call("markDone", {"title": "milk"})]),
        Reply(tool_calls=[call("removeItem", {"title": "eggs"})]),
        Reply(tool_calls=[call("markDone", {"title": "MILK ", "done": False})]),
        "Your list: milk.",
    ])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="ada", session="s1")
        await inst.send("send", "milk and eggs; milk is bought; drop the eggs; no, milk isn't")
        await rt.settled()
        assert inst.result.key("items").get() == [item("milk")]
        assert inst.result.key("open").get() == 1
        assert [shown(r.system, "items") for r in model.requests] == [
            [],
            [item("milk"), item("eggs")],
            [item("milk", True), item("eggs")],
            [item("milk", True)],
            [item("milk")],
        ]
        assert [r["is_error"] for r in tool_results(inst)] == [False] * 5
        tools = {t.name: t.input_schema for t in model.requests[0].tools}
        assert list(tools) == ["addItem", "removeItem", "markDone"]  # and nothing else
        assert tools["addItem"]["required"] == ["title"]
        assert tools["markDone"]["properties"]["done"]["type"] == "boolean"
        assert inst.result.key("pending").get() is False
        assert inst.result.key("error").get() is None


async def test_todo_refused_and_malformed_tool_calls_are_error_results_and_the_turn_completes():
    model = ScriptedModel([
        Reply(tool_calls=[call("removeItem", {"title": "bread"}),
                          call("addItem", {"title": "milk"})]),
        Reply(tool_calls=[call("addItem", {"title": "Milk"}),
                          call("markDone", {"title": 5}),
                          call("removeItem", {"title": "bread"})]),
        "Sorry: there is no bread on your list.",
    ])
    async with Runtime(model=model) as rt:
        inst = rt.run(todo_agent, user="ada", session="s1")
        await inst.send("send", "remove bread, add milk")
        await rt.settled()
        results = tool_results(inst)
        assert [r["is_error"] for r in results] == [True, False, True, True, True]
        assert results[0]["content"] == (
            "No item titled 'bread' is on the list. Its items are: none: the list is empty.")
        assert results[2]["content"] == "'Milk' is already on the list: nothing added."
        assert results[3]["content"].startswith("Invalid arguments for tool 'markDone'")
        assert results[4]["content"] == (
            "No item titled 'bread' is on the list. Its items are: 'milk'.")
        assert inst.result.key("items").get() == [item("milk")]
        assert history(inst)[-1] == ("assistant", "Sorry: there is no bread on your list.")
        assert inst.result.key("pending").get() is False
        assert inst.result.key("error").get() is None
        assert rt.errors == []  # a refused call is the model's answer, not a fault


async def test_todo_the_ui_edits_the_list_through_the_streams_the_model_calls():
    async with Runtime() as rt:
        inst = rt.run(todo_agent, user="ada", session="s1")
        await inst.send("addItem", {"title": "eggs"})
        await inst.send("markDone", {"title": "eggs"})
        assert inst.result.key("items").get() == [item("eggs", True)]
        with pytest.raises(ToolError, match="No item titled 'bread'"):
            await inst.send("removeItem", {"title": "bread"})
        await inst.send("removeItem", {"title": "eggs"})
        assert inst.result.key("items").get() == []


# ---------------------------------------------------------------------------- extract


async def test_extract_stores_the_result_and_advertises_only_present_result():
    model = ScriptedModel([
        Reply(tool_calls=[call("presentResult", {"name": "Ada Lovelace", "phone": 5550100})]),
        Reply(tool_calls=[call("presentResult", {"name": "Ada Lovelace",
                                                 "email": "ada@example.org",
                                                 "phone": "555-0100"})]),
        "Done.",
    ])
    async with Runtime(model=model) as rt:
        inst = rt.run(extract, session="s1")
        assert inst.result.key("result").get() is None
        assert inst.result.key("contact").get() is None
        await inst.send("send", "Ada Lovelace, ada@example.org, 555-0100")
        await rt.settled()
        assert inst.result.key("result").get() == {
            "name": "Ada Lovelace", "email": "ada@example.org", "phone": "555-0100"}
        assert inst.result.key("contact").get() == inst.result.key("result").get()
        first, bad = model.requests[0], tool_results(inst)[0]
        assert [t.name for t in first.tools] == ["presentResult"]
        schema = first.tools[0].input_schema
        assert sorted(schema["properties"]) == ["email", "name", "phone"]
        assert schema["required"] == ["name"]
        assert first.system == EXTRACT_SYSTEM
        # the first call did not fit the schema: an error result, and no result stored
        assert bad["is_error"] and "Invalid arguments for tool 'presentResult'" in bad["content"]
        assert [r["is_error"] for r in tool_results(inst)] == [True, False]
        assert inst.result.key("pending").get() is False
        assert inst.result.key("error").get() is None
        assert history(inst)[-1] == ("assistant", "Done.")


async def test_extract_fills_absent_fields_in_contact_and_sessions_extract_apart():
    model = ScriptedModel([Reply(tool_calls=[call("presentResult", {"name": "Grace"})]), "Done."])
    async with Runtime(model=model) as rt:
        a = rt.run(extract, session="a")
        b = rt.run(extract, session="b")
        await a.send("send", "Grace Hopper called.")
        await rt.settled()
        assert a.result.key("result").get() == {"name": "Grace"}  # as the model sent it
        assert a.result.key("contact").get() == {"name": "Grace", "email": None, "phone": None}
        assert b.result.key("result").get() is None


# ---------------------------------------------------------------------------- the docs


@pytest.mark.parametrize("module", ["patterns.chatbot", "patterns.todo_agent",
                                    "patterns.extract"])
def test_each_module_docstring_example_runs(module, capsys):
    doc = importlib.import_module(module).__doc__
    assert doc and "What it shows" in doc
    block = re.search(r"::\n\n((?:    .*\n|\n)+)", doc)
    assert block is not None, f"{module} has no example to run"
    code = "\n".join(line[4:] for line in block.group(1).splitlines())
    exec(compile(code, f"<{module} docstring>", "exec"), {"__name__": "__doc_example__"})
    assert capsys.readouterr().out.strip()
