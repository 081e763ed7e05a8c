"""``llm_dialog(tool_choice=...)``: passed to the first model call of every turn (the port's
step engine relaxes it to auto after), checked against the tools the dialog advertises;
and a handled turn failure logs one WARNING line, its traceback only at DEBUG."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest
from pydantic import BaseModel

from runtime import PatternError, Runtime, cell, handler, llm_dialog, pattern
from runtime.builtins.generate import generate_text
from runtime.llm import Reply, ScriptedModel, ToolChoice, call

pytestmark = pytest.mark.anyio

_NAMES = itertools.count()
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


class AddItem(BaseModel):
    title: str


@handler
def add_item(event: AddItem, items):
    items.push(event.title)


def agent(choice: Any, *, builtin_tools: bool = True, tools: bool = True,
          result_schema: dict[str, Any] | None = None) -> Any:
    @pattern(name=f"choosy-{next(_NAMES)}")  # one per call: the choice is not in the name
    def choosy():
        items = cell([], name="items")
        messages = cell([], name="messages")
        offered = {"addItem": {"description": "Add an item", "handler": add_item(items=items)}}
        chat = llm_dialog(messages, tools=offered if tools else None, tool_choice=choice,
                          builtin_tools=builtin_tools, result_schema=result_schema)
        return {"items": items, "send": chat.add_message, "error": chat.error,
                "result": chat.result}

    return choosy


async def test_the_first_call_of_every_turn_is_forced_and_the_rest_are_auto() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("addItem", {"title": "milk"})]), "Added.",
                           Reply(tool_calls=[call("addItem", {"title": "eggs"})]), "Added."])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent("addItem"))
        for text in ("milk", "eggs"):
            await inst.send("send", text)
            await rt.settled()
        assert inst.result.key("items").get() == ["milk", "eggs"]
        assert inst.result.key("error").get() is None
    assert [r.tool_choice for r in model.requests] == [
        ToolChoice.tool("addItem"), ToolChoice(), ToolChoice.tool("addItem"), ToolChoice()]


async def test_required_and_none_reach_the_model_and_the_default_is_auto() -> None:
    for choice, script in (("required", [Reply(tool_calls=[call("read", {"path": "/x"})]),
                                         "Read."]),
                           ("none", ["No tools."]), ("auto", ["As I like."])):
        model = ScriptedModel(script)
        async with Runtime(model=model) as rt:
            inst = rt.run(agent(choice))
            await inst.send("send", "go")
            await rt.settled()
        # required: a management tool (advertised too) keeps to it as well as addItem
        assert model.requests[0].tool_choice == ToolChoice.model_validate(choice)
        model.assert_complete()


async def test_presenting_the_result_can_be_forced() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("presentResult", {"name": "Ada"})]),
                           "Done."])
    async with Runtime(model=model) as rt:
        inst = rt.run(agent("presentResult", builtin_tools=False, tools=False,
                            result_schema=PERSON))
        await inst.send("send", "Ada Lovelace wrote the first program.")
        await rt.settled()
        assert inst.result.key("result").get() == {"name": "Ada"}
    assert [r.tool_choice.mode for r in model.requests] == ["tool", "auto"]


@pytest.mark.parametrize(("make", "words"), [
    (lambda: agent("addItme"), "tool_choice names the tool 'addItme', which is not one of "
                               "the request's tools ('addItem', 'read'"),
    (lambda: agent("read", builtin_tools=False), "the management tools are advertised only "
                                                 "with builtin_tools on"),
    (lambda: agent("presentResult"), "presentResult is advertised only with result_schema"),
    (lambda: agent("required", builtin_tools=False, tools=False), "offers no tools"),
    (lambda: agent("x" * 100_000), "100,000 characters, past the 256"),
    (lambda: agent("add\ud800Item"), "lone UTF-16 surrogate"),
])
async def test_a_choice_the_dialog_cannot_honour_fails_when_the_pattern_runs(
        make: Any, words: str) -> None:
    async with Runtime(model=ScriptedModel()) as rt:
        with pytest.raises(PatternError) as info:
            rt.run(make())
    assert str(info.value).startswith("llm_dialog(tool_choice=...): ")
    assert words in str(info.value) and len(str(info.value)) < 2_000


@pattern(name="no-model-writer")
def writer():
    gen = generate_text("Capital of France?")
    return {"error": gen.error}


@pytest.mark.parametrize(("dialog", "logger", "what"), [
    (True, "celldialog.dialog", "the turn failed"),
    (False, "celldialog.generate", "the generation failed"),
])
async def test_a_handled_failure_is_one_warning_line_and_its_traceback_is_debug(
        caplog: pytest.LogCaptureFixture, dialog: bool, logger: str, what: str) -> None:
    caplog.set_level(logging.DEBUG, logger=logger)
    async with Runtime() as rt:  # no model anywhere: the turn fails, as designed
        inst = rt.run(agent("auto") if dialog else writer)
        if dialog:
            await inst.send("send", "hi")
        await rt.settled()
        assert "Runtime(model=...)" in inst.result.key("error").get()
    records = [r for r in caplog.records if r.name == logger and what in r.getMessage()]
    warning = [r for r in records if r.levelno == logging.WARNING]
    debug = [r for r in records if r.levelno == logging.DEBUG]
    assert len(warning) == 1 and len(debug) == 1
    line = warning[0].getMessage()
    assert warning[0].exc_info is None and "\n" not in line
    assert f"{what}: PatternError: " in line and "has no model" in line
    assert debug[0].exc_info is not None and debug[0].exc_info[0].__name__ == "PatternError"
