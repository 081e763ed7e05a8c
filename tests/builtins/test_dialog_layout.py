"""The dialog's stored layout: what its turns write is one record (the turn protocol's fields
with the dialog's usage, stop reason, result and handler answers); what users' events write
at any time (``dropped``, ``pins``) stays apart. A dialog stored when each field was a
document of its own is read into the record the first time it runs again."""

from __future__ import annotations

from typing import Any

import pytest

from runtime import Runtime, cell, llm_dialog, pattern
from runtime.cells import BuiltinNode
from runtime.cells.ids import derive
from runtime.llm import Reply, ScriptedModel, Usage
from runtime.storage import DocKey, SQLiteStore, Write

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


async def test_the_turns_write_one_record_and_users_events_their_own_documents(spy):
    async with Runtime(model=ScriptedModel(["hello"])) as rt:
        inst = rt.run(agent, session="s")
        where = {name: inst.result.key(name).resolve().doc_key
                 for name in ("pending", "error", "usage", "stop_reason", "result")}
        assert len(set(where.values())) == 1  # one record
        apart = {inst.result.key(n).resolve().doc_key for n in ("dropped", "pins")}
        assert len(apart) == 2 and not apart & set(where.values())
        commits: list[set[str]] = []
        rt.on_commit(lambda changes: commits.append({c.id for c in changes}))
        await inst.send("send", "hi")
        await rt.settled()
        record = where["pending"].id
        # the turn's start and its end: each one commit, the record once in each
        assert [record in c for c in commits] == [True, True]
        assert inst.result.key("stop_reason").get() == "end_turn"


async def test_a_dialog_stored_by_the_earlier_layout_keeps_its_state_and_recovers(spy,
                                                                               tmp_path):
    # where the earlier layout kept each field: a document per name, from the node's cause
    async with Runtime() as rt:
        rt.run(agent, session="s")
    [node] = spy
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
