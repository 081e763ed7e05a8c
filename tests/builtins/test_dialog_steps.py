"""Whatever fails inside a step, every call ends with exactly one result, and a step's writes
and its results land together or not at all (defect 2 of issue 14)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime import Runtime, cell, llm_dialog, pattern
from runtime.errors import StoreBusyError
from runtime.llm import Reply, ScriptedModel, call
from runtime.storage.memory import MemoryStore

from .support import assert_valid_history

pytestmark = pytest.mark.anyio

RESULT = {"type": "object", "properties": {"answer": {}}, "required": ["answer"]}


@pattern(name="presenter")
def presenter():
    notes = cell({"text": "hello"}, name="notes")
    messages = cell([], name="messages")
    chat = llm_dialog(messages=messages, result_schema=RESULT, context={"notes": notes})
    return {"messages": messages, "send": chat.add_message, "result": chat.result,
            "pending": chat.pending, "error": chat.error, "notes": notes}


def _notes_path(inst: Any) -> str:
    return inst.result.key("notes").resolve().link()["@link"]


async def test_a_link_in_present_result_beside_a_management_call_leaves_no_call_unanswered():
    async with Runtime() as probe:
        path = _notes_path(probe.run(presenter))
    link = {"@link": path}
    model = ScriptedModel([
        Reply(tool_calls=[call("read", {"path": path}),
                          call("presentResult", {"answer": link})]),
        "Done.",
    ])
    async with Runtime(model=model) as rt:
        inst = rt.run(presenter)
        await inst.send("send", "present the notes")
        await rt.settled()
        messages = assert_valid_history(inst)
        assert [m.role.value for m in messages] == ["user", "assistant", "user", "assistant"]
        assert len(messages[2].blocks) == 2 and not any(b.is_error for b in messages[2].blocks)
        # stored inert: the link the model wrote is kept as its text, never followed
        assert inst.result.key("result").get() == {"answer": json.dumps(link, sort_keys=True)}
        assert inst.result.key("error").get() is None
        assert inst.result.key("pending").get() is False


class FailingStore(MemoryStore):
    """A store whose commits fail while armed, when they write the place ``doomed`` (a
    document id and a path in it: a disk that fills up at the wrong moment)."""

    def __init__(self) -> None:
        super().__init__()
        self.doomed: tuple[str, tuple[Any, ...]] | None = None
        self.failed = 0

    def commit(self, writes):
        if self.doomed is not None and any(self._dooms(w) for w in writes):
            self.failed += 1
            raise StoreBusyError("injected: the disk is full")
        return super().commit(writes)

    def _dooms(self, write: Any) -> bool:
        assert self.doomed is not None
        doc, path = self.doomed
        if write.key.id != doc:
            return False
        if write.patch is None:
            return True
        return any(tuple(p[:len(path)]) == path for p, _ in write.patch)


async def test_results_that_cannot_be_stored_with_their_writes_are_stored_alone_as_errors():
    store = FailingStore()
    async with Runtime(store=store) as rt:
        inst = rt.run(presenter)
        model = rt.model = ScriptedModel([
            Reply(tool_calls=[call("read", {"path": _notes_path(inst)}),
                              call("presentResult", {"answer": 42})]),
            "never asked",
        ])
        where = inst.result.key("result").resolve()

        seen: list[int] = []

        def arm(changes: Any) -> None:  # once the step's call is stored: fail its results
            kinds = [m.get("role") for m in inst.result.key("messages").get()]
            if kinds == ["user", "assistant"] and not seen:
                seen.append(1)
                store.doomed = (where.doc_key.id, where.path)

        rt.on_commit(arm)
        await inst.send("send", "present it")
        await rt.settled()
        assert store.failed >= 1
        messages = assert_valid_history(inst)
        results = messages[2].blocks
        assert len(results) == 2 and all(b.is_error for b in results)
        assert "could not be stored" in results[0].content
        assert inst.result.key("result").get() is None  # nothing of the step's writes
        assert inst.result.key("pending").get() is False
        assert "could not be stored" in inst.result.key("error").get()
        assert len(model.requests) == 1  # the turn ended: no model call after it


async def test_a_value_too_deep_to_store_ends_the_turn_with_a_valid_history():
    deep: Any = "bottom"
    for _ in range(150):
        deep = {"d": deep}
    model = ScriptedModel([Reply(tool_calls=[call("presentResult", {"answer": deep})]), "x"])
    async with Runtime(model=model) as rt:
        inst = rt.run(presenter)
        await inst.send("send", "go deep")
        await rt.settled()
        messages = assert_valid_history(inst)
        assert messages[0].text_content() == "go deep"
        assert inst.result.key("pending").get() is False
        assert inst.result.key("error").get()
        assert inst.result.key("result").get() is None
