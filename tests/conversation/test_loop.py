"""The evaluation model: queued chains, limits, cancellation, errors, resumption."""

from __future__ import annotations

import itertools

import anyio
import pytest

from runtime import LLM
from runtime.conversation import NotEvaluatedError, StepLimitError
from runtime.llm import (
    TOOL_CANCELLED,
    Fault,
    LLMError,
    Reply,
    Role,
    ScriptedModel,
    ToolResult,
    Usage,
    call,
)

pytestmark = pytest.mark.anyio
LIMIT = 10


class Gate:
    """A tool that holds its call until the test opens the gate."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()
        self.calls = 0

    async def wait(self) -> str:
        """Wait at the gate."""
        self.calls += 1
        self.started.set()
        await self.release.wait()
        return "through"

    def __deepcopy__(self, memo: dict) -> Gate:
        return self  # forks share the gate: the test holds it


def valid(history) -> bool:
    """Every tool call has a result in the message after it, and roles alternate."""
    for a, b in itertools.pairwise(history):
        if a.role is b.role:
            return False
        calls = {c.id for c in a.tool_uses()}
        answered = {x.tool_use_id for x in b.blocks if isinstance(x, ToolResult)}
        if calls - answered:
            return False
    return not history or not history[-1].tool_uses()


async def test_a_chain_runs_in_one_go_on_await() -> None:
    model = ScriptedModel(["one", "two"])
    chain = LLM(model=model).with_prompt("a").loop().with_prompt("b").loop()
    assert not model.requests
    with pytest.raises(NotEvaluatedError, match="await it"):
        _ = chain.last_reply
    with anyio.fail_after(LIMIT):
        done = await chain
    assert done.last_reply == "two" and len(model.requests) == 2
    assert [m.text_content() for m in done.messages] == ["a", "one", "b", "two"]


async def test_loop_at_max_steps_raises_naming_the_limit_with_the_progress() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("wait")])] * 3)
    gate = Gate()
    gate.release.set()
    queued = LLM(model=model).with_tools(gate).with_prompt("go").loop(max_steps=2)
    with anyio.fail_after(LIMIT), pytest.raises(StepLimitError, match="max_steps=2") as caught:
        await queued
    assert caught.value.max_steps == 2 and len(model.requests) == 2
    progress = caught.value.progress
    assert len(progress.messages) == 5 and valid(progress.messages) and progress.has_pending
    assert queued.progress.messages == progress.messages


async def test_a_cancelled_loop_keeps_the_progress_and_a_valid_history() -> None:
    gate = Gate()
    usage = Usage(input_tokens=10, output_tokens=1)
    model = ScriptedModel([Reply(tool_calls=[call("wait")], usage=usage),
                           Reply(tool_calls=[call("wait"), call("wait")], usage=usage),
                           "finished"])
    queued = LLM(model=model).with_tools(gate).with_prompt("go").loop()
    async with anyio.create_task_group() as tg:
        tg.start_soon(queued.sync)
        with anyio.fail_after(LIMIT):
            await gate.started.wait()  # the first call holds at the gate
            first = gate.release
            gate.started, gate.release = anyio.Event(), anyio.Event()
            first.set()  # it goes through; the next call will hold at the new gate
            await gate.started.wait()
        tg.cancel_scope.cancel()  # during the second step's first tool call
    progress = queued.progress
    history = progress.messages
    assert valid(history)
    assert history[2].blocks[0].content == "through"
    assert [b.content for b in history[-1].blocks] == [TOOL_CANCELLED, TOOL_CANCELLED]
    assert progress.token_usage.input_tokens == 20  # both calls that answered count
    assert progress.has_pending
    gate.release.set()
    with anyio.fail_after(LIMIT):
        done = await queued  # awaiting again resumes from the progress
    assert done.last_reply == "finished" and len(model.requests) == 3


async def test_a_model_error_is_the_ports_error_and_keeps_the_progress() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("wait")]),
                           LLMError("overloaded", fault=Fault.TERMINAL, provider="scripted"),
                           "recovered"])
    gate = Gate()
    gate.release.set()
    queued = LLM(model=model).with_tools(gate).with_prompt("go").loop()
    with anyio.fail_after(LIMIT), pytest.raises(LLMError, match="overloaded"):
        await queued
    assert len(queued.progress.messages) == 3 and valid(queued.progress.messages)
    with anyio.fail_after(LIMIT):
        done = await queued  # retried from where it failed
    assert done.last_reply == "recovered" and gate.calls == 1


async def test_last_reply_is_none_without_a_reply_and_nothing_pending_is_a_no_op() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("wait")]), "done"])
    gate = Gate()
    gate.release.set()
    with anyio.fail_after(LIMIT):
        stepped = await LLM(model=model).with_tools(gate).with_prompt("go").step()
        assert stepped.last_reply is None
        done = await stepped.loop()
        again = await done.loop()  # the turn is complete: nothing sent
    assert again.messages == done.messages and len(model.requests) == 2
    with anyio.fail_after(LIMIT), pytest.raises(Exception, match="queue a prompt"):
        await LLM(model=model).loop()


async def test_unanswered_tool_calls_must_be_answered_before_stepping() -> None:
    from runtime.llm import ToolUse

    llm = LLM(model=ScriptedModel()).with_prompt("x").with_response(
        [ToolUse(id="t1", name="f", input={})])
    with anyio.fail_after(LIMIT), pytest.raises(Exception, match=r"with_tool_result"):
        await llm.loop()


async def test_concurrent_awaits_share_one_evaluation() -> None:
    model = ScriptedModel(["once"])
    queued = LLM(model=model).with_prompt("x").loop()
    results = []

    async def wait() -> None:
        results.append(await queued)

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            tg.start_soon(wait)
    assert results[0] is results[1] and len(model.requests) == 1


async def test_values_are_immutable() -> None:
    llm = LLM(model=ScriptedModel())
    with pytest.raises(AttributeError, match="immutable"):
        llm.foo = 1  # type: ignore[attr-defined]
    assert llm.with_prompt("a") is not llm and not llm.messages
    assert [m.role for m in llm.with_prompt("a").with_prompt("b").messages] == [Role.USER]


async def test_a_prompt_queued_after_tool_results_travels_with_them() -> None:
    gate = Gate()
    gate.release.set()
    model = ScriptedModel([Reply(tool_calls=[call("wait")]), "both seen"])
    with anyio.fail_after(LIMIT):
        stepped = await LLM(model=model).with_tools(gate).with_prompt("go").step()
        done = await stepped.with_prompt("and hurry").loop()
    sent = model.requests[1].messages
    assert len(sent) == 3 and valid(sent)
    results, text = sent[2].blocks
    assert results.kind == "tool_result" and text.text == "and hurry"
    assert done.last_reply == "both seen"
