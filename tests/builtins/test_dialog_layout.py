"""The dialog's stored layout: the turn protocol's two records (the turn's own: ``pending``,
the turn, ``partial``'s chunks, ``stop_reason``, the handler answers; its outcome: ``error``,
``usage``, ``dropped``, the pins); ``result``, written by presentResult's step (a
commit not run again on a conflict), stays apart, so a user's write from another process
never makes a turn's step conflict. A dialog stored when each cell was a document of its
own is read into the records the first time it runs again."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from runtime import Runtime, cell, llm_dialog, pattern
from runtime.cells import BuiltinNode
from runtime.cells.ids import derive
from runtime.errors import ConflictError
from runtime.llm import Reply, ScriptedModel, Usage, call
from runtime.storage import DocKey, SQLiteStore, Write

from .support import Gate

pytestmark = pytest.mark.anyio

NODES: list[BuiltinNode] = []


@pattern(name="layout-agent")
def agent():
    messages = cell([], name="messages", scope="session")
    chat = llm_dialog(messages, builtin_tools=False)
    return {"messages": messages, "send": chat.add_message, "pending": chat.pending,
            "error": chat.error, "usage": chat.usage, "stop_reason": chat.stop_reason,
            "result": chat.result, "partial": chat.partial, "dropped": chat.dropped,
            "pins": chat.pinned_cells}


@pytest.fixture
def spy(monkeypatch):
    """The dialog nodes built (to name the documents an earlier layout stored)."""
    record = BuiltinNode.record

    def recording(self, *args, **kwargs):
        NODES.append(self)
        return record(self, *args, **kwargs)

    NODES.clear()
    monkeypatch.setattr(BuiltinNode, "record", recording)
    return NODES


async def test_the_turns_write_two_records_and_the_rest_their_own_documents(spy):
    async with Runtime(model=ScriptedModel(["hello"])) as rt:
        inst = rt.run(agent, session="s")

        def where(name: str) -> DocKey:
            return inst.result.key(name).resolve().doc_key

        turn, outcome = where("pending"), where("error")
        assert turn != outcome
        assert where("stop_reason") == turn
        assert where("usage") == where("dropped") == where("pins") == outcome
        assert where("result") not in {turn, outcome}
        commits: list[set[str]] = []
        rt.on_commit(lambda changes: commits.append({c.id for c in changes}))
        await inst.send("send", "hi")
        await rt.settled()
        # the turn's start and its end: each one commit of the turn's record; the outcome
        # is read by both (what they would clear is clear already) and written by neither
        # (no error, no usage reported)
        assert [(turn.id in c, outcome.id in c) for c in commits] == [(True, False),
                                                                      (True, False)]
        assert inst.result.key("stop_reason").get() == "end_turn"


RESULT = {"type": "object", "properties": {"answer": {}}, "required": ["answer"]}


@pattern(name="layout-presenter")
def presenter():
    messages = cell([], name="messages")
    chat = llm_dialog(messages, result_schema=RESULT, builtin_tools=False)
    return {"messages": messages, "send": chat.add_message, "result": chat.result,
            "pending": chat.pending, "error": chat.error, "usage": chat.usage,
            "cancel": chat.cancel_generation}


@pattern(name="layout-pinner")
def pinner():
    notes = cell({"text": "hello"}, name="notes")
    messages = cell([], name="messages")
    chat = llm_dialog(messages, context={"notes": notes})
    return {"messages": messages, "send": chat.add_message, "pins": chat.pinned_cells,
            "pending": chat.pending, "error": chat.error, "usage": chat.usage,
            "dropped": chat.dropped, "notes": notes}


async def test_a_pin_the_model_makes_lands_after_another_process_wrote_the_outcome(tmp_path):
    """The pins share the outcome record with usage and the dropped count: a write to it
    from another process meanwhile makes the pin tool's commit conflict, and the pin is made
    again on the fresh record (as a handler would be), not refused."""
    url = f"sqlite:///{tmp_path / 'pins.db'}"
    async with Runtime() as probe:
        path = probe.run(pinner).result.key("notes").resolve().link()["@link"]
    model = Gate([Reply(tool_calls=[call("pin", {"path": path, "name": "the notes"})]),
                  "pinned"])
    async with Runtime(store=url, model=model) as a_rt, Runtime(store=url) as b_rt:
        a, b = a_rt.run(pinner), b_rt.run(pinner)
        await a.send("send", "pin the notes")
        with anyio.fail_after(10):
            await model.started.wait()
        b.result.key("usage").refresh()
        b.result.key("usage").set({"input_tokens": 7, "output_tokens": 0,
                                   "cache_read_tokens": 0, "cache_write_tokens": 0})
        model.opened.set()
        with anyio.fail_after(10):
            await a_rt.settled()
        [result] = [blk for m in a.result.key("messages").get() for blk in m["blocks"]
                    if blk["kind"] == "tool_result"]
        assert not result["is_error"] and "Pinned" in result["content"]
        assert [p["name"] for p in a.result.key("pins").get()] == ["the notes"]
        assert a.result.key("usage").get()["input_tokens"] == 7  # B's write stands
        assert a.result.key("error").get() is None


@pytest.mark.parametrize("written", ["usage", "error"])
async def test_a_users_write_from_another_process_during_a_turn_leaves_its_step_alone(
        tmp_path, written):
    """B resets the dialog's usage (or dismisses its error) while A's turn waits for its
    model: A's step, whose commit reads the turn's record, still lands."""
    url = f"sqlite:///{tmp_path / 'two.db'}"
    model = Gate([Reply(tool_calls=[call("presentResult", {"answer": 42})]), "done"])
    value = ({"input_tokens": 7, "output_tokens": 0, "cache_read_tokens": 0,
              "cache_write_tokens": 0} if written == "usage" else "dismissed")
    async with Runtime(store=url, model=model) as a_rt, Runtime(store=url) as b_rt:
        a, b = a_rt.run(presenter), b_rt.run(presenter)
        await a.send("send", "present 42")
        with anyio.fail_after(10):
            await model.started.wait()
        b.result.key(written).refresh()
        b.result.key(written).set(value)
        model.opened.set()
        with anyio.fail_after(10):
            await a_rt.settled()
        assert a.result.key("result").get() == {"answer": 42}
        assert a.result.key("pending").get() is False
        assert a.result.key("error").get() is None  # the turn's end wrote its own outcome
        texts = [m["blocks"][-1].get("text") for m in a.result.key("messages").get()]
        assert texts[-1] == "done"


async def test_a_dialog_stored_by_the_earlier_layout_keeps_its_state_and_recovers(spy,
                                                                               tmp_path):
    # where the earlier layout kept each field: a document per name, from the node's cause
    async with Runtime() as rt:
        rt.run(agent, session="s")
    assert len({id(n) for n in spy}) == 1  # one dialog node (two records)
    node = spy[0]
    url = f"sqlite:///{tmp_path / 'old.db'}"
    spent = {"input_tokens": 10, "output_tokens": 4, "cache_read_tokens": 2,
             "cache_write_tokens": 0}
    earlier = {"pending": True, "turn": {"id": "old-turn", "holder": "a process long gone"},
               "error": None, "partial_chunks": ["Half a rep", "ly"], "usage": spent,
               "stop_reason": "max_tokens", "result": {"answer": 41}, "tool_output": {},
               "dropped": 3, "pins": []}
    store = SQLiteStore(str(tmp_path / "old.db"))
    store.commit([Write(DocKey(node.space, node.scope.key, derive(node.cause, "state", name)),
                        value, 0) for name, value in earlier.items()])
    store.close()

    model = ScriptedModel([Reply(text="Back.", usage=Usage(input_tokens=5, output_tokens=1))])
    async with Runtime(store=url, model=model) as rt:
        inst = rt.run(agent, session="s")
        got: dict[str, Any] = {name: inst.result.key(name).get() for name in (
            "pending", "usage", "stop_reason", "result", "partial", "dropped")}
        assert got == {"pending": True, "usage": spent, "stop_reason": "max_tokens",
                       "result": {"answer": 41}, "partial": "Half a reply", "dropped": 3}
        # its owner is dead (no lease): the next message recovers the turn, then runs
        await inst.send("send", "again")
        await rt.settled()
        texts = [m["blocks"][0]["text"] for m in inst.result.key("messages").get()]
        assert texts[-1] == "Back." and "interrupted" in texts[0]
        assert inst.result.key("pending").get() is False
        assert inst.result.key("partial").get() is None
        assert inst.result.key("usage").get() == {**spent, "input_tokens": 15,
                                                  "output_tokens": 5}
        assert inst.result.key("stop_reason").get() == "end_turn"


async def test_stopping_an_instance_after_another_process_cancelled_its_turn(tmp_path):
    """B cancels A's turn and A's copy is behind (``follow=False``); then A's instance stops,
    which cancels the turn it still believes pending: that commit conflicts and runs again on
    the state caught up with, which has nothing pending (it was reported as the stop's
    error before)."""
    url = f"sqlite:///{tmp_path / 'stop.db'}"
    model = Gate(["never sent"])
    async with Runtime(store=url, model=model, follow=False) as a_rt, \
            Runtime(store=url) as b_rt:
        a, b = a_rt.run(presenter), b_rt.run(presenter)
        await a.send("send", "a long one")
        with anyio.fail_after(10):
            await model.started.wait()
        await b.send("cancel", None)
        assert a.result.key("pending").get() is True  # A has not heard
        a_rt.stop(a)
        assert not [e for _, e in a_rt.errors if isinstance(e, ConflictError)]
        b.result.key("pending").refresh()
        assert b.result.key("pending").get() is False
        cancelled = [blk for m in b.result.key("messages").get() for blk in m["blocks"]]
        assert [blk["kind"] for blk in cancelled] == ["text"]  # one user message, once
