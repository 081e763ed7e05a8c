"""``LLM.with_tool_choice``: a forcing choice goes with each model call that answers a
prompt, and a call sending tool results is auto (a loop's later calls, a second step(), a
loop resumed); a name is checked against the tools at the step; a portable id keeps it."""

from __future__ import annotations

import pytest

from runtime.conversation import LLM, ConversationError
from runtime.llm import Fault, LLMError, Reply, ScriptedModel, ToolChoice, call

from .fixtures import Notebook

pytestmark = pytest.mark.anyio


async def test_a_call_answering_a_prompt_is_forced_one_sending_results_is_not() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("add", {"line": "milk"})]), "Noted.",
                           Reply(tool_calls=[call("count")]), "Noted again."])
    base = LLM(model=model).with_tools(Notebook()).with_tool_choice("add")
    assert base.tool_choice == ToolChoice.tool("add")
    done = await base.with_prompt("Note milk.").loop()
    done = await done.with_tool_choice("required").with_prompt("How many?").step()
    assert done.has_pending  # one step: the call's result waits for the next
    done = await done.step()
    assert [r.tool_choice for r in model.requests] == [
        ToolChoice.tool("add"), ToolChoice(), ToolChoice(mode="required"), ToolChoice()]
    assert done.last_reply == "Noted again."


async def test_a_loop_resumed_after_a_failure_does_not_force_again() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("add", {"line": "milk"})]),
                           LLMError("overloaded", fault=Fault.TERMINAL, provider="scripted"),
                           "Noted."])
    queued = LLM(model=model).with_tools(Notebook()).with_tool_choice("required") \
        .with_prompt("Note milk.").loop()
    with pytest.raises(LLMError):
        await queued
    done = await queued  # resumes from the progress, sending the call's result
    assert done.last_reply == "Noted."
    assert [r.tool_choice.mode for r in model.requests] == ["required", "auto", "auto"]


async def test_a_bad_choice_is_a_conversation_error_naming_the_tools() -> None:
    with pytest.raises(ConversationError, match="lone UTF-16 surrogate"):
        LLM(model=ScriptedModel()).with_tool_choice("a\ud800")
    with pytest.raises(ConversationError, match="past the 256"):
        LLM(model=ScriptedModel()).with_tool_choice("x" * 10_000)
    model = ScriptedModel(["never"])
    chat = LLM(model=model).with_tools(Notebook()).with_tool_choice("remove")
    with pytest.raises(ConversationError) as info:
        await chat.with_prompt("Go.").loop()
    assert "with_tool_choice: tool_choice names the tool 'remove', which is not one of the " \
           "request's tools ('add', 'count')" in str(info.value)
    with pytest.raises(ConversationError, match="offers no tools"):
        await LLM(model=model).with_tool_choice("required").with_prompt("Go.").loop()
    assert model.requests == []  # nothing was sent


def test_a_portable_id_keeps_the_choice_and_an_old_one_reads_as_auto() -> None:
    chat = LLM(model="claude-sonnet-4-5").with_tools(Notebook()).with_tool_choice("count")
    assert LLM.restore(chat.portable_id).tool_choice == ToolChoice.tool("count")
    plain = LLM(model="claude-sonnet-4-5")
    assert LLM.restore(plain.portable_id).tool_choice == ToolChoice()
    assert plain.portable_id == LLM.restore(plain.portable_id).portable_id
